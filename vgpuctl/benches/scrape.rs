//! What a scrape of a node with 100 containers costs: every region read
//! and the exposition encoded (in this process), then `GET /metrics` of a
//! running `vgpuctl serve` over HTTP. Prints figures; asserts nothing
//! about time (docs/benchmarks.md records them).
//!
//!     cargo bench -p vgpuctl --bench scrape

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Instant;

use vgpu_shm::{CorePolicy, DeviceInfo, Kind, Limits, OpenMode, ProcId, Region, SlotIndex};
use vgpuctl::serve::{Targets, host::Host, metrics::Options, scrape};

const CONTAINERS: usize = 100;
const ROUNDS: usize = 50;

/// 100 containers of two processes each (one alive: this one; one whose
/// pid was reused: dead), one device, limits and usage set.
fn node(root: &std::path::Path) {
    let me = ProcId::current();
    let gone = ProcId {
        start_time: me.start_time + 1,
        ..me
    };
    for i in 0..CONTAINERS {
        let dir = root.join(format!(
            "containers/{i:08x}-0000-4000-8000-000000000000_worker"
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let r = Region::open(&dir.join("usage.cache"), OpenMode::CreateIfMissing).unwrap();
        let info = DeviceInfo {
            uuid: [i as u8; 16],
            total_mem: 80 << 30,
            sm_count: 132,
        };
        let limits = Limits {
            mem: 4 << 30,
            sm: 30,
            policy: CorePolicy::Default,
        };
        let dev = r.register_device(&info, limits).unwrap().index;
        for (s, who) in [me, gone].iter().enumerate() {
            let slot = SlotIndex::new(s).unwrap();
            r.claim_slot_at(slot, who, Some(who.pid));
            r.add_usage(slot, dev, Kind::Buffer, 1 << 30);
            r.add_usage(slot, dev, Kind::Context, 500 << 20);
        }
    }
}

fn report(what: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q) as usize];
    println!(
        "{what}: {CONTAINERS} containers, {} rounds: min {:.2} ms, median {:.2} ms, p90 {:.2} ms, max {:.2} ms",
        ms.len(),
        at(0.0),
        at(0.5),
        at(0.9),
        at(1.0)
    );
}

fn main() {
    let root = tempfile::tempdir().unwrap();
    node(root.path());
    let targets = Targets::new(vec![root.path().join("containers")], Vec::new());
    let opts = Options {
        zone: "vGPU".into(),
        node: "node-1".into(),
        hami: true,
        legacy: false,
    };
    let host = Host::none();
    let mut warned = HashSet::new();
    let first = scrape(&targets.current(), None, &host, &opts, &mut warned);
    assert_eq!(
        first.matches("hami_vgpu_memory_limit_bytes{").count(),
        CONTAINERS
    );
    let ms: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            let text = scrape(&targets.current(), None, &host, &opts, &mut warned);
            std::hint::black_box(text);
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    report(
        &format!("read + encode in process ({} bytes)", first.len()),
        ms,
    );

    let mut serve = Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--nvml",
            "/nonexistent/libnvidia-ml.so.1",
        ])
        .arg("--root")
        .arg(root.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(serve.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap()
        .to_string();
    let get = || {
        let mut c = TcpStream::connect(&addr).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut body = Vec::new();
        c.read_to_end(&mut body).unwrap();
        assert!(body.starts_with(b"HTTP/1.1 200"));
        body.len()
    };
    get();
    let ms: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(get());
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    report("GET /metrics over HTTP", ms);
    let _ = serve.kill();
    let _ = serve.wait();
}

//! `vgpuctl serve` scraped over HTTP by a real client while containers run
//! on the simulated GPU: HAMi's metric names, labels and values, vgpu's own
//! families, the host families from (simulated) NVML, and a HAMi-core file.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::*;

/// One sample of an exposition.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed exposition.
struct Scrape {
    content_type: String,
    samples: Vec<Sample>,
    text: String,
}

impl Scrape {
    /// The value of the one series of `name` whose labels include `with`.
    fn value(&self, name: &str, with: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                with.iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        assert!(found.len() <= 1, "{name} {with:?} matches {found:?}");
        found.first().map(|s| s.value)
    }

    fn get(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.value(name, with)
            .unwrap_or_else(|| panic!("no {name} {with:?} in\n{}", self.text))
    }
}

/// Parses the text format: `name{k="v",...} value` lines.
fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("name and value");
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}').expect("closing brace")),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once("=\"").expect("k=\"v\"");
                    (k.to_string(), v.trim_end_matches('"').to_string())
                })
                .collect();
            Sample {
                name: name.to_string(),
                labels,
                value: value.parse().unwrap_or_else(|_| panic!("value in {l}")),
            }
        })
        .collect()
}

/// A running `vgpuctl serve`, stopped when dropped.
struct Exporter {
    child: Child,
    url: String,
}

impl Exporter {
    /// Serves `root`'s containers on a free port, with the simulated NVML
    /// of `sim` for the host families.
    fn start(sim: &Sim, root: &Path, extra: &[&str]) -> Exporter {
        Exporter::start_with(sim.cmd(&artifacts().vgpuctl, false), root, extra)
    }

    /// The same with a command of the caller's (its environment).
    fn start_with(mut cmd: Command, root: &Path, extra: &[&str]) -> Exporter {
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--rescan",
            "0.2",
            "--root",
        ])
        .arg(root)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn vgpuctl serve");
        let url = common::served_url(&mut child);
        Exporter { child, url }
    }

    fn scrape(&self) -> Scrape {
        let mut resp = ureq::get(&self.url).call().expect("GET /metrics");
        assert_eq!(resp.status(), 200);
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let text = resp.body_mut().read_to_string().unwrap();
        assert!(text.ends_with("# EOF\n"), "{text}");
        Scrape {
            content_type,
            samples: parse(&text),
            text,
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `{root}/containers/{uid}_{name}/usage.cache`, its directory made.
fn container_region(root: &Path, uid: &str, name: &str) -> PathBuf {
    let dir = root.join("containers").join(format!("{uid}_{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("usage.cache")
}

/// A process of a container: its region and its limits.
fn in_container(sim: &Sim, region: &Path, limit: &str, sm: &str, args: &[&str]) -> Child {
    sim.client_cmd(Path3::Dlsym, true, args)
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region)
        .env("CUDA_DEVICE_MEMORY_LIMIT", limit)
        .env("CUDA_DEVICE_SM_LIMIT", sm)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for a `hold` process to report its allocation.
fn held(p: &mut Child) {
    let mut out = BufReader::new(p.stdout.as_mut().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "hold_rc=0");
}

fn labels<'a>(uid: &'a str, name: &'a str, uuid: &'a str) -> [(&'a str, &'a str); 6] {
    [
        ("zone", "vGPU"),
        ("namespace", ""),
        ("pod", uid),
        ("container", name),
        ("vdevice_index", "0"),
        ("device_uuid", uuid),
    ]
}

#[test]
fn two_containers_are_exported_with_hami_names_and_vgpu_figures() {
    let _serial = serial();
    let sim = Sim::new(1, "8g");
    let root = sim.dir.path().join("vgpu");
    let (ra, rb) = (
        container_region(&root, "pod-a-uid", "trainer"),
        container_region(&root, "pod-b-uid", "server"),
    );
    let mut a = in_container(
        &sim,
        &ra,
        "2g",
        "30",
        &["hold", &(512 * MIB).to_string(), "60"],
    );
    let mut b = in_container(
        &sim,
        &rb,
        "1g",
        "0",
        &["hold", &(256 * MIB).to_string(), "60"],
    );
    held(&mut a);
    held(&mut b);
    // A third process of container b asks more than its limit: one denial.
    let refused = in_container(&sim, &rb, "1g", "0", &["alloc", "buffer", &GIB.to_string()]);
    let refused = finish(refused).ok();
    assert_eq!(refused.i64("alloc_rc"), 2, "{}", refused.stderr);

    let exporter = Exporter::start(&sim, &root, &["--legacy-metrics", "--node", "node-7"]);
    let s = exporter.scrape();
    assert!(
        s.content_type.starts_with("application/openmetrics-text"),
        "{}",
        s.content_type
    );
    let (sa, sb) = (sim.status(&ra), sim.status(&rb));
    let uuid = sa["devices"][0]["uuid"].as_str().unwrap().to_string();
    let (la, lb) = (
        labels("pod-a-uid", "trainer", &uuid),
        labels("pod-b-uid", "server", &uuid),
    );

    // HAMi's families: the limit, the usage as the region counts it, its
    // parts, and the same usage again as the container's device memory.
    assert_eq!(s.get("hami_vgpu_memory_limit_bytes", &la), (2 * GIB) as f64);
    assert_eq!(s.get("hami_vgpu_memory_limit_bytes", &lb), GIB as f64);
    for (l, st, bytes) in [(&la, &sa, 512 * MIB), (&lb, &sb, 256 * MIB)] {
        let used = st["devices"][0]["used_bytes"].as_u64().unwrap() as f64;
        assert_eq!(s.get("hami_vgpu_memory_used_bytes", l), used);
        assert_eq!(s.get("hami_container_device_memory_bytes", l), used);
        assert_eq!(s.get("hami_vgpu_memory_buffer_bytes", l), bytes as f64);
        // The simulator's context costs 256 MiB, and vgpu's estimate says so.
        assert_eq!(
            s.get("hami_vgpu_memory_context_bytes", l),
            (256 * MIB) as f64
        );
        assert_eq!(s.get("hami_vgpu_memory_module_bytes", l), 0.0);
        assert_eq!(used, (bytes + 256 * MIB) as f64);
        assert_eq!(s.get("hami_container_device_utilization_ratio", l), 0.0);
        assert_eq!(s.get("vgpu_container_processes", &l[..4]), 1.0);
    }
    // What only vgpu knows.
    assert_eq!(s.get("vgpu_container_oom_denials_total", &la), 0.0);
    assert_eq!(s.get("vgpu_container_oom_denials_total", &lb), 1.0);
    assert_eq!(s.get("vgpu_container_sm_limit_ratio", &la), 0.3);
    assert_eq!(s.get("vgpu_container_sm_limit_ratio", &lb), 0.0);
    assert_eq!(s.get("vgpu_container_bucket_scale", &la), 1.0);
    assert_eq!(
        s.get("vgpu_container_context_estimate_bytes", &la),
        (256 * MIB) as f64
    );
    let pid_a = a.id().to_string();
    let pa = [&la[..], &[("pid", pid_a.as_str())]].concat();
    assert_eq!(s.get("vgpu_process_context_bytes", &pa), (256 * MIB) as f64);
    assert_eq!(
        s.get("vgpu_process_memory_used_bytes", &pa),
        (768 * MIB) as f64
    );
    assert_eq!(s.get("vgpu_exporter_regions", &[]), 2.0);
    assert_eq!(s.get("vgpu_exporter_unreadable_regions", &[]), 0.0);
    // The host family, from the simulated NVML: both containers' memory.
    let (_, physical) = sim.physical(0);
    // HAMi's host families carry `node` where HAMi 2.10's monitor puts it.
    let host = [
        ("node", "node-7"),
        ("device_index", "0"),
        ("device_uuid", uuid.as_str()),
    ];
    assert_eq!(
        s.get("hami_host_gpu_memory_used_bytes", &host),
        physical as f64
    );
    assert!(s.value("hami_host_gpu_utilization_ratio", &host).is_some());
    // HAMi's build information, as its monitor exports it (no zone).
    let build = s
        .samples
        .iter()
        .find(|x| x.name == "hami_build_info")
        .unwrap_or_else(|| panic!("no hami_build_info in\n{}", s.text));
    assert_eq!(build.value, 1.0);
    assert_eq!(build.labels["version"], env!("CARGO_PKG_VERSION"));
    assert!(!build.labels.contains_key("zone"), "{build:?}");
    assert_eq!(physical, (512 + 256 + 2 * 256) * MIB);
    assert!(
        s.samples
            .iter()
            .any(|x| x.name == "hami_host_gpu_memory_used_bytes"
                && x.labels["device_type"].starts_with("NVIDIA-")),
        "{}",
        s.text
    );
    // HAMi's names before 2.6, with their labels.
    let old = [
        ("podnamespace", ""),
        ("podname", "pod-a-uid"),
        ("ctrname", "trainer"),
        ("vdeviceid", "0"),
        ("deviceuuid", uuid.as_str()),
    ];
    assert_eq!(
        s.get("vGPU_device_memory_limit_in_bytes", &old),
        (2 * GIB) as f64
    );
    assert_eq!(
        s.get("vGPU_device_memory_usage_in_bytes", &old),
        (768 * MIB) as f64
    );
    // Its memory's parts as labels, as HAMi's monitor writes them; no
    // families HAMi never had.
    let (ctx, data) = ((256 * MIB).to_string(), (512 * MIB).to_string());
    let parts = [
        &old[..],
        &[
            ("context", ctx.as_str()),
            ("module", "0"),
            ("data", data.as_str()),
            ("offset", "0"),
        ],
    ]
    .concat();
    assert_eq!(
        s.get("Device_memory_desc_of_container", &parts),
        (768 * MIB) as f64
    );
    assert!(!s.text.contains("vGPU_device_memory_context_size_bytes"));
    assert_eq!(
        s.get(
            "HostGPUMemoryUsage",
            &[("nodeid", "node-7"), ("deviceidx", "0")]
        ),
        physical as f64
    );

    // Killed: its memory leaves the usage at once; the quota counts its
    // slot until a reclaim, which the exporter then counts.
    a.kill().unwrap();
    a.wait().unwrap();
    let s = exporter.scrape();
    assert_eq!(s.get("hami_vgpu_memory_used_bytes", &la), 0.0);
    assert_eq!(s.get("vgpu_container_processes", &la[..4]), 0.0);
    assert_eq!(
        s.get("vgpu_container_memory_counted_bytes", &la),
        (768 * MIB) as f64
    );
    assert_eq!(s.get("vgpu_container_slots_reclaimed_total", &la[..4]), 0.0);
    sim.ctl(&["reclaim", ra.to_str().unwrap()]).ok();
    let s = exporter.scrape();
    assert_eq!(s.get("vgpu_container_memory_counted_bytes", &la), 0.0);
    assert_eq!(s.get("vgpu_container_slots_reclaimed_total", &la[..4]), 1.0);

    // A container that starts later is found by the next scan.
    let rc = container_region(&root, "pod-c-uid", "late");
    let mut c = in_container(&sim, &rc, "1g", "0", &["hold", &MIB.to_string(), "60"]);
    held(&mut c);
    let lc = labels("pod-c-uid", "late", &uuid);
    assert!(
        wait_until(5.0, || exporter
            .scrape()
            .value("hami_vgpu_memory_limit_bytes", &lc)
            == Some(GIB as f64)),
        "{}",
        exporter.scrape().text
    );
    for mut p in [b, c] {
        let _ = p.kill();
        let _ = p.wait();
    }
}

#[test]
fn throttled_launches_and_their_wait_are_exported() {
    let _serial = serial();
    let sim = Sim::new(1, "8g");
    let root = sim.dir.path().join("vgpu");
    let region = container_region(&root, "pod-uid", "spinner");
    let spin = in_container(
        &sim,
        &region,
        "0",
        "30",
        &["spin", "1000000", "132", "2", "kernel"],
    );
    let run = finish(spin).ok();
    let exporter = Exporter::start(&sim, &root, &[]);
    let s = exporter.scrape();
    let st = sim.status(&region);
    let uuid = st["devices"][0]["uuid"].as_str().unwrap();
    let l = labels("pod-uid", "spinner", uuid);
    let throttled = s.get("vgpu_container_launches_throttled_total", &l);
    let waited = s.get("vgpu_container_throttled_seconds_total", &l);
    assert!(
        throttled >= 10.0,
        "{throttled} throttled launches: {}",
        run.stdout
    );
    // 2 s at 30 %: most of the run is spent waiting, summed over the
    // launches that waited.
    assert!(waited >= 0.5, "waited {waited} s");
    assert_eq!(
        throttled,
        st["devices"][0]["launches_throttled"].as_f64().unwrap()
    );
    assert_eq!(
        waited,
        st["devices"][0]["throttled_seconds"].as_f64().unwrap()
    );
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[test]
fn a_hami_core_file_is_exported_and_nothing_is_ever_written() {
    let sim = Sim::new(1, "8g");
    let root = sim.dir.path().join("vgpu");
    let hami = container_region(&root, "hami-uid", "old");
    let bytes = write_hami_core_file(&hami, unix_now() - 7);
    // A file that is no region at all is counted, and does not stop the rest.
    let junk = container_region(&root, "junk-uid", "junk");
    std::fs::write(&junk, b"not a region").unwrap();
    let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    let (t_hami, t_junk) = (mtime(&hami), mtime(&junk));

    let exporter = Exporter::start(&sim, &root, &[]);
    let s = exporter.scrape();
    let l = labels(
        "hami-uid",
        "old",
        "GPU-11111111-2222-3333-4444-555555555555",
    );
    assert_eq!(s.get("hami_vgpu_memory_limit_bytes", &l), (3 * GIB) as f64);
    assert_eq!(
        s.get("hami_vgpu_memory_used_bytes", &l),
        (1500 * MIB) as f64
    );
    assert_eq!(
        s.get("hami_vgpu_memory_context_bytes", &l),
        (600 * MIB) as f64
    );
    assert_eq!(
        s.get("hami_vgpu_memory_buffer_bytes", &l),
        (900 * MIB) as f64
    );
    assert_eq!(s.get("hami_container_device_utilization_ratio", &l), 35.0);
    let since = s.get("hami_container_last_kernel_elapsed_seconds", &l);
    assert!((7.0..=10.0).contains(&since), "{since}");
    assert_eq!(s.get("vgpu_container_sm_limit_ratio", &l), 0.4);
    assert_eq!(s.value("vgpu_container_oom_denials_total", &l), None);
    assert_eq!(s.get("vgpu_exporter_regions", &[]), 1.0);
    assert_eq!(s.get("vgpu_exporter_unreadable_regions", &[]), 1.0);
    for _ in 0..3 {
        exporter.scrape();
    }
    drop(exporter);
    assert_eq!(std::fs::read(&hami).unwrap(), bytes);
    assert_eq!(std::fs::read(&junk).unwrap(), b"not a region");
    assert_eq!((mtime(&hami), mtime(&junk)), (t_hami, t_junk));
}

#[test]
fn a_port_in_use_is_a_clear_error() {
    let sim = Sim::new(1, "8g");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(&artifacts().vgpuctl)
        .args(["serve", "--listen", &addr, "--root"])
        .arg(sim.dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
}

fn per_sec(r: &Run) -> Vec<f64> {
    r.get("per_sec")
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect()
}

#[test]
fn feedback_blocks_a_normal_container_while_a_high_priority_one_runs() {
    let _serial = serial();
    let sim = Sim::new(1, "8g");
    let root = sim.dir.path().join("vgpu");
    let (high, normal) = (
        container_region(&root, "pod-h-uid", "high"),
        container_region(&root, "pod-n-uid", "normal"),
    );
    let exporter = Exporter::start(&sim, &root, &["--feedback", "--feedback-interval", "0.5"]);
    let spin = |region: &Path, priority: &str, secs: &str| {
        sim.client_cmd(
            Path3::ProcAddr,
            true,
            &["spin", "1000000", "132", secs, "kernel"],
        )
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region)
        .env("CUDA_TASK_PRIORITY", priority)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    };
    let hami = |region: &Path, field: &str| {
        sim.try_status(region)
            .and_then(|s| s["hami"][field].as_i64())
    };
    // (The normal one runs 20 s, and the high one comes once it
    // launches: a loaded host takes seconds to start either.)
    let n = spin(&normal, "1", "20");
    assert!(
        wait_until(30.0, || hami(&normal, "recent_kernel")
            .is_some_and(|k| k > 0)),
        "the normal one never launched: {}",
        sim.status(&normal)
    );
    std::thread::sleep(std::time::Duration::from_secs(1));
    let h = spin(&high, "0", "5");
    // Within a few rounds of the high-priority container's first launches
    // the normal one is blocked; the high one, alone on the GPU, has its
    // switch off, the blocked one on.
    assert!(
        wait_until(30.0, || hami(&normal, "recent_kernel") == Some(-1)),
        "never blocked: {}",
        sim.status(&normal)
    );
    assert!(wait_until(3.0, || hami(&high, "utilization_switch") == Some(0)));
    assert_eq!(hami(&normal, "utilization_switch"), Some(1));
    // The exporter shows the block (issue 26: a block must be visible).
    let blocked =
        |s: &Scrape, who: &str| s.value("vgpu_container_launches_blocked", &[("container", who)]);
    let seen = scrape_until(&exporter, 5.0, |s| blocked(s, "normal") == Some(1.0));
    assert_eq!(blocked(&seen, "normal"), Some(1.0));
    assert_eq!(blocked(&seen, "high"), Some(0.0));
    let h = finish(h).ok();
    // Lifted once the high one has been idle for a round or two.
    assert!(
        wait_until(5.0, || hami(&normal, "recent_kernel")
            .is_some_and(|k| k >= 0)),
        "never lifted: {}",
        sim.status(&normal)
    );
    let seen = scrape_until(&exporter, 5.0, |s| blocked(s, "normal") == Some(0.0));
    assert_eq!(blocked(&seen, "normal"), Some(0.0));
    let n = finish(n).ok();
    let (rh, rn) = (per_sec(&h), per_sec(&n));
    assert!(rh.iter().all(|&v| v > 0.0), "high priority: {rh:?}");
    let first = rn.iter().position(|&v| v > 0.0).unwrap();
    let last = rn.iter().rposition(|&v| v > 0.0).unwrap();
    let idle = rn[first..=last].iter().filter(|&&v| v == 0.0).count();
    assert!(
        idle >= 2 && last + 3 >= rn.len(),
        "normal priority per second: {rn:?}"
    );
}

#[test]
fn without_nvml_the_host_families_are_absent_and_said_once() {
    let sim = Sim::new(1, "8g");
    let root = sim.dir.path().join("vgpu");
    let hami = container_region(&root, "hami-uid", "old");
    write_hami_core_file(&hami, 0);
    let mut e = Exporter::start(&sim, &root, &["--nvml", "/nonexistent/libnvidia-ml.so.1"]);
    let s = e.scrape();
    assert!(
        !s.text.contains("hami_host_gpu"),
        "host families without NVML:\n{}",
        s.text
    );
    assert_eq!(
        s.value("hami_vgpu_memory_limit_bytes", &[("container", "old")]),
        Some((3 * GIB) as f64)
    );
    // No last kernel recorded: no elapsed-time series.
    assert_eq!(
        s.value(
            "hami_container_last_kernel_elapsed_seconds",
            &[("container", "old")]
        ),
        None
    );
    let _ = e.child.kill();
    let out = std::mem::replace(&mut e.child, Command::new("true").spawn().unwrap())
        .wait_with_output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("NVML (/nonexistent/libnvidia-ml.so.1) unavailable")
            .count(),
        1,
        "{err}"
    );
}

/// A stand-in for the Kubernetes API server: answers every GET with
/// `body` and keeps each request's head.
fn fake_api_server(body: &'static str) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            log.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&head).into_owned());
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, seen)
}

#[test]
fn pods_are_named_from_the_api_servers_pod_list() {
    let _serial = serial();
    let sim = Sim::new(1, "8g");
    let root = sim.dir.path().join("vgpu");
    let (ra, rb) = (
        container_region(&root, "pod-a-uid", "trainer"),
        container_region(&root, "pod-b-uid", "server"),
    );
    let mut a = in_container(&sim, &ra, "2g", "0", &["hold", &MIB.to_string(), "60"]);
    let mut b = in_container(&sim, &rb, "1g", "0", &["hold", &MIB.to_string(), "60"]);
    held(&mut a);
    held(&mut b);
    let (api, seen) = fake_api_server(
        r#"{"kind":"PodList","items":[{"metadata":{"uid":"pod-a-uid","namespace":"ml","name":"trainer-0"}}]}"#,
    );
    let mut cmd = sim.cmd(&artifacts().vgpuctl, false);
    cmd.env("NODE_NAME", "node-1");
    let exporter = Exporter::start_with(cmd, &root, &["--api-server", &api]);
    let s = exporter.scrape();
    let uuid = sim.status(&ra)["devices"][0]["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    let mut la = labels("trainer-0", "trainer", &uuid);
    la[1] = ("namespace", "ml");
    assert!(
        s.value("hami_vgpu_memory_limit_bytes", &la).is_some(),
        "{}",
        s.text
    );
    // A pod the list does not hold keeps its UID and an empty namespace.
    let lb = labels("pod-b-uid", "server", &uuid);
    assert!(
        s.value("hami_vgpu_memory_limit_bytes", &lb).is_some(),
        "{}",
        s.text
    );
    let requests = seen.lock().unwrap().clone();
    let first = requests.first().expect("the pod list was asked for");
    assert!(
        first.starts_with("GET /api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1 "),
        "{first}"
    );
    assert!(!first.to_lowercase().contains("authorization"), "{first}");
    drop(exporter);
    for p in [a, b] {
        let mut p = p;
        let _ = p.kill();
        let _ = p.wait();
    }
}

/// The scrape once `cond` holds of it (up to `secs`).
fn scrape_until(e: &Exporter, secs: f64, cond: impl Fn(&Scrape) -> bool) -> Scrape {
    let mut last = e.scrape();
    assert!(
        wait_until(secs, || {
            last = e.scrape();
            cond(&last)
        }),
        "never so:\n{}",
        last.text
    );
    last
}

#[test]
fn the_oversubscription_board_is_exported_per_process_and_without_one_nothing_is() {
    let _serial = serial();
    let mut sim = Sim::new(1, "4g");
    let board = sim.dir.path().join("board").display().to_string();
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "3g")
        .set("CUDA_OVERSUBSCRIBE", "true")
        .set("VGPU_OVERSUBSCRIBE_DIR", &board)
        .set("VGPU_OVERSUBSCRIBE_IDLE_MS", "300")
        // The checkpoint API, as the oversubscription tests' nodes: on
        // auto, a first suspension by VMM copies pins the simulated arena
        // first (seconds), past what the scrapes below wait for.
        .set("VGPU_OVERSUBSCRIBE_VMM", "false");
    let root = sim.dir.path().join("vgpu");
    let spawn = |name: &str, env: &[(&str, &str)], args: &[&str]| {
        let mut c = sim.client_cmd(Path3::Link, true, args);
        c.env(
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            sim.dir.path().join(format!("{name}.cache")),
        );
        for (k, v) in env {
            c.env(k, v);
        }
        c.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Its board directory comes from $VGPU_OVERSUBSCRIBE_DIR; a second
    // exporter is pointed at a directory without a board.
    let exporter = Exporter::start(&sim, &root, &[]);
    let empty = sim.dir.path().join("no-board");
    let bare = Exporter::start(&sim, &root, &["--oversub-dir", empty.to_str().unwrap()]);
    assert!(!exporter.scrape().text.contains("vgpu_oversub"));

    // A (2 GiB and a checksummed 64 MiB) goes idle and is suspended for
    // B's 2 GiB; B leaves after 5 s and A is restored at its next call
    // (8 s), then stays a while. B comes once A holds its memory (on a
    // loaded host a fixed delay let B take the card first).
    let a = spawn(
        "a",
        &[],
        &["keep", "67108864", "2147483648", "7", "8", "0", "30"],
    );
    let region_a = sim.dir.path().join("a.cache");
    assert!(
        wait_until(30.0, || sim.used_bytes(&region_a) >= 2 * GIB),
        "A never held 2 GiB"
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let b = spawn(
        "b",
        &[("VGPU_OVERSUBSCRIBE_WAIT_MS", "10000")],
        &["hold", "2147483648", "5"],
    );
    let (pa, pb) = (a.id().to_string(), b.id().to_string());
    let pa = pa.as_str();
    let pb = pb.as_str();
    let state = |s: &Scrape, pid: &str, st: &str| {
        s.value("vgpu_oversub_process_state", &[("pid", pid), ("state", st)])
    };
    let uuid_of = |s: &Scrape, pid: &str| {
        s.samples
            .iter()
            .find(|x| {
                x.name == "vgpu_oversub_process_device_bytes"
                    && x.labels.get("pid").map(String::as_str) == Some(pid)
            })
            .map(|x| x.labels["device_uuid"].clone())
    };
    let s = scrape_until(&exporter, 20.0, |s| {
        state(s, pa, "suspended") == Some(1.0)
            && uuid_of(s, pb).is_some_and(|u| {
                s.value(
                    "vgpu_oversub_process_device_bytes",
                    &[("pid", pb), ("device_uuid", &u)],
                ) >= Some((2 * GIB) as f64)
            })
    });
    for st in ["running", "suspending", "restoring", "failed"] {
        assert_eq!(state(&s, pa, st), Some(0.0), "{st}\n{}", s.text);
    }
    assert_eq!(state(&s, pb, "running"), Some(1.0));
    let host = s.get("vgpu_oversub_process_host_bytes", &[("pid", pa)]);
    assert!(host >= (2 * GIB + 64 * MIB) as f64, "{host}");
    assert_eq!(s.get("vgpu_oversub_host_bytes", &[]), host);
    assert_eq!(
        s.get("vgpu_oversub_process_host_bytes", &[("pid", pb)]),
        0.0
    );
    let ua = uuid_of(&s, pa).expect("A's card");
    assert_eq!(
        s.get(
            "vgpu_oversub_process_device_bytes",
            &[("pid", pa), ("device_uuid", &ua)]
        ),
        0.0
    );
    assert_eq!(
        s.get("vgpu_oversub_process_suspensions_total", &[("pid", pa)]),
        1.0
    );
    assert_eq!(
        s.get("vgpu_oversub_process_restores_total", &[("pid", pa)]),
        0.0
    );
    let suspended = s.get(
        "vgpu_oversub_process_suspended_seconds_total",
        &[("pid", pa)],
    );
    assert!(suspended > 0.0, "{}", s.text);
    assert_eq!(s.get("vgpu_oversub_processes", &[]), 2.0);
    assert!(
        s.text
            .contains("# TYPE vgpu_oversub_process_suspensions counter")
    );
    // Turns (issue 27): A went idle, not at a turn's end; B, running
    // within the host bound, could give a turn of the default quantum
    // (the checkpoint API's).
    assert_eq!(
        s.get("vgpu_oversub_process_turns_given_total", &[("pid", pa)]),
        0.0
    );
    assert_eq!(
        s.get("vgpu_oversub_process_quantum_seconds", &[("pid", pb)]),
        660.0
    );
    assert!(
        s.text
            .contains("# TYPE vgpu_oversub_process_turns_taken counter")
    );

    // Restored, and still there.
    let s = scrape_until(&exporter, 15.0, |s| {
        s.value("vgpu_oversub_process_restores_total", &[("pid", pa)]) == Some(1.0)
            && state(s, pa, "running") == Some(1.0)
    });
    assert_eq!(
        s.get("vgpu_oversub_process_host_bytes", &[("pid", pa)]),
        0.0
    );
    assert_eq!(s.get("vgpu_oversub_host_bytes", &[]), 0.0);
    assert!(
        s.get(
            "vgpu_oversub_process_device_bytes",
            &[("pid", pa), ("device_uuid", &ua)]
        ) >= (2 * GIB) as f64
    );
    let after = s.get(
        "vgpu_oversub_process_suspended_seconds_total",
        &[("pid", pa)],
    );
    assert!(after >= suspended, "{after} < {suspended}");
    assert!(
        s.get(
            "vgpu_oversub_process_restoring_seconds_total",
            &[("pid", pa)]
        ) > 0.0
    );
    // B is gone: its entry with it.
    assert_eq!(state(&s, pb, "running"), None);
    assert_eq!(s.get("vgpu_oversub_processes", &[]), 1.0);

    // No board there: no such series, and no complaint.
    assert!(!bare.scrape().text.contains("vgpu_oversub"));
    let mut a = a;
    let _ = a.kill();
    let _ = a.wait();
    drop(exporter);
    let mut bare = bare;
    let _ = bare.child.kill();
    let out = std::mem::replace(&mut bare.child, Command::new("true").spawn().unwrap())
        .wait_with_output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("board"), "{err}");
    let _ = finish(b);
}

#[test]
fn without_hami_families_only_vgpus_own_are_exported() {
    let sim = Sim::new(1, "8g");
    let root = sim.dir.path().join("vgpu");
    let hami = container_region(&root, "hami-uid", "old");
    write_hami_core_file(&hami, unix_now() - 7);
    let exporter = Exporter::start(&sim, &root, &["--without-hami-families"]);
    let s = exporter.scrape();
    let names: std::collections::BTreeSet<&str> =
        s.samples.iter().map(|x| x.name.as_str()).collect();
    assert!(
        names.iter().all(|n| n.starts_with("vgpu_")),
        "not vgpu's own: {names:?}"
    );
    assert_eq!(
        s.value("vgpu_container_sm_limit_ratio", &[("container", "old")]),
        Some(0.4)
    );
    // Together with the legacy names it makes no sense: refused.
    let out = Command::new(&artifacts().vgpuctl)
        .args(["serve", "--without-hami-families", "--legacy-metrics"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--legacy-metrics"), "{err}");
}

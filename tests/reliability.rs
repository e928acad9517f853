//! The reliability suite (docs/reliability.md): kill storms, racing pairs,
//! fork and exec, lost environments, bypasses and hostile region files, on
//! the simulated GPU.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A small deterministic generator (xorshift), so a failing storm can be
/// replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Buffer bytes every slot holds on device entry 0 (`vgpuctl status --json`).
fn slot_buffers(status: &serde_json::Value) -> u64 {
    status["processes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["devices"].as_array().unwrap())
        .filter(|d| d["index"] == 0)
        .map(|d| d["by_kind"]["buffer"].as_u64().unwrap())
        .sum()
}

/// Milliseconds to attach to the region and take its lock, as a process
/// of the container does (a lock left held would show here).
fn attach_and_lock_ms(region: &str) -> f64 {
    let t = Instant::now();
    let opts = vgpu_shm::FileOptions {
        create: None,
        any_owner: true,
    };
    let r = vgpu_shm::Region::open_with(Path::new(region), opts).unwrap();
    drop(r.lock().unwrap());
    t.elapsed().as_secs_f64() * 1e3
}

/// The absolute path of a system command.
fn which(cmd: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(cmd))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{cmd} not found on PATH"))
}

fn kill9(c: &mut Child) {
    let _ = c.kill();
    let _ = c.wait();
}

#[test]
fn kill_storm_leaves_exact_accounting_no_stuck_lock_and_no_overcommit() {
    let _serial = serial();
    let mut sim = Sim::new(1, "16g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "8g")
        .set("SIM_GPU_CTX_OVERHEAD", "128m");
    let region = sim.region().to_str().unwrap().to_string();
    // The storm ends after `storm_kills` kills (about 30 s), or at `secs`
    // on a machine too slow for that.
    let (secs, storm_kills) = (60, 120);
    let watch = sim
        .cmd("smi", false)
        .args(["watch", "0", "20", &(secs + 5).to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let start = |i: usize, rng: &mut Rng| {
        let seed = rng.next(1 << 30).to_string();
        sim.client_cmd(
            PATHS[i % 3],
            true,
            &["storm", "600", &(512 * MIB).to_string(), &seed],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
    };
    let mut workers: Vec<Child> = (0..16)
        .map(|i| {
            std::thread::sleep(Duration::from_millis(50));
            start(i, &mut rng)
        })
        .collect();
    let end = Instant::now() + Duration::from_secs(secs);
    let (mut kills, mut worst_attach_ms) = (0, 0f64);
    while Instant::now() < end && kills < storm_kills {
        std::thread::sleep(Duration::from_millis(50 + rng.next(350)));
        let i = rng.next(16) as usize;
        kill9(&mut workers[i]);
        kills += 1;
        workers[i] = start(i, &mut rng);
        if kills % 10 == 0 {
            worst_attach_ms = worst_attach_ms.max(attach_and_lock_ms(&region));
        }
    }
    // Survivors stop, report what they hold, and keep holding it. A
    // worker restarted just now is waited for until it handles SIGTERM.
    let mut held = 0;
    for w in &mut workers {
        let mut out = BufReader::new(w.stdout.take().unwrap());
        let mut started = String::new();
        out.read_line(&mut started).unwrap();
        sigterm(w.id());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let Some(bytes) = line.trim().strip_prefix("holding=") else {
            panic!(
                "survivor {} did not report ({started:?}, {line:?}): {:?}",
                w.id(),
                w.wait()
            );
        };
        held += bytes.parse::<u64>().unwrap();
    }
    let attach_ms = attach_and_lock_ms(&region);
    sim.ctl(&["reclaim", &region]).ok();
    let status = sim.status(Path::new(&region));
    for w in &mut workers {
        kill9(w);
    }
    sigterm(watch.id());
    let w = finish(watch).ok();
    assert!(kills >= 100, "{kills} kills");
    assert!(held > 0, "survivors held memory");
    assert_eq!(
        slot_buffers(&status),
        held,
        "region vs survivors:\n{status:#}"
    );
    // No stuck lock: a lock left held by a killed process would stall an
    // attach for good. The bound only tells "for good" from "slow": this
    // 2-core CI machine runs the storm's processes too, and beside two
    // busy loops and other test binaries an attach during the storm took
    // 1156 ms. The GPU storm scenario measures the speed.
    assert!(attach_ms < 5000.0, "attach took {attach_ms} ms");
    assert!(
        worst_attach_ms < 5000.0,
        "attach during the storm took {worst_attach_ms} ms"
    );
    // The card was watched through the storm (a sample every 20 ms).
    assert!(w.u64("samples") > 500, "{} samples", w.u64("samples"));
    assert!(
        w.u64("max_used") <= 8 * GIB,
        "physical usage reached {}",
        w.u64("max_used")
    );
}

/// Sends SIGTERM with kill(1).
fn sigterm(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

#[test]
fn a_hundred_thousand_racing_pairs_never_overcommit() {
    let _serial = serial();
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "2g")
        .set("SIM_GPU_CTX_OVERHEAD", "0");
    // Either request fits alone; both never do.
    let r = sim
        .client(
            Path3::Link,
            true,
            &["pairs", "100000", &(1200 * MIB).to_string()],
        )
        .ok();
    assert_eq!(r.u64("rounds"), 100_000);
    assert_eq!(r.u64("overcommits"), 0);
    assert!(
        r.u64("one_granted") > 0,
        "the race must be contested: {}",
        r.stdout
    );
}

#[test]
fn python_pool_children_are_limited_counted_and_return_memory() {
    let _serial = serial();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/programs");
    for method in ["fork", "spawn"] {
        let mut sim = Sim::new(1, "8g");
        sim.set("CUDA_DEVICE_MEMORY_LIMIT", "2g")
            .set("SIM_GPU_CTX_OVERHEAD", "128m");
        let region = sim.region().to_str().unwrap().to_string();
        let out = sim
            .cmd(which("python3"), true)
            .args([
                &format!("{dir}/mp_children.py"),
                method,
                "3",
                &(500 * MIB).to_string(),
            ])
            .args([&region, artifacts().vgpuctl.to_str().unwrap()])
            .output();
        let r = Run::from(match out {
            Ok(o) => o,
            Err(e) => panic!("python3 is needed for this test: {e}"),
        })
        .ok();
        // Three children hold 500 MiB and a 128 MiB context each: 1884 MiB.
        // (Each child's two return codes are in `rcs`: a first one refused
        // once under load on CI, without vgpu saying why.)
        assert_eq!(
            r.u64("granted_first"),
            3,
            "{method}: {}\n{}",
            r.stdout,
            r.stderr
        );
        assert_eq!(
            r.u64("granted_second"),
            0,
            "{method}: a second 500 MiB would pass 2 GiB"
        );
        assert_eq!(
            r.u64("refused_second_oom"),
            3,
            "{method}: refused with CUDA_ERROR_OUT_OF_MEMORY"
        );
        assert!(
            r.u64("region_used_while_held") >= 3 * 628 * MIB,
            "{method}: counted {}",
            r.u64("region_used_while_held")
        );
        // The children have exited: their memory is back.
        let after = sim
            .client(
                Path3::Dlsym,
                true,
                &["alloc", "buffer", &(1800 * MIB).to_string()],
            )
            .ok();
        assert_eq!(after.i64("alloc_rc"), 0, "{method}: {}", after.stderr);
    }
}

#[test]
fn shell_spawned_children_share_the_quota() {
    let _serial = serial();
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "2g")
        .set("SIM_GPU_CTX_OVERHEAD", "128m");
    let bin = artifacts().bin.display().to_string();
    let script = format!(
        "{bin}/cuclient-via_dlsym hold {h} 4 >/dev/null & {bin}/cuclient-via_link hold {h} 4 >/dev/null & \
         sleep 1.5; {bin}/cuclient-via_procaddr alloc buffer {big}; wait",
        h = 600 * MIB,
        big = 900 * MIB
    );
    let r = Run::from(
        sim.cmd(which("sh"), true)
            .args(["-c", &script])
            .output()
            .unwrap(),
    )
    .ok();
    // 2 x (600 + 128) + 128 + 900 > 2048.
    assert_eq!(r.i64("alloc_rc"), 2, "{}", r.stderr);
    assert_eq!(r.u64("during_total"), 2 * GIB);
}

#[test]
fn a_process_with_no_environment_finds_the_region_next_to_the_library() {
    let _serial = serial();
    let a = artifacts();
    let root = tempfile::tempdir().unwrap();
    // The device plugin's layout: the library and the container's region
    // in one directory.
    let vgpu_dir = root.path().join("vgpu");
    std::fs::create_dir_all(&vgpu_dir).unwrap();
    let lib = vgpu_dir.join("libvgpu.so");
    std::fs::copy(&a.libvgpu, &lib).unwrap();
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    sim.set(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        vgpu_dir.join("container.cache").to_str().unwrap(),
    );
    let made = sim
        .cmd("cuclient-via_dlsym", false)
        .env("LD_PRELOAD", &lib)
        .arg("info")
        .output()
        .unwrap();
    assert!(made.status.success() && vgpu_dir.join("container.cache").exists());
    // A client that finds the driver without LD_LIBRARY_PATH.
    let drivers = sim.dir.path().join("drivers");
    let client = root.path().join("cuclient-rpath");
    let cc = Command::new("cc")
        .args(["-O1", "-D", "VIA_DLSYM", "-o"])
        .arg(&client)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/programs/cuclient.c"
        ))
        .arg(format!("-Wl,-rpath,{}", drivers.display()))
        .args(["-ldl", "-lpthread"])
        .status()
        .unwrap();
    assert!(cc.success());
    // `env -i` keeps only LD_PRELOAD: no limit, no region path, no
    // LD_LIBRARY_PATH. Needs no privilege, so it runs everywhere.
    let out = Command::new("env")
        .arg("-i")
        .arg(format!("LD_PRELOAD={}", lib.display()))
        .arg(&client)
        .args(["alloc", "buffer", &(900 * MIB).to_string()])
        .output()
        .unwrap();
    let r = Run::from(out).ok();
    assert_eq!(r.i64("alloc_rc"), 2, "env -i, still limited: {}", r.stderr);
    assert_eq!(r.u64("during_total"), GIB);
    // /etc/ld.so.preload, in a mount namespace of this test only.
    let etc = root.path().join("etc");
    let cp = Command::new("cp")
        .arg("-a")
        .arg("/etc")
        .arg(&etc)
        .status()
        .unwrap();
    assert!(cp.success());
    std::fs::write(etc.join("ld.so.preload"), format!("{}\n", lib.display())).unwrap();
    let script = format!(
        "mount --bind {etc} /etc && exec env -i {client} alloc buffer {big}",
        etc = etc.display(),
        client = client.display(),
        big = 900 * MIB
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    if String::from_utf8_lossy(&out.stderr).contains("Operation not permitted") {
        // Documented in docs/reliability.md: this needs CAP_SYS_ADMIN.
        eprintln!("SKIPPED: unshare --mount is not permitted here");
        return;
    }
    let r = Run::from(out).ok();
    assert_eq!(
        r.i64("alloc_rc"),
        2,
        "no environment, still limited: {}{}",
        r.stdout,
        r.stderr
    );
    assert_eq!(r.u64("during_total"), GIB);
    // The machine's own /etc is untouched.
    assert!(
        !std::path::Path::new("/etc/ld.so.preload").exists()
            || std::fs::read_to_string("/etc/ld.so.preload")
                .map_or(true, |s| !s.contains(lib.to_str().unwrap()))
    );
}

#[test]
fn dlsym_as_a_programs_first_call_knows_whether_control_is_disabled() {
    // dlopen, then dlsym: the lookup is often the first thing of vgpu a
    // program runs; it starts the runtime to answer (interpose/dlsym.rs).
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let r = sim.client(Path3::Dlsym, true, &["owner"]).ok();
    assert_eq!(r.u64("dlsym_found"), 1);
    assert_eq!(r.u64("dlsym_driver"), 0, "limited: the hook");
    sim.set("CUDA_DISABLE_CONTROL", "1");
    let r = sim.client(Path3::Dlsym, true, &["owner"]).ok();
    assert_eq!(r.u64("dlsym_found"), 1);
    assert_eq!(
        r.u64("dlsym_driver"),
        1,
        "control disabled: the driver's own"
    );
}

#[test]
fn rtld_next_and_dlvsym_reach_the_hooks() {
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let r = sim
        .client(Path3::Dlsym, true, &["bypass", &(900 * MIB).to_string()])
        .ok();
    assert_eq!(r.u64("rtld_next_found"), 1);
    assert_eq!(r.i64("rtld_next_rc"), 2, "dlsym(RTLD_NEXT) is no bypass");
    // The driver's symbols carry no version, so glibc's dlvsym finds them
    // only through a version they have: none. What it does find for a
    // hooked name is the hook.
    for version in ["GLIBC_2.2.5", "libcuda.so.1"] {
        let r = sim
            .client(
                Path3::Dlsym,
                true,
                &["bypass", &(900 * MIB).to_string(), version],
            )
            .ok();
        assert!(
            r.u64("dlvsym_found") == 0 || r.i64("dlvsym_rc") == 2,
            "{version}: {}",
            r.stdout
        );
        let bare = Sim::new(1, "8g")
            .client(
                Path3::Dlsym,
                false,
                &["bypass", &(900 * MIB).to_string(), version],
            )
            .ok();
        assert_eq!(
            bare.get("dlvsym_found"),
            r.get("dlvsym_found"),
            "{version}: found the same as without vgpu"
        );
    }
}

fn hostile_files() -> Vec<(&'static str, Vec<u8>)> {
    let good = {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.cache");
        drop(vgpu_shm::Region::open(&p, vgpu_shm::OpenMode::CreateIfMissing).unwrap());
        std::fs::read(&p).unwrap()
    };
    // vgpu's header is at VGPU_OFFSET, behind HAMi's layout.
    let at = vgpu_shm::layout::VGPU_OFFSET;
    let mut future = good.clone();
    future[at + 8..at + 12].copy_from_slice(&(vgpu_shm::layout::VERSION_MAJOR + 1).to_le_bytes());
    let mut lying = good.clone();
    lying[at + 16..at + 24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let mut rng = Rng(42);
    vec![
        ("shorter than a region header", good[..20].to_vec()),
        ("shorter than a region header", good[..8192].to_vec()),
        ("wrong magic", b"not a region".repeat(1000)),
        ("newer than this library", future),
        (
            "wrong magic",
            (0..100_000).map(|_| rng.next(256) as u8).collect(),
        ),
        ("size mismatch", lying),
    ]
}

#[test]
fn hostile_region_files_are_refused_once_and_nothing_crashes() {
    for (why, bytes) in hostile_files() {
        for limited in [true, false] {
            let mut sim = Sim::new(1, "8g");
            if limited {
                sim.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
            }
            std::fs::write(sim.region(), &bytes).unwrap();
            let r = sim
                .client(
                    Path3::ProcAddr,
                    true,
                    &["alloc", "buffer", &(900 * MIB).to_string()],
                )
                .ok();
            let refusals = r.stderr.lines().filter(|l| l.contains("refused")).count();
            assert_eq!(refusals, 1, "{why}: one message:\n{}", r.stderr);
            assert!(r.stderr.contains(why), "{why}: {}", r.stderr);
            // The documented policy: the environment's limits still hold
            // (this process alone); without any, it runs unlimited.
            assert_eq!(
                r.i64("alloc_rc"),
                if limited { 2 } else { 0 },
                "{why} limited={limited}"
            );
            assert_eq!(
                std::fs::read(sim.region()).unwrap(),
                bytes,
                "{why}: never modified"
            );
        }
    }
}

#[test]
fn a_crashing_program_takes_nothing_with_it() {
    // SIGSEGV in the program while it holds memory: the next process gets it.
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "2g");
    let mut holder = sim.spawn_client(
        Path3::Dlsym,
        true,
        &["hold", &(1500 * MIB).to_string(), "60"],
    );
    assert!(wait_until(10.0, || sim.region_used(0) >= 1500 * MIB));
    let _ = Command::new("kill")
        .args(["-SEGV", &holder.id().to_string()])
        .status();
    let status = holder.wait().unwrap();
    assert!(!status.success());
    let r = sim
        .client(
            Path3::Dlsym,
            true,
            &["alloc", "buffer", &(1500 * MIB).to_string()],
        )
        .ok();
    assert_eq!(r.i64("alloc_rc"), 0);
}

//! The HAMi part of live regions on the simulated GPU: a node monitor's
//! reader built from include/hami_region.h alone sees the usage and limits
//! vgpu sees, and what a monitor writes takes effect: priority blocking
//! across two containers, the utilisation switch, limits.

mod common;

use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;
use vgpu_shm::hami::layout::{HamiProc, HamiRegion, HamiUsed, HamiUtil};
use vgpu_shm::layout::Kind;
use vgpu_shm::{EntryIndex, OpenMode, Owners, Region, format_uuid};

/// hami_reader, built from the header once per test binary.
fn reader() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let exe = artifacts().bin.join("hami_reader");
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/programs/hami_reader.c");
        let cc = Command::new("cc")
            .args(["-O1", "-Wall", "-Werror", "-o"])
            .arg(&exe)
            .arg(src)
            .output()
            .unwrap();
        assert!(
            cc.status.success(),
            "{}",
            String::from_utf8_lossy(&cc.stderr)
        );
        exe
    })
}

/// What the reader sees in the region at `path`.
fn read(path: &Path) -> Run {
    Run::from(Command::new(reader()).arg(path).output().unwrap()).ok()
}

/// The processes the reader shows, None while the file is not (yet) a
/// region it accepts.
fn procs_shown(path: &Path) -> Option<u64> {
    let r = Run::from(Command::new(reader()).arg(path).output().unwrap());
    r.status.success().then(|| r.u64("proc_num"))
}

/// Writes a field as a monitor does.
fn set(path: &Path, field: &str, value: i64) {
    Run::from(
        Command::new(reader())
            .arg(path)
            .args(["set", field, &value.to_string()])
            .output()
            .unwrap(),
    )
    .ok();
}

fn value(r: &Run, key: &str) -> Option<u64> {
    r.kv.get(key).and_then(|v| v.parse().ok())
}

#[test]
fn the_c_header_matches_the_rust_layout() {
    let c = Run::from(Command::new(reader()).output().unwrap()).ok();
    assert_eq!(c.u64("sizeof.region"), size_of::<HamiRegion>() as u64);
    assert_eq!(c.u64("sizeof.region"), vgpu_shm::hami::HAMI_SIZE as u64);
    assert_eq!(c.u64("sizeof.proc"), size_of::<HamiProc>() as u64);
    assert_eq!(c.u64("sizeof.used"), size_of::<HamiUsed>() as u64);
    assert_eq!(c.u64("sizeof.util"), size_of::<HamiUtil>() as u64);
    for (field, offset) in [
        ("hami_region.sem", offset_of!(HamiRegion, sem)),
        ("hami_region.device_num", offset_of!(HamiRegion, device_num)),
        ("hami_region.uuids", offset_of!(HamiRegion, uuids)),
        ("hami_region.limit", offset_of!(HamiRegion, limit)),
        ("hami_region.sm_limit", offset_of!(HamiRegion, sm_limit)),
        ("hami_region.procs", offset_of!(HamiRegion, procs)),
        ("hami_region.proc_num", offset_of!(HamiRegion, proc_num)),
        (
            "hami_region.utilization_switch",
            offset_of!(HamiRegion, utilization_switch),
        ),
        (
            "hami_region.recent_kernel",
            offset_of!(HamiRegion, recent_kernel),
        ),
        ("hami_region.priority", offset_of!(HamiRegion, priority)),
        (
            "hami_region.last_kernel_time",
            offset_of!(HamiRegion, last_kernel_time),
        ),
        (
            "hami_region.sem_postinit",
            offset_of!(HamiRegion, sem_postinit),
        ),
        ("hami_proc.hostpid", offset_of!(HamiProc, hostpid)),
        ("hami_proc.used", offset_of!(HamiProc, used)),
        ("hami_proc.monitorused", offset_of!(HamiProc, monitorused)),
        ("hami_proc.device_util", offset_of!(HamiProc, device_util)),
        ("hami_proc.status", offset_of!(HamiProc, status)),
        ("hami_proc.seqlock", offset_of!(HamiProc, seqlock)),
        ("hami_used.context_size", offset_of!(HamiUsed, context_size)),
        ("hami_used.data_size", offset_of!(HamiUsed, data_size)),
        ("hami_used.total", offset_of!(HamiUsed, total)),
        ("hami_util.sm_util", offset_of!(HamiUtil, sm_util)),
    ] {
        assert_eq!(c.u64(field), offset as u64, "{field}");
    }
}

/// The reader's (pid, device index) -> total, for every process shown.
fn shown_totals(r: &Run) -> Vec<(i32, usize, u64)> {
    let n = r.u64("proc_num") as usize;
    let mut out = Vec::new();
    for k in 0..n {
        let pid: i32 = r.get(&format!("proc{k}.pid")).parse().unwrap();
        for d in 0..16 {
            if let Some(t) = value(r, &format!("proc{k}.dev{d}.total")) {
                out.push((pid, d, t));
            }
        }
    }
    out
}

/// Whether the reader shows exactly vgpu's live usage of every device
/// (per process and in sum).
fn agrees(r: &Run, region: &Region) -> Result<(), String> {
    let shown = shown_totals(r);
    for e in EntryIndex::all().filter(|&e| region.device(e).is_used()) {
        let Some(d) = region.hami_index(e) else {
            return Err(format!("entry {e} has no HAMi index yet"));
        };
        let sum: u64 = shown.iter().filter(|s| s.1 == d).map(|s| s.2).sum();
        let live = region.device_usage(e, Owners::Live);
        if sum != live {
            return Err(format!("device {d}: reader {sum}, vgpu {live}"));
        }
        for slot in region.occupied_slots() {
            let pid = region.pid(slot);
            let want = region.slot_total(slot, e);
            let got = shown
                .iter()
                .find(|s| s.0 == pid && s.1 == d)
                .map_or(0, |s| s.2);
            if want != got && vgpu_shm::procinfo::pid_exists(pid) {
                return Err(format!("pid {pid} device {d}: reader {got}, vgpu {want}"));
            }
        }
    }
    Ok(())
}

/// Whether the reader shows both processes, each with vgpu's host pid,
/// status, context and data, and NVML's figure for it.
fn per_process_agrees(shown: &Run, r: &Region) -> Result<(), String> {
    let n = value(shown, "proc_num").ok_or("no proc_num")?;
    if n != 2 {
        return Err(format!("{n} processes shown"));
    }
    for k in 0..2 {
        let field = |name: &str| {
            value(shown, &format!("proc{k}.{name}")).ok_or(format!("no proc{k}.{name}"))
        };
        let pid = field("pid")? as i32;
        let slot = r
            .occupied_slots()
            .find(|&s| r.pid(s) == pid)
            .ok_or(format!("pid {pid} has no slot"))?;
        let e = EntryIndex::all()
            .find(|&e| r.slot_total(slot, e) > 0)
            .ok_or(format!("pid {pid} holds nothing"))?;
        let d = r
            .hami_index(e)
            .ok_or(format!("entry {e} has no HAMi index"))?;
        let context = r.slot_usage(slot, e, Kind::Context);
        let figures = [
            ("hostpid", field("hostpid")?, pid as u64),
            ("status", field("status")?, 1),
            ("context", field(&format!("dev{d}.context"))?, context),
            (
                "data",
                field(&format!("dev{d}.data"))?,
                // (Read apart from the context: it may move between.)
                r.slot_total(slot, e).saturating_sub(context),
            ),
            (
                "monitorused",
                field(&format!("dev{d}.monitorused"))?,
                r.nvml_used(slot, e),
            ),
        ];
        for (name, got, want) in figures {
            if got != want {
                return Err(format!(
                    "proc{k} (pid {pid}) dev{d} {name}: reader {got}, vgpu {want}"
                ));
            }
        }
    }
    Ok(())
}

/// Whether every process shows NVML's used memory of at least what it
/// allocated.
fn nvml_shown(r: &Run, why: &mut String) -> bool {
    let n = r.u64("proc_num") as usize;
    (0..n).all(|k| {
        (0..16).all(|d| {
            let (Some(data), Some(nvml)) = (
                value(r, &format!("proc{k}.dev{d}.data")),
                value(r, &format!("proc{k}.dev{d}.monitorused")),
            ) else {
                return true;
            };
            *why = format!("proc{k} dev{d}: data {data}, NVML {nvml}");
            nvml >= data
        })
    })
}

#[test]
fn a_reader_built_from_the_c_header_sees_what_vgpu_sees() {
    let mut sim = Sim::new(2, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "2g")
        .set("CUDA_DEVICE_SM_LIMIT", "50");
    let a = sim.spawn_client(
        Path3::Dlsym,
        true,
        &["hold", &(300 * MIB).to_string(), "30"],
    );
    // The second card, as this process's CUDA ordinal 0: HAMi's index is
    // the container's number for the card (its NVML index), 1.
    let b = sim
        .client_cmd(
            Path3::ProcAddr,
            true,
            // (15 s: it outlives the reads below on a loaded host.)
            &["hold", &(500 * MIB).to_string(), "15"],
        )
        .env("CUDA_VISIBLE_DEVICES", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let region = sim.region();
    let shown_both = wait_until(30.0, || {
        procs_shown(&region) == Some(2)
            && shown_totals(&read(&region))
                .iter()
                .filter(|s| s.2 > 0)
                .count()
                == 2
    });
    assert!(shown_both, "{}", read(&region).stdout);
    let r = Region::open(&region, OpenMode::ExistingOnly).unwrap();
    // Figures settle at the writer's next pass; NVML's within a second.
    // A context's provisional charge gives way to its measured one at any
    // moment, so one read must agree in every figure (the checks below run
    // on that read).
    let mut last = String::new();
    let mut settled_read = None;
    let settled = wait_until(5.0, || {
        let shown = read(&region);
        let agreed = agrees(&shown, &r).and_then(|()| per_process_agrees(&shown, &r));
        match agreed {
            Ok(()) if nvml_shown(&shown, &mut last) => {
                settled_read = Some(shown);
                true
            }
            Ok(()) => false,
            Err(e) => {
                last = e;
                false
            }
        }
    });
    assert!(settled, "{last}\n{}", read(&region).stdout);
    let shown = settled_read.unwrap();
    assert_eq!(
        (shown.u64("magic"), shown.get("version")),
        (19_920_718, "1.2")
    );
    for e in EntryIndex::all().filter(|&e| r.device(e).is_used()) {
        let d = r.hami_index(e).unwrap();
        let dev = r.device(e);
        assert_eq!(shown.get(&format!("dev{d}.uuid")), format_uuid(&dev.uuid()));
        assert_eq!(shown.u64(&format!("dev{d}.limit")), 2 << 30);
        assert_eq!(shown.u64(&format!("dev{d}.sm_limit")), 50);
    }
    // The card the second process used has index 1.
    let b_slot = r
        .occupied_slots()
        .find(|&s| r.pid(s) == b.id() as i32)
        .unwrap();
    let b_entry = EntryIndex::all()
        .find(|&e| r.slot_total(b_slot, e) > 0)
        .unwrap();
    assert_eq!(r.hami_index(b_entry), Some(1));
    // A killed process drops out within seconds (the other one writes).
    let mut a = a;
    a.kill().unwrap();
    a.wait().unwrap();
    let t = Instant::now();
    assert!(
        wait_until(5.0, || read(&region).u64("proc_num") == 1),
        "{}",
        read(&region).stdout
    );
    eprintln!(
        "killed process gone from the HAMi part in {:?}",
        t.elapsed()
    );
    assert_eq!(
        read(&region).get("proc0.pid"),
        b.id().to_string(),
        "the survivor moved to the front"
    );
    // The last one exits normally: it leaves as it goes.
    let b = finish(b).ok();
    assert_eq!(b.i64("hold_rc"), 0);
    assert!(
        wait_until(1.0, || read(&region).u64("proc_num") == 0),
        "{}",
        read(&region).stdout
    );
}

fn per_sec(r: &Run) -> Vec<f64> {
    r.get("per_sec")
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect()
}

/// User + system CPU seconds of process `pid` so far.
fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 (the 12th and 13th after ')').
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

#[test]
fn priority_blocking_stops_a_containers_launches_until_it_is_lifted() {
    let _serial = serial();
    let sim = Sim::new(1, "8g");
    let (high, low) = (sim.region(), sim.dir.path().join("low.cache"));
    let spin = ["spin", "1000000", "132", "8", "kernel"];
    let a = sim
        .client_cmd(Path3::ProcAddr, true, &spin)
        .env("CUDA_TASK_PRIORITY", "0")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let b = sim
        .client_cmd(Path3::ProcAddr, true, &spin)
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &low)
        .env("CUDA_TASK_PRIORITY", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_until(10.0, || procs_shown(&low) == Some(1)
        && procs_shown(&high) == Some(1)));
    assert_eq!(read(&high).i64("priority"), 0);
    assert_eq!(read(&low).i64("priority"), 1);
    std::thread::sleep(Duration::from_secs(2));
    // The monitor blocks the lower priority: HAMi's feedback loop.
    set(&low, "recent_kernel", -1);
    std::thread::sleep(Duration::from_millis(400));
    let cpu_before = cpu_s(b.id());
    std::thread::sleep(Duration::from_millis(2000));
    let cpu_blocked = cpu_s(b.id()) - cpu_before;
    // vgpuctl shows the block and how long a process honours it.
    let shown = sim.ctl(&["status", low.to_str().unwrap()]).stdout;
    assert!(
        shown.contains("launches blocked by a node monitor"),
        "{shown}"
    );
    assert_eq!(
        read(&low).i64("recent_kernel"),
        -1,
        "a launch never lifts it"
    );
    set(&low, "recent_kernel", 0);
    let (a, b) = (finish(a).ok(), finish(b).ok());
    let (ra, rb) = (per_sec(&a), per_sec(&b));
    // The blocked container: whole seconds without a kernel, between
    // seconds with them; the other one never stopped.
    let first = rb.iter().position(|&v| v > 0.0).unwrap();
    let last = rb.iter().rposition(|&v| v > 0.0).unwrap();
    let idle = rb[first..=last].iter().filter(|&&v| v == 0.0).count();
    assert!(
        idle >= 1 && last >= first + 3,
        "low priority per second: {rb:?}"
    );
    assert!(
        ra.iter().all(|&v| v > 0.0),
        "high priority per second: {ra:?}"
    );
    // Waiting launches sleep: a spinning wait would burn 2 CPU-seconds.
    assert!(cpu_blocked < 0.5, "{cpu_blocked:.2} CPU-s while blocked");
    // Launches after the lift marked the container active again.
    assert_eq!(read(&low).i64("recent_kernel"), 2);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(now - read(&low).u64("last_kernel_time") <= 3);
}

/// Completions per second before and after the monitor switches the SM
/// limit off at 4 s, under `policy`.
fn switched_off(policy: &str) -> (f64, f64) {
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_SM_LIMIT", "20")
        .set("GPU_CORE_UTILIZATION_POLICY", policy);
    let spin = sim.spawn_client(
        Path3::Link,
        true,
        &["spin", "1000000", "132", "8", "kernel"],
    );
    let region = sim.region();
    assert!(wait_until(10.0, || procs_shown(&region) == Some(1)));
    std::thread::sleep(Duration::from_secs(4));
    set(&region, "utilization_switch", 0);
    let r = per_sec(&finish(spin).ok());
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    (mean(&r[1..3]), mean(&r[5..8]))
}

#[test]
fn the_utilization_switch_lifts_the_sm_limit_under_the_default_policy_only() {
    let _serial = serial();
    // Judged against the limit's rate (20 % of 1 ms kernels: 200/s), not
    // the first seconds', which a loaded host holds down (135/s once,
    // where 216/s after the switch then looked like a lift).
    const LIMITED: f64 = 200.0;
    let (before, after) = switched_off("default");
    assert!(before < 1.5 * LIMITED, "default: {before:.0}/s before");
    assert!(
        after > 2.5 * LIMITED,
        "default: {before:.0}/s then {after:.0}/s"
    );
    let (before, after) = switched_off("force");
    assert!(before < 1.5 * LIMITED, "force: {before:.0}/s before");
    assert!(
        after < 1.5 * LIMITED && after > 0.5 * LIMITED,
        "force: {before:.0}/s then {after:.0}/s"
    );
}

#[test]
fn limits_a_monitor_writes_take_effect() {
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "2g");
    let holder = sim.spawn_client(
        Path3::Dlsym,
        true,
        &["hold", &(100 * MIB).to_string(), "20"],
    );
    let region = sim.region();
    assert!(wait_until(10.0, || procs_shown(&region) == Some(1)
        && value(&read(&region), "dev0.limit") == Some(2 << 30)));
    let r = Region::open(&region, OpenMode::ExistingOnly).unwrap();
    let e = EntryIndex::all().find(|&e| r.device(e).is_used()).unwrap();
    set(&region, "limit.0", 768 << 20);
    set(&region, "sm_limit.0", 30);
    assert!(wait_until(2.0, || r.device(e).limits().mem == 768 << 20
        && r.device(e).sm_limit() == 30));
    // The holder has its context (256 MiB) and 100 MiB; a new process's
    // context and 600 MiB do not fit under 768 MiB, 100 MiB do.
    let big = sim.client(
        Path3::ProcAddr,
        true,
        &["alloc", "buffer", &(600 * MIB).to_string()],
    );
    assert_eq!(big.i64("alloc_rc"), 2, "{}", big.stdout);
    let small = sim.client(
        Path3::ProcAddr,
        true,
        &["alloc", "buffer", &(100 * MIB).to_string()],
    );
    assert_eq!(small.i64("alloc_rc"), 0, "{}", small.stdout);
    // And nvidia-smi's total inside the container is the new limit.
    let smi = Run::from(sim.cmd("smi", true).output().unwrap()).ok();
    assert_eq!(smi.u64("gpu0_v1_total"), 768 << 20);
    let mut holder = holder;
    let _ = holder.kill();
    let _ = holder.wait();
}

#[test]
fn a_block_nobody_lifts_ends_after_its_bound_when_the_container_is_alone() {
    // Issue 26, finding 6: a -1 written once (then the monitor died) froze
    // the container for ever. Alone on its GPU (no other container's
    // process there, so no higher-priority one alive), a process lifts it
    // after 15 s, with a warning.
    let _serial = serial();
    let mut sim = Sim::new(1, "8g");
    // The compute leader (an SM limit, enforced) is what looks whether the
    // container is alone.
    sim.set("CUDA_DEVICE_SM_LIMIT", "90")
        .set("GPU_CORE_UTILIZATION_POLICY", "force");
    let region = sim.region();
    let b = sim
        .client_cmd(
            Path3::ProcAddr,
            true,
            &["spin", "1000000", "132", "26", "kernel"],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_until(10.0, || procs_shown(&region) == Some(1)));
    std::thread::sleep(Duration::from_secs(2));
    set(&region, "recent_kernel", -1);
    // Bounded: before the bound, the blocked process never ended.
    let mut b = b;
    let ended = wait_until(60.0, || matches!(b.try_wait(), Ok(Some(_))));
    if !ended {
        let _ = b.kill();
    }
    let r = finish(b);
    assert!(ended, "still blocked after 60 s: {}", r.stderr);
    let r = r.ok();
    let rb = per_sec(&r);
    let first = rb.iter().position(|&v| v > 0.0).unwrap();
    let last = rb.iter().rposition(|&v| v > 0.0).unwrap();
    let idle = rb[first..=last].iter().filter(|&&v| v == 0.0).count();
    // Blocked for about 15 s, then launching again to the end.
    assert!((10..=22).contains(&idle), "per second: {rb:?}");
    assert!(last + 3 >= rb.len(), "per second: {rb:?}");
    assert!(r.stderr.contains("the block is lifted"), "{}", r.stderr);
}

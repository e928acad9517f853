//! `vgpuctl`: inspect a vgpu shared region.
//!
//! ```text
//! vgpuctl status  [REGION]     devices, limits, usage, processes
//! vgpuctl usage   REGION DEV   the container's bytes on device entry DEV
//! vgpuctl reclaim [REGION]     free the slots of dead processes
//! vgpuctl oversub [DIR]        the node's oversubscription board (oversub.rs)
//! ```
//!
//! REGION defaults to `$CUDA_DEVICE_MEMORY_SHARED_CACHE`, then
//! `/tmp/cudevshr.cache`. Output is `key=value` lines, for people and tests;
//! a reader that goes away early (`vgpuctl status | head -1`) ends it
//! quietly. A region of any owner is read (this tool never creates one and
//! only ever frees dead processes' slots), but never through a symlink.
//! Built on `vgpu-shm` alone: this binary exports no CUDA or NVML symbol.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Instant;

mod oversub;

use vgpu_shm::{EntryIndex, FileOptions, Kind, Owners, ProcView, Region, format_uuid, procinfo};

fn region_path(arg: Option<&String>) -> PathBuf {
    arg.map(PathBuf::from)
        .or_else(|| std::env::var_os("CUDA_DEVICE_MEMORY_SHARED_CACHE").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/tmp/cudevshr.cache"))
}

fn open(path: &Path) -> Result<(Region, f64), String> {
    let t = Instant::now();
    let opts = FileOptions {
        create: None,
        any_owner: true,
    };
    let r = Region::open_with(path, opts).map_err(|e| e.to_string())?;
    Ok((r, t.elapsed().as_secs_f64() * 1e3))
}

fn status(out: &mut String, r: &Region, open_ms: f64) {
    let h = r.header();
    let view = ProcView::current();
    let _ = writeln!(
        out,
        "region={} version={}.{} open_ms={open_ms:.3} slot_hwm={} reclaims={}",
        r.path().display(),
        h.version_major.load(Ordering::Relaxed),
        h.version_minor.load(Ordering::Relaxed),
        r.slot_hwm(),
        h.reclaims.load(Ordering::Relaxed),
    );
    for dev in EntryIndex::all().filter(|&d| r.device(d).is_used()) {
        let d = r.device(dev);
        let l = d.limits();
        let leader = d.leader_pid();
        let _ = writeln!(
            out,
            "device={dev} uuid={} mem_limit={} sm_limit={} policy={} total={} used={} used_all={} scale={:.3} util={:.3} leader={leader}",
            format_uuid(&d.uuid()),
            l.mem,
            l.sm,
            l.policy as u32,
            d.total_mem(),
            r.device_usage(dev, Owners::Live),
            r.device_usage(dev, Owners::All),
            f64::from(d.rate_scale_milli()) / 1000.0,
            f64::from(d.util_milli()) / 1000.0,
        );
    }
    for i in r.occupied_slots() {
        let owner = r.owner(i);
        let pid = owner.pid;
        let alive = match procinfo::liveness(&owner, &view) {
            procinfo::Liveness::Alive => "1",
            procinfo::Liveness::Dead => "0",
            procinfo::Liveness::Unknown => "unknown",
        };
        let beat = r
            .heartbeat_age_ms(i, procinfo::monotonic_ms())
            .map_or("none".to_string(), |a| a.to_string());
        let mut line = format!(
            "slot={i} pid={pid} pidns={} host_pid={} host_pid_verified={} alive={alive} heartbeat_age_ms={beat}",
            owner.pidns,
            owner.host_pid,
            u8::from(owner.host_pid_verified),
        );
        for dev in EntryIndex::all().filter(|&d| r.slot_total(i, d) > 0) {
            line += &format!(" dev{dev}_total={}", r.slot_total(i, dev));
            for k in Kind::ALL {
                line += &format!(" dev{dev}_{}={}", k.name(), r.slot_usage(i, dev, k));
            }
            line += &format!(" dev{dev}_sm_util={}", r.sm_util(i, dev));
        }
        let _ = writeln!(out, "{line}");
    }
}

fn run(args: &[String]) -> Result<String, String> {
    let mut out = String::new();
    match args.first().map(String::as_str) {
        Some("status") | None => {
            let (r, ms) = open(&region_path(args.get(1)))?;
            status(&mut out, &r, ms);
        }
        Some("usage") => {
            let (r, _) = open(&region_path(args.get(1)))?;
            let dev: usize = args.get(2).and_then(|d| d.parse().ok()).ok_or(
                "usage needs a region and a device entry number: vgpuctl usage REGION DEV",
            )?;
            let dev = EntryIndex::new(dev).ok_or_else(|| {
                format!(
                    "device entry {dev} out of range: a region has entries 0 to {}",
                    vgpu_shm::MAX_DEVICES - 1
                )
            })?;
            let _ = writeln!(out, "used={}", r.device_usage(dev, Owners::Live));
        }
        Some("reclaim") => {
            let (r, _) = open(&region_path(args.get(1)))?;
            let n = r
                .reclaim_dead(&ProcView::current(), None)
                .map_err(|e| e.to_string())?;
            let _ = writeln!(out, "reclaimed={n}");
        }
        Some("oversub") => out = oversub::report(args.get(1))?,
        Some(other) => {
            return Err(format!(
                "unknown command {other:?}: status, usage, reclaim or oversub"
            ));
        }
    }
    Ok(out)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(text) => match std::io::stdout().lock().write_all(text.as_bytes()) {
            // The reader has what it wanted (`| head -1`).
            Ok(()) => ExitCode::SUCCESS,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("vgpuctl: writing the output failed: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("vgpuctl: {e}");
            ExitCode::FAILURE
        }
    }
}

//! `vgpuctl serve --feedback`: HAMi's priority feedback loop, in place of
//! HAMi's vGPUmonitor's. Every round it reads a copy of every region's
//! HAMi part, decides with `vgpu_shm::hami::monitor::observe`, and writes
//! each verdict back (`recent_kernel`, `utilization_switch`) with atomics.
//! This is the only thing `serve` ever writes into a region, and only
//! with `--feedback`. Run it where HAMi's monitor's own loop does not run
//! (two loops would each decrement `recent_kernel`).

use std::time::Duration;

use vgpu_shm::hami::monitor::{self, Seen};

use super::targets::Targets;

/// Runs a round every `period`, on a thread of its own.
pub fn start(targets: Targets, period: Duration) {
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(period);
            round(&targets);
        }
    });
}

/// One round over every target; changes are said on stderr, as HAMi's
/// monitor logs them.
pub fn round(targets: &Targets) {
    let mut paths = Vec::new();
    let mut seen = Vec::new();
    for t in targets.current() {
        let Ok(opened) = vgpu_shm::read_copy(&t.path) else {
            continue;
        };
        let Some(h) = opened.snapshot() else {
            continue; // vgpu's layout 1.x: no HAMi part to write
        };
        seen.push(Seen {
            uuids: h.devices.iter().map(|d| d.uuid.clone()).collect(),
            priority: h.priority,
            recent_kernel: h.recent_kernel,
        });
        paths.push(t.path);
    }
    for (path, verdict) in paths.iter().zip(monitor::observe(&seen)) {
        match monitor::apply_to_file(path, verdict) {
            Ok(c) => {
                if let Some(b) = c.blocked {
                    let what = if b { "blocked" } else { "unblocked" };
                    eprintln!("vgpuctl serve: {} {what}", path.display());
                }
                if let Some(s) = c.switch {
                    eprintln!("vgpuctl serve: {} utilization_switch {s}", path.display());
                }
            }
            Err(e) => eprintln!("vgpuctl serve: feedback: {e}"),
        }
    }
}

//! The library's side of the HAMi part of the region (`vgpu_shm::hami`):
//! what node monitors read, and what they write back.
//!
//! - `gate`: the launch path's one check (one atomic load): wait while a
//!   monitor blocks the container, and note that it launched
//! - `writer`: the process elected to keep the HAMi part true: device
//!   indices, NVML's per-process memory and SM utilisation, the mirror of
//!   the slots
//!
//! [`tick`] runs on every process's watcher (every 100 ms): it reads
//! `recent_kernel` for the gate (a block is honoured for a bounded time:
//! [`BLOCK_ALONE_S`] while the container looks alone on its GPUs, else
//! [`BLOCK_MAX_S`], so a dead monitor never freezes it for ever), marks the container's launches
//! (`recent_kernel`, `last_kernel_time`), and runs the writer when this
//! process holds its lease. Nothing here runs on the allocation or launch
//! path but the gate.
#![forbid(unsafe_code)]

mod gate;
mod writer;

pub use gate::{launching, reset_in_child};
pub use writer::Writer;

use std::sync::atomic::{AtomicU64, Ordering};

use vgpu_shm::hami::{BLOCK_ALONE_S, BLOCK_MAX_S};

use crate::attach::Attach;

/// When this process first saw the present block (monotonic ns; 0: none).
static BLOCKED_SINCE: AtomicU64 = AtomicU64::new(0);

/// One watcher tick.
pub fn tick(attach: &'static Attach, writer: &mut Writer) {
    if observe(attach) {
        writer.tick(attach);
    }
}

/// Reads what a monitor wrote for the gate, and marks the container's
/// launches; false when the region has no HAMi part to keep (vgpu's layout
/// 1.x: no monitor reads it, none blocks it) or cannot be touched now.
pub fn observe(attach: &Attach) -> bool {
    if !attach.intact() {
        return false;
    }
    let Some(h) = attach.region.hami() else {
        gate::publish(false);
        return false;
    };
    if !h.blocked() {
        BLOCKED_SINCE.store(0, Ordering::Release);
    }
    gate::publish(h.blocked() && honoured(attach, crate::clock::monotonic_ns()));
    if gate::take_launched() {
        h.mark_launch(crate::clock::unix_us() / 1_000_000);
    }
    true
}

/// Whether a block seen now is still honoured (the region says blocked):
/// a block outlives neither [`BLOCK_MAX_S`] nor, while the container looks
/// alone on every GPU it uses, [`BLOCK_ALONE_S`]. A lifted block stays
/// lifted until the monitor writes 0 and blocks again.
fn honoured(attach: &Attach, now: u64) -> bool {
    let since =
        match BLOCKED_SINCE.compare_exchange(0, now.max(1), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => now,
            Err(v) => v,
        };
    let alone = crate::process::devices_in_use().all(|d| attach.region.device(d).alone(now))
        && crate::process::devices_in_use().next().is_some();
    decide(now.saturating_sub(since), alone)
}

/// The pure part of [`honoured`]: a block seen for `for_ns`.
fn decide(for_ns: u64, alone: bool) -> bool {
    let bound = if alone { BLOCK_ALONE_S } else { BLOCK_MAX_S };
    if for_ns < bound * 1_000_000_000 {
        return true;
    }
    crate::warn_once!(
        "a node monitor has blocked this container's launches (recent_kernel < 0) for over {bound} s{}: the block is lifted for this process (a dead monitor would freeze the container)",
        if alone {
            " while no other container's process uses its GPU"
        } else {
            ""
        }
    );
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_honoured_for_a_bounded_time_only() {
        let s = 1_000_000_000;
        assert!(decide(0, true));
        assert!(decide((BLOCK_ALONE_S - 1) * s, true));
        assert!(!decide(BLOCK_ALONE_S * s, true));
        assert!(decide(BLOCK_ALONE_S * s, false));
        assert!(!decide(BLOCK_MAX_S * s, false));
    }
}

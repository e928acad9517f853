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
//! `recent_kernel` for the gate, marks the container's launches
//! (`recent_kernel`, `last_kernel_time`), and runs the writer when this
//! process holds its lease. Nothing here runs on the allocation or launch
//! path but the gate.
#![forbid(unsafe_code)]

mod gate;
mod writer;

pub use gate::{launching, reset_in_child};
pub use writer::Writer;

use crate::attach::Attach;

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
    gate::publish(h.blocked());
    if gate::take_launched() {
        h.mark_launch(crate::clock::unix_us() / 1_000_000);
    }
    true
}

//! What this process holds, counted again in a new slot: after a slot was
//! reclaimed from it, or in a private copy of a region that shrank.
#![forbid(unsafe_code)]

use vgpu_shm::{Kind, Region, SlotIndex};

use super::{overhead, tracker};
use crate::process;

/// Counts again, in slot `slot` of `region`, what this process holds: every
/// tracked allocation, and a provisional context on each device it uses
/// (re-measured by the watcher moments later). For a new slot, or a private
/// copy of the region.
pub fn restore_usage(region: &Region, slot: SlotIndex) {
    for (dev, kind, bytes) in tracker::totals() {
        region.add_usage(slot, dev, kind, bytes);
    }
    for dev in process::devices_in_use() {
        region.set_usage(slot, dev, Kind::Context, overhead::PROVISIONAL);
    }
}

//! Frees. [`Freeing`] brackets the driver's free: what it releases counts
//! as freed from before the call (NVML stops seeing the bytes once the
//! driver frees them), as allocated again if the call fails, and the call
//! counts as inside the driver throughout (an overhead measurement is
//! exact only without one). [`release`] gives the slot back the bytes.
#![forbid(unsafe_code)]

use vgpu_shm::EntryIndex;

use super::overhead;
use super::tracker::{self, Key, Tracked};
use crate::attach::Attach;
use crate::cuda::sys::CUresult;

/// A free the driver is doing, of `held` bytes per device entry.
#[must_use]
pub struct Freeing<'a> {
    held: &'a [(EntryIndex, u64)],
    freed: bool,
}

impl<'a> Freeing<'a> {
    /// The driver is about to free `held`.
    pub fn begin(held: &'a [(EntryIndex, u64)]) -> Freeing<'a> {
        for &(dev, bytes) in held {
            overhead::call_started(dev);
            overhead::freeing(dev, bytes);
        }
        Freeing { held, freed: false }
    }

    /// What the driver answered.
    pub fn done(&mut self, rc: CUresult) {
        self.freed = rc.is_ok();
    }
}

impl Drop for Freeing<'_> {
    /// A free that failed (or never said) still holds its bytes.
    fn drop(&mut self) {
        for &(dev, bytes) in self.held {
            if !self.freed {
                overhead::allocated(dev, bytes);
            }
            overhead::call_finished(dev);
        }
    }
}

/// Frees `key` through `free`, then releases what it held from `attach`'s
/// slot. A free of something never counted goes to the driver untouched.
pub fn uncounted(attach: Option<&Attach>, key: Key, free: impl FnOnce() -> CUresult) -> CUresult {
    // Taken out first: once the driver frees it, another thread may be
    // handed the same address and insert its own entry.
    let Some(t) = tracker::remove(key) else {
        return free();
    };
    let held = [(t.dev, t.bytes)];
    let mut freeing = Freeing::begin(&held);
    let rc = free();
    freeing.done(rc);
    if rc.is_ok() {
        release(attach, t);
    } else {
        tracker::insert(key, t);
    }
    rc
}

/// Releases what a tracked allocation held from `attach`'s slot (the
/// driver has freed it).
pub fn release(attach: Option<&Attach>, t: Tracked) {
    if let Some(attach) = attach
        && attach.intact()
        && let Some(slot) = attach.slot()
    {
        attach.region.unreserve(slot, t.dev, t.kind, t.bytes);
    }
}

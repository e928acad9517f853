//! What the quota keeps per device entry in this process: the counters an
//! overhead measurement brackets NVML's reading with, the allocations in
//! flight, and the primary context's reservation. One of these is part of
//! each `process::DeviceState`, reset with it after `fork`.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use vgpu_shm::layout::NUM_KINDS;

/// The quota's state for one device entry.
pub struct DeviceQuota {
    /// Bytes of allocations that completed, and of frees that started,
    /// ever (monotonic; a failed free adds its bytes back on the allocated
    /// side). A measurement brackets NVML's reading with them, so an
    /// allocation or free racing with it can only make the overhead look
    /// larger, never smaller.
    pub(super) allocated: AtomicU64,
    pub(super) freed: AtomicU64,
    /// Allocation and free calls that entered the driver, and that left
    /// it. A measurement is exact only when no call was inside the driver
    /// while NVML looked: its bracket above is then tight.
    pub(super) started: AtomicU64,
    pub(super) finished: AtomicU64,
    /// Whether the estimate is a measurement (not the provisional figure).
    pub(super) measured: AtomicBool,
    /// When the estimate last rose (CLOCK_MONOTONIC ns).
    pub(super) raised_ns: AtomicU64,
    /// When the last synchronous measurement started (CLOCK_MONOTONIC ns).
    pub(super) last_ns: AtomicU64,
    /// Bytes reserved for allocations inside the driver now, per kind: not
    /// in the tracker yet, but in the slot.
    pub(super) in_flight: [AtomicU64; NUM_KINDS],
    /// This process's primary context reservation (`context.rs`).
    pub(super) primary: AtomicU8,
}

impl DeviceQuota {
    /// Nothing counted.
    pub const fn new() -> DeviceQuota {
        DeviceQuota {
            allocated: AtomicU64::new(0),
            freed: AtomicU64::new(0),
            started: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            measured: AtomicBool::new(false),
            raised_ns: AtomicU64::new(0),
            last_ns: AtomicU64::new(0),
            in_flight: [const { AtomicU64::new(0) }; NUM_KINDS],
            primary: AtomicU8::new(0),
        }
    }

    /// Back to nothing counted: in a forked child, whose device memory is
    /// not the parent's (and whose parent threads inside the driver at the
    /// fork never finish here).
    pub fn reset(&self) {
        for c in [
            &self.allocated,
            &self.freed,
            &self.started,
            &self.finished,
            &self.raised_ns,
            &self.last_ns,
        ]
        .into_iter()
        .chain(&self.in_flight)
        {
            c.store(0, Ordering::Release);
        }
        self.measured.store(false, Ordering::Release);
        self.primary.store(0, Ordering::Release);
    }
}

impl Default for DeviceQuota {
    fn default() -> DeviceQuota {
        DeviceQuota::new()
    }
}

//! What a node monitor writes, and what the container marks for it:
//! HAMi's priority time-sharing and its switch for the SM limit, as
//! HAMi-core implements them.
//!
//! - A launch marks `recent_kernel` 2 ("active"); the monitor decrements
//!   it every 5 s, so a container that stops launching goes idle.
//! - The monitor writes `recent_kernel = -1` into a container whose
//!   priority is lower than that of an active container on one of its
//!   GPUs: its launches wait until the monitor writes 0 again. A mark
//!   never overwrites -1.
//! - The monitor writes `utilization_switch` 0 when nobody else of the
//!   same or a higher priority is active on the container's GPUs, 1 when
//!   the GPU is shared: under `GPU_CORE_UTILIZATION_POLICY=default` the SM
//!   limit applies only while it is 1 (`force` applies it always,
//!   `disable` never). A region starts at 1.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use super::layout::HamiRegion;
use crate::index::EntryIndex;
use crate::{CorePolicy, Region, lease};

/// `recent_kernel` a launch leaves behind.
pub const ACTIVE: i32 = 2;

/// A block (`recent_kernel` < 0) is honoured this long at most while the
/// container looks alone on its GPUs (no process of another container
/// there, so no higher-priority one is alive: the monitor's own
/// condition for the block no longer holds): a monitor that died would
/// leave the container frozen (issue 26). Three of HAMi's 5 s rounds.
pub const BLOCK_ALONE_S: u64 = 15;
/// And this long at most in any case: a monitor lifts its blocks within a
/// round once the higher-priority process stops.
pub const BLOCK_MAX_S: u64 = 600;

impl HamiRegion {
    /// Whether a monitor blocks the container's launches
    /// (`recent_kernel` negative).
    pub fn blocked(&self) -> bool {
        self.recent_kernel.load(Ordering::Acquire) < 0
    }

    /// Marks that the container launched at `now_unix_s`: `recent_kernel`
    /// back to 2 unless a monitor blocks it, and `last_kernel_time`.
    pub fn mark_launch(&self, now_unix_s: u64) {
        let _ = self
            .recent_kernel
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                (v >= 0 && v != ACTIVE).then_some(ACTIVE)
            });
        self.last_kernel_time
            .fetch_max(now_unix_s, Ordering::AcqRel);
    }

    /// Whether a monitor lets the SM limit apply (`utilization_switch`
    /// not 0).
    pub fn switch_on(&self) -> bool {
        self.utilization_switch.load(Ordering::Acquire) != 0
    }

    /// Sets `priority` (`CUDA_TASK_PRIORITY`: 0 high, 1 normal).
    pub fn set_priority(&self, priority: i32) {
        self.priority.store(priority, Ordering::Release);
    }
}

impl Region {
    /// Whether an SM limit is in force on device entry `dev`: one is set,
    /// the policy is not `disable`, and under `default` a monitor has not
    /// switched it off (a region without a HAMi part has no switch).
    pub fn enforces_sm_limit(&self, dev: EntryIndex) -> bool {
        self.device(dev).enforces_sm_limit() && self.sm_control_on(dev)
    }

    /// Whether the policy lets the SM limits of device entry `dev` apply:
    /// not `disable`, and under `default` a monitor has not switched them
    /// off.
    pub fn sm_control_on(&self, dev: EntryIndex) -> bool {
        match self.device(dev).limits().policy {
            CorePolicy::Disable => false,
            CorePolicy::Force => true,
            CorePolicy::Default => self.hami().is_none_or(HamiRegion::switch_on),
        }
    }

    /// Takes or renews the job of keeping the HAMi part true
    /// ([`Region::mirror_hami`]) for process `me` (see `lease.rs`).
    pub fn elect_hami_writer(
        &self,
        me: u32,
        now_s: u64,
        lease_s: u64,
        alive: impl Fn(u32) -> bool,
    ) -> bool {
        lease::elect(&self.header().hami_writer, me, now_s, lease_s, alive)
    }

    /// The pid keeping the HAMi part true (0: none).
    pub fn hami_writer(&self) -> u32 {
        lease::holder(&self.header().hami_writer)
    }
}

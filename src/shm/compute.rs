//! The compute fields of a device entry, as the limiter uses them: the
//! bucket's schedule (a GCRA's theoretical arrival time), the controller's
//! refill scale, the waits that tell it the limit binds, the utilisation
//! shown to monitors, and the elected leader's lease.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use crate::layout::{DeviceEntry, TURN_ALONE_NS, TURN_PACED_NS, TURN_SHARED_NS, TURNS_PAUSED};

use crate::lease;

impl DeviceEntry {
    /// The SM limit in percent, 0 for none.
    pub fn sm_limit(&self) -> u32 {
        self.sm_limit.load(Ordering::Relaxed)
    }

    /// The share the bucket holds the container to (percent, 0: none):
    /// its SM limit, or, without one, the rest it takes beside limited
    /// containers ([`Self::rest_percent`]).
    pub fn sm_percent(&self) -> u32 {
        match self.sm_limit() {
            0 => self.rest_percent(),
            limit => limit,
        }
    }

    /// The share (percent, at most 100) a container without an SM limit
    /// takes beside busy limited ones; 0 while it runs free.
    pub fn rest_percent(&self) -> u32 {
        // (Clamped: the region's values may be anyone's.)
        self.rest_percent.load(Ordering::Relaxed).min(100) as u32
    }

    /// Sets the rest the container takes (0: it runs free).
    pub fn set_rest_percent(&self, percent: u32) {
        self.rest_percent
            .store(u64::from(percent.min(100)), Ordering::Relaxed);
    }

    /// The bucket's schedule: the CLOCK_MONOTONIC time (ns) by which the
    /// device's admitted work is done at the limit.
    pub fn schedule_ns(&self) -> u64 {
        self.tat_ns.load(Ordering::Acquire)
    }

    /// Moves the schedule from `current` to `new`; `Err` holds what was
    /// found instead (another process moved it, or a spurious failure:
    /// call it in a loop).
    pub fn move_schedule(&self, current: u64, new: u64) -> Result<(), u64> {
        self.tat_ns
            .compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
    }

    /// Where the container's turns on the device begin (a CLOCK_MONOTONIC
    /// time; its windows open at whole periods after it), 0 while none is
    /// chosen.
    pub fn turn_anchor(&self) -> u64 {
        self.turn_anchor_ns.load(Ordering::Acquire)
    }

    /// The turns' anchor while they are in force: 0 when none is chosen
    /// or while they are paused ([`TURNS_PAUSED`]).
    pub fn turns_in_force(&self) -> u64 {
        match self.turn_flag(TURNS_PAUSED) {
            false => self.turn_anchor(),
            true => 0,
        }
    }

    /// Whether `flag` ([`TURNS_PAUSED`]) is set.
    pub fn turn_flag(&self, flag: u64) -> bool {
        self.turn_flags.load(Ordering::Relaxed) & flag != 0
    }

    /// Sets or clears `flag`.
    pub fn set_turn_flag(&self, flag: u64, on: bool) {
        if self.turn_flag(flag) != on {
            if on {
                self.turn_flags.fetch_or(flag, Ordering::Relaxed);
            } else {
                self.turn_flags.fetch_and(!flag, Ordering::Relaxed);
            }
        }
    }

    /// Chooses `anchor` unless one is chosen already; the one in force.
    pub fn choose_turn_anchor(&self, anchor: u64) -> u64 {
        match self.turn_anchor_ns.compare_exchange(
            0,
            anchor.max(1),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => anchor.max(1),
            Err(seen) => seen,
        }
    }

    /// Moves the turns' anchor from `from` to `to` at `now`; false when
    /// another process of the container moved it first.
    pub fn move_turn(&self, from: u64, to: u64, now: u64) -> bool {
        let moved = self
            .turn_anchor_ns
            .compare_exchange(from, to.max(1), Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if moved {
            self.turn_moved_ns.store(now, Ordering::Release);
        }
        moved
    }

    /// When the turns' anchor last moved (CLOCK_MONOTONIC ns, 0: never).
    pub fn turn_moved_ns(&self) -> u64 {
        self.turn_moved_ns.load(Ordering::Acquire)
    }

    /// GPU time the container leaves unspent of each period's share while
    /// its windows run into the next one's (ns).
    pub fn turn_cut_ns(&self) -> u64 {
        self.turn_cut_ns.load(Ordering::Relaxed)
    }

    /// Sets what the container leaves unspent of each period's share.
    pub fn set_turn_cut_ns(&self, ns: u64) {
        self.turn_cut_ns.store(ns, Ordering::Relaxed);
    }

    /// How full the container's launches keep the GPU in its window, ×1000
    /// (0: not measured yet; `limiter/turns.rs`).
    pub fn turn_fill_milli(&self) -> u64 {
        self.turn_fill_milli.load(Ordering::Relaxed)
    }

    /// Notes that a probe of the container ran beside another context at
    /// `now` (CLOCK_MONOTONIC ns).
    pub fn note_turn_shared(&self, now: u64) {
        // The latest note stands; one from the future (garbage) is
        // replaced, or no real note could ever set the word again.
        let ahead = now.saturating_add(ahead_ns(TURN_SHARED_NS));
        let _ = self
            .turn_shared_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |at| {
                (at < now || at > ahead).then_some(now)
            });
    }

    /// Whether a probe of the container ran beside another context in the
    /// [`TURN_SHARED_NS`] before `now`.
    pub fn turn_shared(&self, now: u64) -> bool {
        recent(&self.turn_shared_ns, now, TURN_SHARED_NS)
    }

    /// Notes what the leader found at `now`: no process of another
    /// container on the device (`alone`), or some, or it could not tell.
    pub fn note_alone(&self, alone: bool, now: u64) {
        stamp(&self.alone_ns, alone, now);
    }

    /// Notes what the leader found at `now`: room on the device for the
    /// container to pace its share beside others (`paced`), or not.
    pub fn note_paced(&self, paced: bool, now: u64) {
        stamp(&self.paced_ns, paced, now);
    }

    /// Adds a synchronisation that waited `ns`.
    pub fn add_sync_wait_ns(&self, ns: u64) {
        self.sync_wait_ns.fetch_add(ns, Ordering::Relaxed);
        self.syncs.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes what the leader found at `now`: only containers taking the
    /// rest beside this one on the device (`beside`), or not.
    pub fn note_rest_beside(&self, beside: bool, now: u64) {
        stamp(&self.rest_beside_ns, beside, now);
    }

    /// Whether the leader found only containers taking the rest beside
    /// this one in the [`TURN_PACED_NS`] before `now`.
    pub fn rest_beside(&self, now: u64) -> bool {
        recent(&self.rest_beside_ns, now, TURN_PACED_NS)
    }

    /// Notes what the leader found at `now`: a busy container with an SM
    /// limit beside this one, itself limited, on the device (`beside`), or
    /// not.
    pub fn note_limited_beside(&self, beside: bool, now: u64) {
        stamp(&self.limited_beside_ns, beside, now);
    }

    /// Whether the leader found a busy container with an SM limit beside
    /// this one in the [`TURN_PACED_NS`] before `now`.
    pub fn limited_beside(&self, now: u64) -> bool {
        recent(&self.limited_beside_ns, now, TURN_PACED_NS)
    }

    /// The period (ns) of the container's turns on the device as its
    /// leader chose it (0: the configured one). Anyone who maps the
    /// region can write it: the limiter bounds what it uses.
    pub fn turn_period_ns(&self) -> u64 {
        self.turn_period_ns.load(Ordering::Relaxed)
    }

    /// Sets the period of the container's turns on the device (0: the
    /// configured one).
    pub fn set_turn_period_ns(&self, ns: u64) {
        self.turn_period_ns.store(ns, Ordering::Relaxed);
    }

    /// Synchronisations made under an SM limit, ever.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Nanoseconds spent waiting in synchronisations, ever.
    pub fn sync_wait_ns(&self) -> u64 {
        self.sync_wait_ns.load(Ordering::Relaxed)
    }

    /// Whether the leader found room to pace beside others in the
    /// [`TURN_PACED_NS`] before `now`.
    pub fn paced(&self, now: u64) -> bool {
        recent(&self.paced_ns, now, TURN_PACED_NS)
    }

    /// Whether the leader found the container alone on the device in the
    /// [`TURN_ALONE_NS`] before `now`.
    pub fn alone(&self, now: u64) -> bool {
        recent(&self.alone_ns, now, TURN_ALONE_NS)
    }

    /// Sets how full the container's launches keep the GPU in its window.
    pub fn set_turn_fill_milli(&self, fill_milli: u64) {
        self.turn_fill_milli.store(fill_milli, Ordering::Relaxed);
    }

    /// The controller's multiplier on the refill rate, ×1000 (a stored 0
    /// reads as 1000).
    pub fn rate_scale_milli(&self) -> u32 {
        match self.rate_scale_milli.load(Ordering::Relaxed) {
            0 => 1000,
            s => s,
        }
    }

    /// Sets the refill rate's multiplier, ×1000.
    pub fn set_rate_scale_milli(&self, scale_milli: u32) {
        self.rate_scale_milli.store(scale_milli, Ordering::Relaxed);
    }

    /// Adds `ns` of GPU time the bucket admitted.
    pub fn add_admitted_ns(&self, ns: u64) {
        self.admitted_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Adds `ns` of GPU time admitted launches typically hold.
    pub fn add_held_ns(&self, ns: u64) {
        self.held_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// GPU time admitted launches typically hold, ever (ns; 0 where only
    /// libraries of layout 2.2 and older admitted).
    pub fn held_ns(&self) -> u64 {
        self.held_ns.load(Ordering::Relaxed)
    }

    /// GPU time the bucket admitted, ever (ns).
    pub fn admitted_ns(&self) -> u64 {
        self.admitted_ns.load(Ordering::Relaxed)
    }

    /// Counts a launch that had to wait for the bucket.
    pub fn count_wait(&self) {
        self.waits.fetch_add(1, Ordering::Relaxed);
    }

    /// Launches that had to wait for the bucket, ever.
    pub fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    /// Adds `ns` to the time launches spent waiting for the bucket.
    pub fn add_wait_ns(&self, ns: u64) {
        self.wait_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Nanoseconds launches spent waiting for the bucket, ever.
    pub fn wait_ns(&self) -> u64 {
        self.wait_ns.load(Ordering::Relaxed)
    }

    /// Counts a request refused with `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn count_oom_denial(&self) {
        self.oom_denials.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests refused with `CUDA_ERROR_OUT_OF_MEMORY`, ever.
    pub fn oom_denials(&self) -> u64 {
        self.oom_denials.load(Ordering::Relaxed)
    }

    /// The container's utilisation of the device as last shown, ×1000.
    pub fn util_milli(&self) -> u32 {
        self.util_milli.load(Ordering::Relaxed)
    }

    /// Shows the container's utilisation of the device, ×1000.
    pub fn set_util_milli(&self, util_milli: u32) {
        self.util_milli.store(util_milli, Ordering::Relaxed);
    }

    /// The pid of the process that leads the device's bucket (0: none).
    pub fn leader_pid(&self) -> u32 {
        lease::holder(&self.leader)
    }

    /// Takes or renews the lead of the device for process `me` at `now_s`
    /// (monotonic seconds); true while `me` holds it. A lead whose last
    /// heartbeat is more than `lease_s` old, or whose holder `alive` says
    /// is gone, is taken over.
    pub fn elect_leader(
        &self,
        me: u32,
        now_s: u64,
        lease_s: u64,
        alive: impl Fn(u32) -> bool,
    ) -> bool {
        lease::elect(&self.leader, me, now_s, lease_s, alive)
    }
}

/// Stamps `word` with `now` where `on` (never 0, which reads "not"), else
/// clears it: the leader's word on `alone_ns`, `paced_ns`,
/// `rest_beside_ns` and `limited_beside_ns`.
fn stamp(word: &std::sync::atomic::AtomicU64, on: bool, now: u64) {
    word.store(if on { now.max(1) } else { 0 }, Ordering::Relaxed);
}

/// How far ahead of a reader's `now` a stamp with lifetime `bound` may be
/// and still count: readers take `now` before NVML calls or a poll of
/// many windows, and a process may stamp meanwhile.
fn ahead_ns(bound: u64) -> u64 {
    bound / 4
}

/// Whether `word` was stamped less than `bound` before `now`. A stamp
/// further in the future (another boot's clock, or a writer's garbage) is
/// not recent: it would never expire.
fn recent(word: &std::sync::atomic::AtomicU64, now: u64, bound: u64) -> bool {
    let at = word.load(Ordering::Relaxed);
    at != 0 && at <= now.saturating_add(ahead_ns(bound)) && now.saturating_sub(at) < bound
}

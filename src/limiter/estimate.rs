//! What a launch costs, in GPU nanoseconds: per kernel shape (function,
//! grid, block) and per executable graph, learned from event timing and
//! kept in a lock-free table of this process.
//!
//! A cost is the least of the shape's last few timings. When another
//! container's context shares the GPU, the two time-slice (about 2.5 ms
//! each on an H200), and a timing that straddles a switch includes the
//! other context's slice: 3.4 ms for a 1 ms kernel (docs/benchmarks.md,
//! run 14). Such a timing only ever adds time, so the least of recent
//! ones is the kernel's own.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The cost of a launch nobody has timed yet. The first launch of a shape
/// is timed, and the second waits for that measurement, so at most one
/// launch per shape runs on this guess.
pub const DEFAULT_NS: u64 = 200_000;
/// How often a known shape is re-timed.
pub const RESAMPLE_NS: u64 = 20_000_000;
/// An event pair around a launch into an idle stream also times the
/// GPU's launch latency, which costs no SM time: 57.5 us measured for a
/// kernel that runs 52.7 us back to back on an H200. (Behind other work
/// in its stream the start event fires as the kernel starts: no latency.)
/// The latency is taken as the shortest idle-stream timing seen in this
/// process, at most this much.
pub const MAX_LATENCY_NS: u64 = 8_000;
/// The least a timed launch is charged.
pub const MIN_COST_NS: u64 = 500;

static LATENCY_NS: AtomicU64 = AtomicU64::new(MAX_LATENCY_NS);

/// GPU time of a launch whose events were `elapsed_ns` apart; `idle`:
/// its stream had nothing queued when the start event was recorded.
pub fn cost_of_timing(elapsed_ns: u64, idle: bool) -> u64 {
    if !idle {
        return elapsed_ns.max(MIN_COST_NS);
    }
    let latency = LATENCY_NS
        .fetch_min(elapsed_ns, Ordering::Relaxed)
        .min(elapsed_ns);
    elapsed_ns.saturating_sub(latency).max(MIN_COST_NS)
}

const SLOTS: usize = 4096;
const PROBES: usize = 16;

/// Timings kept per shape. At one timing per `RESAMPLE_NS`, a cost that
/// really grew is followed within this many samples.
const RECENT: usize = 8;

pub struct Slot {
    key: AtomicU64,
    cost_ns: AtomicU64,
    last_sample_ns: AtomicU64,
    /// A timing of this shape is in flight.
    pub pending: AtomicBool,
    /// The last `RECENT` costs timed (0: none yet), written round robin.
    recent: [AtomicU64; RECENT],
    next: AtomicU64,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            key: AtomicU64::new(0),
            cost_ns: AtomicU64::new(0),
            last_sample_ns: AtomicU64::new(0),
            pending: AtomicBool::new(false),
            recent: [const { AtomicU64::new(0) }; RECENT],
            next: AtomicU64::new(0),
        }
    }

    /// The learned cost, 0 while unknown.
    pub fn cost_ns(&self) -> u64 {
        self.cost_ns.load(Ordering::Relaxed)
    }

    /// Folds in one timing (`idle`: see [`cost_of_timing`]).
    pub fn record_timing(&self, elapsed_ns: u64, idle: bool) {
        self.record(cost_of_timing(elapsed_ns, idle));
        log::trace!(
            "timed {elapsed_ns} ns (idle stream: {idle}): cost {} ns",
            self.cost_ns()
        );
    }

    /// Folds in one cost: the shape now costs the least of its recent ones.
    /// (One timing is in flight per shape, so records do not race.)
    pub fn record(&self, ns: u64) {
        let i = self.next.fetch_add(1, Ordering::Relaxed) as usize % RECENT;
        self.recent[i].store(ns.max(1), Ordering::Relaxed);
        let least = self
            .recent
            .iter()
            .map(|r| r.load(Ordering::Relaxed))
            .filter(|&c| c != 0)
            .min()
            .unwrap_or(ns.max(1));
        self.cost_ns.store(least, Ordering::Relaxed);
    }

    /// Sets a first estimate (a graph's, from its kernel nodes) if there
    /// is none.
    pub fn seed(&self, ns: u64) {
        let _ = self
            .cost_ns
            .compare_exchange(0, ns.max(1), Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Whether this launch should be timed; claims the sample if so.
    pub fn claim_sample(&self, now: u64) -> bool {
        if self.pending.load(Ordering::Acquire) {
            return false;
        }
        let last = self.last_sample_ns.load(Ordering::Relaxed);
        let due = self.cost_ns() == 0 || now.saturating_sub(last) >= RESAMPLE_NS;
        due && self
            .last_sample_ns
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
            && !self.pending.swap(true, Ordering::AcqRel)
    }
}

static TABLE: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
/// Shared by every shape once the table is full.
static OVERFLOW: Slot = Slot::new();

/// No timing is in flight (a forked child's: its parent's never finish).
pub fn clear_pending() {
    for s in TABLE.iter().chain([&OVERFLOW]) {
        s.pending.store(false, Ordering::Release);
    }
}

/// A key for a kernel shape or a graph (never 0).
pub fn key(parts: &[u64]) -> u64 {
    // FNV-1a over the words, then a final mix.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &p in parts {
        h = (h ^ p).wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 29;
    h.max(1)
}

pub fn kernel_key(func: usize, grid: [u32; 3], block: [u32; 3]) -> u64 {
    let g = u64::from(grid[0]) | u64::from(grid[1]) << 21 | u64::from(grid[2]) << 42;
    let b = u64::from(block[0]) | u64::from(block[1]) << 21 | u64::from(block[2]) << 42;
    key(&[func as u64, g, b])
}

pub fn graph_key(exec: usize) -> u64 {
    key(&[exec as u64, 0x6772_6170_6800])
}

/// The slot for `key`, claimed on first use.
pub fn slot(key: u64) -> &'static Slot {
    let start = (key as usize) % SLOTS;
    for i in 0..PROBES {
        let s = &TABLE[(start + i) % SLOTS];
        // A plain load first: the launch path finds its shape without a
        // locked instruction.
        match s.key.load(Ordering::Acquire) {
            k if k == key => return s,
            0 => match s
                .key
                .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return s,
                Err(k) if k == key => return s,
                Err(_) => {}
            },
            _ => {}
        }
    }
    &OVERFLOW
}

/// The slot for `key` if it exists, without claiming one.
pub fn find(key: u64) -> Option<&'static Slot> {
    let start = (key as usize) % SLOTS;
    (0..PROBES)
        .map(|i| &TABLE[(start + i) % SLOTS])
        .find(|s| s.key.load(Ordering::Acquire) == key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_get_their_own_slots() {
        let a = slot(kernel_key(0x1000, [132, 1, 1], [128, 1, 1]));
        let b = slot(kernel_key(0x1000, [264, 1, 1], [128, 1, 1]));
        assert!(!std::ptr::eq(a, b));
        assert!(std::ptr::eq(
            a,
            slot(kernel_key(0x1000, [132, 1, 1], [128, 1, 1]))
        ));
        assert!(find(kernel_key(0x2000, [1, 1, 1], [1, 1, 1])).is_none());
    }

    #[test]
    fn launch_latency_is_not_charged() {
        // The first timings bound the latency by MAX_LATENCY_NS...
        assert_eq!(cost_of_timing(57_000, true), 57_000 - MAX_LATENCY_NS);
        // ...behind queued work there is none to take off...
        assert_eq!(cost_of_timing(52_700, false), 52_700);
        assert_eq!(cost_of_timing(300, false), MIN_COST_NS);
        // ...an empty kernel's timing on an idle stream is mostly latency...
        assert_eq!(cost_of_timing(5_000, true), MIN_COST_NS);
        // ...which later idle-stream timings do not pay.
        assert_eq!(cost_of_timing(57_000, true), 52_000);
        assert_eq!(cost_of_timing(10_000_000, true), 9_995_000);
    }

    #[test]
    fn a_cost_is_the_least_recent_timing_and_seeds_do_not_override() {
        let s = slot(key(&[42]));
        assert!(s.claim_sample(1));
        assert!(!s.claim_sample(2), "one timing in flight per shape");
        s.pending.store(false, Ordering::Release);
        s.seed(500);
        assert_eq!(s.cost_ns(), 500);
        s.record(1000);
        assert_eq!(s.cost_ns(), 1000, "a timing replaces the seed");
        // Timings that straddle another context's time slice only add.
        s.record(3400);
        s.record(990);
        s.record(3400);
        assert_eq!(s.cost_ns(), 990);
        s.seed(7);
        assert_eq!(s.cost_ns(), 990);
        // A cost that really grew is followed once the window has passed.
        for _ in 0..RECENT {
            s.record(2000);
        }
        assert_eq!(s.cost_ns(), 2000);
        assert!(
            !s.claim_sample(3),
            "known shapes are re-timed only every RESAMPLE_NS"
        );
        assert!(s.claim_sample(3 + RESAMPLE_NS));
    }
}

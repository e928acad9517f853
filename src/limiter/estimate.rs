//! What a launch costs, in GPU nanoseconds: per kernel shape (function,
//! grid, block) and per executable graph, learned from event timing and
//! kept in a lock-free table of this process.
//!
//! A cost is the least of the shape's last few timings. When another
//! container's context shares the GPU, the two time-slice (about 2.5 ms
//! each on an H200), and a timing that straddles a switch includes the
//! other context's slice: 3.4 ms for a 1 ms kernel (docs/benchmarks.md,
//! run 14). Such a timing only ever adds time, so the least of recent
//! ones is the kernel's own; when all the newest straddled one, the least
//! of a longer memory stands in. (The mean of the recent timings near the
//! least, tried in run 59, followed a power-bound GEMM's wandering clock
//! better, but on the simulator it left a 40 % container of four that
//! fill the period stuck at 0.31 in one run of three.)
//!
//! A timing whose start event waited for queued work in its stream is the
//! kernel's whole occupancy. One whose start event fired before the launch
//! call returned (an idle stream, or one the GPU drained meanwhile, as a
//! host-bound stream of tiny kernels does) may also hold the GPU's launch
//! latency and the host's submission time, but need not: PyTorch's 0.05 ms kernels timed
//! 52.1 us at least on an idle stream and 52.2 us behind work (runs
//! 17-18), and taking a guessed 8 us off undercharged them by 15 % (0.38
//! for a 30 % tenant), while a spin kernel timed 57.5 and 52.7 us. So each
//! shape learns its own latency, its least idle timing less its least
//! timing behind work; until it has both, the process-wide bound serves.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

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
/// Due samples of a known shape passed over in a row because its stream
/// was idle ([`Slot::pass_over_idle`]), at most.
pub const MAX_IDLE_SKIPS: u32 = 4;
/// Marks a timing into an idle stream in a shape's recent timings.
const IDLE_BIT: u64 = 1 << 63;

static LATENCY_NS: AtomicU64 = AtomicU64::new(MAX_LATENCY_NS);

const SLOTS: usize = 4096;
const PROBES: usize = 16;

/// Timings kept per shape. At one timing per `RESAMPLE_NS`, a cost that
/// really grew is followed within this many samples. Beside a container
/// that takes no turns, most timings of a 1.6 ms GEMM straddle one of its
/// slices; with 8 kept, all 8 did in one sample of 6, and the GEMM was
/// charged 4.2 ms (docs/benchmarks.md, run 57). 32 in a row is rare.
const RECENT: usize = 32;
/// A cost is the least of this many newest timings (near the least of
/// all [`RECENT`]): a GEMM's clock wanders, and the least of 32 was 8 %
/// under its typical time, where that of 8 was 5 % (runs 57 and 60).
const NEWEST: usize = 8;

pub struct Slot {
    key: AtomicU64,
    cost_ns: AtomicU64,
    /// The shape's typical time ([`typical_of`]), 0 while unknown.
    typical_ns: AtomicU64,
    last_sample_ns: AtomicU64,
    /// A timing of this shape is in flight.
    pending: AtomicBool,
    /// The last `RECENT` timings (0: none yet; [`IDLE_BIT`] marks one
    /// into an idle stream), written round robin.
    recent: [AtomicU64; RECENT],
    next: AtomicU64,
    /// The least timings ever seen into an idle stream and behind queued
    /// work (u64::MAX: none yet): their difference is the launch latency.
    least_idle_ns: AtomicU64,
    least_busy_ns: AtomicU64,
    /// Due samples passed over in a row because the stream was idle.
    idle_skips: AtomicU32,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            key: AtomicU64::new(0),
            cost_ns: AtomicU64::new(0),
            typical_ns: AtomicU64::new(0),
            last_sample_ns: AtomicU64::new(0),
            pending: AtomicBool::new(false),
            recent: [const { AtomicU64::new(0) }; RECENT],
            next: AtomicU64::new(0),
            least_idle_ns: AtomicU64::new(u64::MAX),
            least_busy_ns: AtomicU64::new(u64::MAX),
            idle_skips: AtomicU32::new(0),
        }
    }

    /// The learned cost, 0 while unknown.
    pub fn cost_ns(&self) -> u64 {
        self.cost_ns.load(Ordering::Relaxed)
    }

    /// The GPU time a launch of this shape typically holds: at least its
    /// cost, at most an eighth more ([`typical_of`]).
    pub fn typical_ns(&self) -> u64 {
        let cost = self.cost_ns();
        self.typical_ns
            .load(Ordering::Relaxed)
            .clamp(cost, cost.saturating_add(cost / 8))
    }

    /// The GPU time a `lease` bought for launches of this shape, charged
    /// `cost` each, typically holds: the lease at the typical time, at
    /// most an eighth more (the cost may have been re-learnt meanwhile).
    pub fn held_ns(&self, lease: u64, cost: u64) -> u64 {
        let most = lease.saturating_add(lease / 8);
        match self.typical_ns() {
            0 => lease,
            t => lease
                .checked_mul(t)
                .map_or(lease, |x| x / cost.max(1))
                .min(most),
        }
    }

    /// Folds in one timing (`idle`: its stream had nothing queued). The
    /// shape then costs the least of its newest timings ([`cost_of`]), an
    /// idle-stream one less the launch latency ([`Slot::latency_ns`]).
    /// (One timing is in flight per shape, so records do not race.)
    pub fn record_timing(&self, elapsed_ns: u64, idle: bool) {
        let elapsed_ns = elapsed_ns.clamp(1, IDLE_BIT - 1);
        if idle {
            LATENCY_NS.fetch_min(elapsed_ns, Ordering::Relaxed);
            self.least_idle_ns.fetch_min(elapsed_ns, Ordering::Relaxed);
        } else {
            self.least_busy_ns.fetch_min(elapsed_ns, Ordering::Relaxed);
        }
        let mark = if idle { IDLE_BIT } else { 0 };
        let i = self.next.fetch_add(1, Ordering::Relaxed) as usize % RECENT;
        self.recent[i].store(elapsed_ns | mark, Ordering::Relaxed);
        let latency = self.latency_ns();
        let mut own = [0u64; RECENT];
        let mut n = 0;
        // Newest first: `next` was taken for this timing.
        for k in 0..RECENT {
            let t = self.recent[(i + RECENT - k) % RECENT].load(Ordering::Relaxed);
            if t != 0 {
                own[n] = match t & IDLE_BIT {
                    0 => t,
                    _ => (t & !IDLE_BIT).saturating_sub(latency),
                };
                n += 1;
            }
        }
        let cost = cost_of(&own[..n]).unwrap_or(elapsed_ns).max(MIN_COST_NS);
        let typical = typical_of(&mut own[..n], cost);
        self.cost_ns.store(cost, Ordering::Relaxed);
        self.typical_ns.store(typical, Ordering::Relaxed);
        log::trace!(
            "timed {elapsed_ns} ns (idle stream: {idle}): cost {cost} ns, typical {typical} ns"
        );
    }

    /// The launch latency in this shape's idle-stream timings: its least
    /// idle timing less its least timing behind work, within the
    /// process-wide bound; the bound itself until it has both.
    fn latency_ns(&self) -> u64 {
        let bound = LATENCY_NS.load(Ordering::Relaxed);
        let idle = self.least_idle_ns.load(Ordering::Relaxed);
        match self.least_busy_ns.load(Ordering::Relaxed) {
            u64::MAX => bound.min(idle),
            busy => idle.saturating_sub(busy).min(bound),
        }
    }

    /// Sets a first estimate (a graph's, from its kernel nodes) if there
    /// is none.
    pub fn seed(&self, ns: u64) {
        let _ = self
            .cost_ns
            .compare_exchange(0, ns.max(1), Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Whether a sample this launch claimed (`claim_sample`) into a
    /// stream that is `idle` should be given back for a later launch, one
    /// behind queued work. An idle-stream timing holds what the host took
    /// to submit the kernel, and a limited container's due sample most
    /// often falls on its window's first launch, after a sleep: on an H200
    /// a 50 us kernel was charged 68 us that way for seconds (run 55). A
    /// known shape passes over at most [`MAX_IDLE_SKIPS`] in a row: a
    /// stream that never queues has only idle timings.
    pub fn pass_over_idle(&self, idle: bool) -> bool {
        if !idle || self.cost_ns() == 0 {
            self.idle_skips.store(0, Ordering::Relaxed);
            return false;
        }
        if self.idle_skips.fetch_add(1, Ordering::Relaxed) >= MAX_IDLE_SKIPS {
            self.idle_skips.store(0, Ordering::Relaxed);
            return false;
        }
        // Due again at once, for the next launch.
        self.last_sample_ns.store(0, Ordering::Relaxed);
        self.pending.store(false, Ordering::Release);
        true
    }

    /// Whether a timing of this shape is in flight.
    pub fn timing_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// The timing in flight is done (collected, or it never started).
    pub fn timing_done(&self) {
        self.pending.store(false, Ordering::Release);
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

/// The cost that `timings` (newest first) say: the least of the newest
/// [`NEWEST`] that lie within an eighth of the least of all (a clock's
/// wander, not another context's slice), or the least of all when every
/// one of the newest straddled a slice.
fn cost_of(timings: &[u64]) -> Option<u64> {
    let floor = *timings.iter().min()?;
    let near = floor.saturating_add(floor / 8);
    Some(
        timings
            .iter()
            .take(NEWEST)
            .copied()
            .filter(|&t| t <= near)
            .min()
            .unwrap_or(floor),
    )
}

/// The time a launch typically holds, by `timings` and the `cost` they gave:
/// the median of those from the cost to an eighth over it (another context's
/// slice is more; an older floor under the cost is not typical). A cost is the
/// least of a few timings, and a power-bound GEMM's vary with its clock: its
/// cost was 3-5 % under its typical time on an H200, and the region, counting
/// costs, showed a 60 % container at 0.580 when it held 0.599
/// (docs/benchmarks.md, runs 61-63).
fn typical_of(timings: &mut [u64], cost: u64) -> u64 {
    let near = cost.saturating_add(cost / 8);
    timings.sort_unstable();
    let from = timings.partition_point(|&t| t < cost);
    let to = timings.partition_point(|&t| t <= near);
    match timings.get(from..to) {
        Some(within) if !within.is_empty() => within[within.len() / 2],
        _ => cost,
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
    fn a_due_sample_into_an_idle_stream_waits_for_one_behind_work_a_few_times() {
        let s = Slot::new();
        // Unknown shape: its first timing is taken, idle or not.
        assert!(s.claim_sample(1_000));
        assert!(!s.pass_over_idle(true));
        s.record_timing(60_000, true);
        s.pending.store(false, Ordering::Release);
        let now = 1_000 + RESAMPLE_NS;
        // Known: an idle stream gives the sample back, due again at once.
        for i in 0..MAX_IDLE_SKIPS {
            assert!(s.claim_sample(now + u64::from(i)), "claim {i}");
            assert!(s.pass_over_idle(true), "pass {i}");
            assert!(!s.pending.load(Ordering::Acquire));
        }
        // ...but not for ever: a stream that never queues is timed idle.
        assert!(s.claim_sample(now + 10));
        assert!(!s.pass_over_idle(true));
        s.pending.store(false, Ordering::Release);
        // A launch behind queued work is taken, and starts the count anew.
        assert!(s.claim_sample(now + 2 * RESAMPLE_NS));
        assert!(!s.pass_over_idle(false));
        s.pending.store(false, Ordering::Release);
        assert!(s.claim_sample(now + 3 * RESAMPLE_NS));
        assert!(s.pass_over_idle(true));
    }

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
    fn each_shape_learns_its_launch_latency() {
        // (Every test here shares LATENCY_NS; this one alone lowers it.)
        // A shape timed on idle streams only: the bound (8 us) comes off...
        let spin = slot(key(&[1, 1]));
        spin.record_timing(57_500, true);
        assert_eq!(spin.cost_ns(), 57_500 - MAX_LATENCY_NS);
        // ...until it is timed behind work too: its latency is 4.8 us.
        spin.record_timing(52_700, false);
        spin.record_timing(57_500, true);
        assert_eq!(spin.cost_ns(), 52_700);
        assert_eq!(spin.latency_ns(), 4_800);
        // PyTorch's add_ at 0.05 ms: no latency shows, none comes off, even
        // when its recent timings are all idle ones.
        let add = slot(key(&[1, 2]));
        add.record_timing(52_300, false);
        for _ in 0..RECENT {
            add.record_timing(53_200, true);
        }
        assert_eq!(add.latency_ns(), 900);
        assert_eq!(add.cost_ns(), 52_300);
        add.record_timing(52_100, true);
        assert_eq!(add.latency_ns(), 0);
        assert_eq!(add.cost_ns(), 52_100);
        let tiny = slot(key(&[1, 3]));
        tiny.record_timing(300, false);
        assert_eq!(tiny.cost_ns(), MIN_COST_NS);
        // An empty kernel's idle timing is mostly latency: it lowers the
        // bound for shapes timed on idle streams alone.
        let empty = slot(key(&[1, 4]));
        empty.record_timing(5_000, true);
        assert_eq!(empty.cost_ns(), MIN_COST_NS);
        let other = slot(key(&[1, 5]));
        other.record_timing(57_000, true);
        assert_eq!(other.cost_ns(), 52_000);
        other.record_timing(10_000_000, true);
        assert_eq!(other.cost_ns(), 52_000);
    }

    #[test]
    fn a_cost_is_the_least_recent_timing_and_seeds_do_not_override() {
        let s = slot(key(&[42]));
        assert!(s.claim_sample(1));
        assert!(!s.claim_sample(2), "one timing in flight per shape");
        s.pending.store(false, Ordering::Release);
        s.seed(500);
        assert_eq!(s.cost_ns(), 500);
        s.record_timing(1000, false);
        assert_eq!(s.cost_ns(), 1000, "a timing replaces the seed");
        // Timings that straddle another context's time slice only add.
        s.record_timing(3400, false);
        s.record_timing(990, false);
        s.record_timing(3400, false);
        assert_eq!(s.cost_ns(), 990);
        s.seed(7);
        assert_eq!(s.cost_ns(), 990);
        // A cost that really grew is followed once the window has passed.
        for _ in 0..RECENT {
            s.record_timing(2000, false);
        }
        assert_eq!(s.cost_ns(), 2000);
        assert!(
            !s.claim_sample(3),
            "known shapes are re-timed only every RESAMPLE_NS"
        );
        assert!(s.claim_sample(3 + RESAMPLE_NS));
    }

    #[test]
    fn a_shape_s_typical_time_is_the_median_of_its_timings_near_its_cost() {
        let s = slot(key(&[9, 9]));
        assert_eq!(s.typical_ns(), 0, "unknown");
        // A GEMM whose clock wanders: the cost is the least, the typical
        // time the middle; timings that held a neighbour's slice are out.
        for t in [1_600_000, 1_550_000, 4_100_000, 1_620_000, 1_680_000] {
            s.record_timing(t, false);
        }
        assert_eq!(s.cost_ns(), 1_550_000);
        assert_eq!(s.typical_ns(), 1_620_000);
        // A 2 ms lease of such launches holds 2 ms at 1.62 / 1.55.
        assert_eq!(s.held_ns(2_000_000, 1_550_000), 2_090_322);
        // A cost re-learnt since the launch was charged: an eighth more
        // at most; a lease beyond reason stands as it is.
        assert_eq!(s.held_ns(2_000_000, 1_000), 2_250_000);
        assert_eq!(s.held_ns(u64::MAX, 1_550_000), u64::MAX);
        // Steady timings: the typical time is the cost.
        let m = slot(key(&[9, 10]));
        for _ in 0..RECENT {
            m.record_timing(998_000, false);
        }
        assert_eq!((m.cost_ns(), m.typical_ns()), (998_000, 998_000));
        assert_eq!(m.held_ns(2_000_000, 998_000), 2_000_000);
        // Not timed yet: what was admitted.
        assert_eq!(
            slot(key(&[9, 11])).held_ns(2_000_000, DEFAULT_NS),
            2_000_000
        );
        // Nothing near the cost but itself (a floor among straddled ones).
        let mut lone = [4_200_000, 1_600_000, 4_300_000];
        assert_eq!(typical_of(&mut lone, 1_600_000), 1_600_000);
        assert_eq!(typical_of(&mut [], 700), 700);
        // An older floor under the cost is left out of the median.
        let mut old_floor = [1_360_000, 1_360_000, 1_360_000, 1_580_000, 1_600_000];
        assert_eq!(typical_of(&mut old_floor, 1_580_000), 1_600_000);
    }

    #[test]
    fn a_long_run_of_timings_that_straddled_a_slice_does_not_raise_the_cost() {
        // Beside an unlimited neighbour (run 57): clean timings now and
        // then, between runs of ten that each held a 2.5 ms slice.
        let s = slot(key(&[7, 8]));
        s.record_timing(1_600_000, false);
        for _ in 0..3 {
            for _ in 0..10 {
                s.record_timing(4_200_000, false);
            }
            assert_eq!(s.cost_ns(), 1_600_000);
            s.record_timing(1_600_000, false);
        }
        // Among the newest, the least near the floor: a clock's wander.
        for t in [1_700_000, 1_650_000, 1_680_000] {
            s.record_timing(t, false);
        }
        assert_eq!(s.cost_ns(), 1_600_000, "the floor is among the newest 8");
        for _ in 0..NEWEST {
            s.record_timing(1_680_000, false);
        }
        assert_eq!(s.cost_ns(), 1_680_000);
        // A cost that really grew is followed once RECENT samples say so.
        for _ in 0..RECENT {
            s.record_timing(4_200_000, false);
        }
        assert_eq!(s.cost_ns(), 4_200_000);
    }
}

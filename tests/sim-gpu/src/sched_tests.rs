//! The scheduler on a machine in memory: time slices, switch costs,
//! markers, dead processes, and replays that do not depend on how often
//! the schedule is brought up to date.

use super::*;
use crate::state::Shared;

const MS: u64 = 1_000_000;
const T0: u64 = 1_000 * MS;

struct Machine(Box<Shared>);

impl Machine {
    fn new(slice: u64, switch: u64) -> Machine {
        let layout = std::alloc::Layout::new::<Shared>();
        // SAFETY: Shared is atomics only, valid when zeroed; the Box frees
        // it with the layout it was allocated with.
        let sh = unsafe { Box::from_raw(std::alloc::alloc_zeroed(layout) as *mut Shared) };
        sh.dev[0].slice_ns.store(slice, Ordering::Relaxed);
        sh.dev[0].switch_ns.store(switch, Ordering::Relaxed);
        Machine(sh)
    }

    fn add(&self, slot: usize) {
        let p = &self.0.procs[slot];
        p.pid.store(100 + slot as i32, Ordering::Relaxed);
        p.queue[0].reset((slot as u64 + 1) << 40, 100 + slot as i32);
    }

    fn push(&self, slot: usize, work: u64, arrival: u64) -> u64 {
        let q = &self.0.procs[slot].queue[0];
        let seq = q.tail.load(Ordering::Relaxed);
        let it = &q.items[index(seq)];
        it.work.store(work, Ordering::Relaxed);
        it.arrival.store(arrival, Ordering::Relaxed);
        it.seq.store(seq, Ordering::Relaxed);
        q.tail.store(seq + 1, Ordering::Release);
        seq
    }

    fn run(&self, target: u64) {
        run(&self.0, 0, target, &mut |_| true);
    }

    fn done(&self, slot: usize) -> u64 {
        let q = &self.0.procs[slot].queue[0];
        q.head.load(Ordering::Relaxed) - ((slot as u64 + 1) << 40)
    }

    fn ts(&self, slot: usize, seq: u64) -> u64 {
        self.0.procs[slot].queue[0].items[index(seq)]
            .ts
            .load(Ordering::Relaxed)
    }

    /// Busy intervals of `slot`.
    fn busy(&self, slot: usize) -> Vec<(u64, u64)> {
        let p = &self.0.procs[slot];
        let n = p.head[0].load(Ordering::Relaxed) as usize;
        (0..n)
            .map(|i| {
                let iv = &p.ring[0][i];
                (
                    iv.start.load(Ordering::Relaxed),
                    iv.end.load(Ordering::Relaxed),
                )
            })
            .collect()
    }
}

#[test]
fn a_context_alone_is_never_preempted() {
    let m = Machine::new(2 * MS, MS / 5);
    m.add(3);
    for _ in 0..100 {
        m.push(3, MS, T0);
    }
    m.run(T0 + 50 * MS + MS / 2);
    assert_eq!(m.done(3), 50);
    m.run(T0 + 200 * MS);
    assert_eq!(m.done(3), 100);
    assert_eq!(m.busy(3), vec![(T0, T0 + 100 * MS)]);
}

#[test]
fn two_busy_contexts_share_the_device_less_the_switches() {
    let m = Machine::new(2 * MS, MS / 5);
    m.add(0);
    m.add(1);
    for _ in 0..2000 {
        m.push(0, MS, T0);
        m.push(1, MS, T0);
    }
    m.run(T0 + 1_000 * MS);
    let (a, b) = (m.done(0), m.done(1));
    // 2 ms of work for every 2.2 ms of device time, in turns.
    assert!(
        (450..=456).contains(&a) && (450..=456).contains(&b),
        "{a} {b}"
    );
    // The device was never idle: switches count as the incoming one's.
    let busy: u64 = (0..2).flat_map(|s| m.busy(s)).map(|(s, e)| e - s).sum();
    assert_eq!(busy, 1_000 * MS);
    // The first context ran its slice, then the second after a switch.
    assert_eq!(m.busy(0)[0], (T0, T0 + 2 * MS));
    assert_eq!(m.busy(1)[0], (T0 + 2 * MS, T0 + 4 * MS + MS / 5));
}

#[test]
fn a_marker_waits_for_its_context_and_an_idle_context_yields() {
    let m = Machine::new(2 * MS, MS / 5);
    m.add(0);
    m.add(1);
    for _ in 0..10 {
        m.push(0, MS, T0);
    }
    let mark = m.push(1, MARKER, T0 + MS / 2);
    m.run(T0 + 3 * MS);
    // Reached after the first context's slice and a switch...
    assert_eq!(m.ts(1, mark), T0 + 2 * MS + MS / 5);
    m.run(T0 + 20 * MS);
    // ...and the device went straight back: one more switch, no slice.
    assert_eq!(m.busy(1), vec![(T0 + 2 * MS, T0 + 2 * MS + MS / 5)]);
    assert_eq!(m.busy(0)[1].0, T0 + 2 * MS + MS / 5);
    assert_eq!(m.done(0), 10);
    assert_eq!(m.busy(0).last().unwrap().1, T0 + 10 * MS + 2 * MS / 5);
}

#[test]
fn an_event_right_behind_a_slice_s_last_kernel_needs_no_switch_back() {
    let m = Machine::new(2 * MS, MS / 5);
    m.add(0);
    m.add(1);
    let mut marks = Vec::new();
    for _ in 0..10 {
        m.push(0, MS, T0);
        marks.push(m.push(0, MARKER, T0));
        m.push(1, MS, T0);
    }
    m.run(T0 + 30 * MS);
    // The second kernel ends with the slice: its event is written then.
    assert_eq!(m.ts(0, marks[1]), T0 + 2 * MS);
    assert_eq!(
        m.busy(0)[..2],
        [
            (T0, T0 + 2 * MS),
            (T0 + 4 * MS + MS / 5, T0 + 6 * MS + 2 * MS / 5)
        ]
    );
}

#[test]
fn a_newcomer_waits_at_most_one_slice() {
    let m = Machine::new(2 * MS, MS / 5);
    m.add(0);
    m.add(1);
    for _ in 0..100 {
        m.push(0, MS, T0);
    }
    // The first context ran alone for 7.5 ms: its slices started over
    // every 2 ms, so the newcomer gets the device at 8 ms plus a switch.
    let k = m.push(1, MS, T0 + 7 * MS + MS / 2);
    let mark = m.push(1, MARKER, T0 + 7 * MS + MS / 2);
    m.run(T0 + 30 * MS);
    assert_eq!(m.done(1), 2, "{k}");
    assert_eq!(m.ts(1, mark), T0 + 9 * MS + MS / 5);
}

#[test]
fn a_dead_process_loses_its_work() {
    let m = Machine::new(2 * MS, MS / 5);
    m.add(0);
    m.add(1);
    for _ in 0..100 {
        m.push(0, MS, T0);
        m.push(1, MS, T0);
    }
    run(&m.0, 0, T0 + 10 * MS, &mut |slot| slot != 1);
    assert_eq!(m.done(1), 100, "dropped");
    assert_eq!(m.0.procs[1].queue[0].owner.load(Ordering::Relaxed), 0);
    m.run(T0 + 100 * MS);
    assert_eq!(m.done(0), 100);
}

#[test]
fn the_schedule_does_not_depend_on_how_often_it_is_replayed() {
    let once = Machine::new(2 * MS, MS / 5);
    let often = Machine::new(2 * MS, MS / 5);
    for m in [&once, &often] {
        m.add(0);
        m.add(5);
        for i in 0..300 {
            m.push(0, MS / 3 + i * 1_000, T0 + i * MS / 2);
            m.push(5, MARKER, T0 + i * MS / 2 + 7);
            m.push(5, 2 * MS, T0 + i * MS);
        }
    }
    once.run(T0 + 400 * MS);
    let mut t = T0 - 3 * MS;
    while t < T0 + 400 * MS {
        t += 123_457;
        often.run(t.min(T0 + 400 * MS));
    }
    for slot in [0, 5] {
        assert_eq!(once.done(slot), often.done(slot));
        assert_eq!(once.busy(slot), often.busy(slot));
    }
}

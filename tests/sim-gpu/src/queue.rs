//! What the driver entry points ask of the scheduler: queue work, bring the
//! schedule up to now, wait for an item.
//!
//! The schedule of a device is replayed under a lock that every process
//! takes the same way: a per-process spin lock (the threads of a process)
//! and then a record lock on byte `dev` of the state file (the processes).
//! The kernel drops a dead process's record locks, so a process killed
//! while it held one wedges nobody; a child forked while another thread
//! held the spin lock finds its parent's pid in it and takes it over.
//! Queueing takes no lock: a queue has one producer (the process, under
//! its handle-table mutex) and one consumer (whoever holds the lock).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::sched::{self, MARKER, QUEUE, index};
use crate::state::{self, MAX_DEV, MAX_PROC, now_ns, shared};

/// (pid << 32 | tid) of the thread of this process holding a device's lock.
static HELD: [AtomicU64; MAX_DEV] = [const { AtomicU64::new(0) }; MAX_DEV];

/// A device's scheduler lock, held until dropped.
pub struct Guard(usize);

fn record_lock(dev: usize, kind: i32) {
    let fl = libc::flock {
        l_type: kind as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: dev as libc::off_t,
        l_len: 1,
        l_pid: 0,
    };
    loop {
        // SAFETY: fcntl on the state file's descriptor, which stays open,
        // with a flock record we own.
        let rc = unsafe { libc::fcntl(state::fd(), libc::F_SETLKW, &fl) };
        if rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

pub fn lock(dev: usize) -> Guard {
    let pid = u64::from(std::process::id());
    // SAFETY: gettid has no preconditions.
    let me = pid << 32 | u64::from(unsafe { libc::gettid() } as u32);
    let mut spins = 0u32;
    loop {
        match HELD[dev].compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => break,
            // Held by a thread of the parent when this process forked.
            Err(h) if h >> 32 != pid => {
                if HELD[dev]
                    .compare_exchange(h, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    break;
                }
            }
            Err(_) if spins < 100 => {
                spins += 1;
                std::hint::spin_loop();
            }
            Err(_) => std::thread::yield_now(),
        }
    }
    record_lock(dev, libc::F_WRLCK);
    Guard(dev)
}

impl Drop for Guard {
    fn drop(&mut self) {
        record_lock(self.0, libc::F_UNLCK);
        HELD[self.0].store(0, Ordering::Release);
    }
}

/// When this process last found each process entry's owner alive.
static SEEN_ALIVE: [AtomicU64; MAX_PROC] = [const { AtomicU64::new(0) }; MAX_PROC];
/// Liveness (the entry's lock, state.rs) is asked at most this often per
/// process.
const ALIVE_CHECK_NS: u64 = 20_000_000;

fn alive(slot: usize) -> bool {
    let now = now_ns();
    if now.saturating_sub(SEEN_ALIVE[slot].load(Ordering::Relaxed)) < ALIVE_CHECK_NS {
        return true;
    }
    let live = state::alive(slot);
    if live {
        SEEN_ALIVE[slot].store(now, Ordering::Relaxed);
    }
    live
}

/// Brings `dev`'s schedule up to now and runs `f` on it, under the lock.
pub fn advanced<R>(dev: usize, f: impl FnOnce(u64) -> R) -> R {
    let _g = lock(dev);
    let now = now_ns();
    sched::run(shared(), dev, now, &mut alive);
    f(now)
}

/// Brings `dev`'s schedule up to now.
pub fn advance(dev: usize) {
    advanced(dev, |_| ());
}

/// Queues `work` ns (or a marker) on `dev` for the caller, waiting while
/// its queue is full, as a launch blocks on a full command buffer.
/// Returns the item's sequence number and, when the slot it took held a
/// marker, that marker's (sequence number, timestamp).
pub fn push(dev: usize, work: u64) -> (u64, Option<(u64, u64)>) {
    let q = &state::me().queue[dev];
    let seq = q.tail.load(Ordering::Relaxed);
    while seq - q.head.load(Ordering::Acquire) >= QUEUE as u64 {
        advance(dev);
        if seq - q.head.load(Ordering::Acquire) >= QUEUE as u64 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let it = &q.items[index(seq)];
    let old = seq - QUEUE as u64;
    let harvest = (it.work.load(Ordering::Relaxed) == MARKER
        && it.seq.load(Ordering::Relaxed) == old)
        .then(|| (old, it.ts.load(Ordering::Acquire)));
    it.work.store(work, Ordering::Relaxed);
    it.arrival.store(now_ns(), Ordering::Relaxed);
    it.seq.store(seq, Ordering::Relaxed);
    it.ts.store(0, Ordering::Relaxed);
    q.tail.store(seq + 1, Ordering::Release);
    (seq, harvest)
}

/// Whether the caller's item `seq` on `dev` is done, bringing the
/// schedule up to now first if it is not yet.
pub fn done(dev: usize, seq: u64) -> bool {
    let q = &state::me().queue[dev];
    q.done(seq) || {
        advance(dev);
        q.done(seq)
    }
}

/// The timestamp of the caller's marker `seq` on `dev` (done), if its slot
/// still holds it.
pub fn marker_ts(dev: usize, seq: u64) -> Option<u64> {
    let it = &state::me().queue[dev].items[index(seq)];
    (it.seq.load(Ordering::Relaxed) == seq && it.work.load(Ordering::Relaxed) == MARKER)
        .then(|| it.ts.load(Ordering::Acquire))
}

/// Waits until the caller's item `seq` on `dev` is done.
///
/// A real synchronisation returns within microseconds of the GPU's end
/// (the driver spins, then yields); a sleep here overshot by Linux's
/// timer slack, 50 us or more, at every wait, and a loop of short
/// synchronised steps showed the GPU idle a third of the time. So the
/// thread's slack is cut to 1 us first. Some virtual machines wake a
/// sleeper late all the same (1 us of slack: 60-120 us at the median,
/// 0.6-3.7 ms at the 99th percentile, on the dev VM of 2026-11-28), and a
/// loop of 0.3 ms steps lost a fifth of its GPU time to it. So the last
/// [`POLL_NS`] of the caller's own work on the device is spun for, as the
/// driver spins. (Yielding between looks lost the CPU to busy loops on
/// the same core for a whole slice of theirs: under two `yes` loops the
/// neighbours tests failed 7 of 20.)
pub fn wait(dev: usize, seq: u64) {
    thread_local! {
        static SLACK_CUT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if !SLACK_CUT.with(|c| c.replace(true)) {
        // SAFETY: PR_SET_TIMERSLACK takes an integer and touches only the
        // calling thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
    }
    let q = &state::me().queue[dev];
    while !done(dev, seq) {
        // The caller's own work up to `seq` must run first.
        let head = q.head.load(Ordering::Acquire);
        let mut left = 0u64;
        for s in head..=seq.min(head + QUEUE as u64 - 1) {
            match q.items[index(s)].work.load(Ordering::Relaxed) {
                MARKER => {}
                w => left = left.saturating_add(w),
            }
        }
        left = left.saturating_sub(q.progress.load(Ordering::Relaxed));
        if !on_device(dev) {
            // Another context's slice, or a switch: at least that long.
            std::thread::sleep(Duration::from_nanos(left.clamp(20_000, 10_000_000)));
        } else if left > POLL_NS {
            std::thread::sleep(Duration::from_nanos((left - POLL_NS).min(10_000_000)));
        } else {
            // Looks at the queue alone between replays: a replay takes the
            // device's lock, which the other processes' waits need too.
            let until = now_ns() + POLL_REPLAY_NS;
            while !q.done(seq) && now_ns() < until {
                std::hint::spin_loop();
            }
        }
    }
}

/// How often a polling waiter replays the schedule.
const POLL_REPLAY_NS: u64 = 10_000;

/// How much of its own work on the device a waiter polls for, not sleeps.
const POLL_NS: u64 = 200_000;

/// Whether the calling process's context holds `dev` (the schedule as far
/// as it is known), not switching.
fn on_device(dev: usize) -> bool {
    let sh = shared();
    let s = &sh.sched[dev];
    let me = state::me();
    let Some(slot) = sh.procs.iter().position(|p| std::ptr::eq(p, me)) else {
        return false;
    };
    s.cur.load(Ordering::Relaxed) == slot as u64 + 1
        && s.switch_end.load(Ordering::Relaxed) <= s.t.load(Ordering::Acquire)
}

//! NVML's free memory on a card, asked from a helper thread and waited for
//! only briefly. A suspended process's NVML memory queries are taken to
//! block until it is restored (runs 21-25 on the H200: the watcher went
//! silent in its first restore's query), and the watcher must not block
//! with them: when NVML answers, the restore has a fresh figure; when it
//! does not, the board's estimate serves. At most one query is in flight,
//! so a blocked NVML costs one parked thread, which finishes once the
//! process runs again. While the process is checkpointed the helper asks
//! through a short-lived child process instead (`nvml::fresh`), whose NVML
//! is not this process's and so does not wait for the restore.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::room::Figure;
use crate::lock::{CondLock, Listed, Name};

/// How long the last query through child processes took, asked to
/// answered (ns; their whole bound where none answered).
static LAST_TOOK_NS: AtomicU64 = AtomicU64::new(0);

/// How long the last query through child processes took: their clones
/// grow with the checkpoint they copy (0.4-0.9 s for 46 GiB on an H100,
/// run 125).
pub fn last_took() -> Duration {
    Duration::from_nanos(LAST_TOOK_NS.load(Ordering::Relaxed))
}

#[derive(Default)]
struct Probe {
    /// A query is in flight (its thread may be blocked in NVML).
    asking: bool,
    /// The last answer for each card asked about (a restore of several
    /// cards asks one at a time, and judges them together).
    last: Vec<([u8; 16], Figure)>,
}

/// The probe; its condition variable says a query was answered. A forked
/// child has no query in flight (the thread asking is its parent's).
static PROBE: CondLock<Probe> = CondLock::new(
    Probe {
        asking: false,
        last: Vec::new(),
    },
    |p| {
        // (Cleared, not dropped: no allocator call in a fork handler.)
        p.asking = false;
        p.last.clear();
    },
);

/// This module's lock, for the fork handlers (`fork.rs`).
pub(super) fn locks() -> [Listed; 1] {
    [(Name::of("oversub.free_probe"), &PROBE)]
}

/// Free bytes on `card` as NVML says, the question sent at or after
/// `after` (monotonic ns; 0: any), arrived at most `stands_ns` ago
/// (`Figure::fresh_at`), waiting at most `wait`; None when NVML does not
/// answer in time (or cannot). (Sent, not asked: a question left running
/// by an earlier claim may reach NVML after a later claim began, and
/// restores seen since that claim's look at the board are not all in its
/// figure.)
/// `checkpointed`: this process's NVML waits for its restore, so a child
/// process asks. A restore that has just claimed its room judges it on
/// what NVML says since, not on a figure an allocation may have overtaken.
pub fn free_asked_after(
    card: [u8; 16],
    (after, stands_ns): (u64, u64),
    wait: Duration,
    checkpointed: bool,
) -> Option<Figure> {
    let deadline = Instant::now() + wait;
    let mut p = PROBE.lock();
    let fresh = |p: &Probe| {
        let now = crate::clock::monotonic_ns();
        p.last
            .iter()
            .find(|(c, _)| *c == card)
            .map(|&(_, f)| f)
            .filter(|f| f.sent >= after && f.fresh_at(now, stands_ns))
    };
    // Each query is asked once: a second answer without a figure is None.
    let mut asked = false;
    loop {
        if let Some(free) = fresh(&p) {
            return Some(free);
        }
        if !p.asking {
            if asked {
                // Answered without a figure (NVML cannot say).
                return None;
            }
            asked = true;
            p.asking = true;
            let spawned = std::thread::Builder::new()
                .name("vgpu-nvml-free".into())
                .spawn(move || {
                    let started = Instant::now();
                    let at = crate::clock::monotonic_ns();
                    // (A child's figure is as old as its question, asked
                    // once its NVML started.)
                    let answer = if checkpointed {
                        crate::nvml::fresh::free_memory(&card, crate::nvml::fresh::ANSWER_WAIT)
                    } else {
                        crate::nvml::client::free_memory(&card).map(|free| (free, at))
                    };
                    let mut p = PROBE.lock();
                    p.asking = false;
                    if let Some((free, asked)) = answer {
                        let arrived = crate::clock::monotonic_ns();
                        let figure = Figure {
                            free,
                            sent: at,
                            asked,
                            arrived,
                        };
                        match p.last.iter_mut().find(|(c, _)| *c == card) {
                            Some(last) => last.1 = figure,
                            None => p.last.push((card, figure)),
                        }
                    }
                    if checkpointed {
                        let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        LAST_TOOK_NS.store(took, Ordering::Relaxed);
                    }
                    PROBE.notify_all();
                });
            if spawned.is_err() {
                p.asking = false;
                return None;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        p = PROBE.wait_timeout(p, left);
    }
}

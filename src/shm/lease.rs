//! A lease in the region: one process of the container does a job (leads
//! a device's bucket, keeps the HAMi part true) while it renews the lease;
//! another takes it over once the holder is gone or silent.
//!
//! The word holds the holder's pid above the low 32 bits of its last
//! heartbeat, in monotonic seconds.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

const BEAT_BITS: u32 = 32;
const BEAT_MASK: u64 = (1 << BEAT_BITS) - 1;

/// The pid holding the lease (0: none).
pub fn holder(word: &AtomicU64) -> u32 {
    (word.load(Ordering::Acquire) >> BEAT_BITS) as u32
}

/// Takes or renews the lease for process `me` at `now_s` (monotonic
/// seconds); true while `me` holds it. A lease whose last heartbeat is
/// more than `lease_s` old, or whose holder `alive` says is gone, is taken
/// over.
pub fn elect(
    word: &AtomicU64,
    me: u32,
    now_s: u64,
    lease_s: u64,
    alive: impl Fn(u32) -> bool,
) -> bool {
    let mine = u64::from(me) << BEAT_BITS | (now_s & BEAT_MASK);
    let cur = word.load(Ordering::Acquire);
    let (pid, beat) = ((cur >> BEAT_BITS) as u32, cur & BEAT_MASK);
    if pid == me {
        word.store(mine, Ordering::Release);
        return true;
    }
    let stale = pid == 0 || (now_s & BEAT_MASK).wrapping_sub(beat) > lease_s || !alive(pid);
    stale
        && word
            .compare_exchange(cur, mine, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
}

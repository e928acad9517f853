//! The launch path's first question, as one word: has vgpu anything to do
//! for a launch in this process? Each bit is one reason; while the word is
//! 0 a launch hook is one relaxed load and a jump to the driver (the
//! `idle` hooks of `interpose/table.rs`), with no panic boundary, since
//! nothing of ours runs. The wake hooks ask only about [`OVERSUB`] and
//! [`TEST_PANIC`] ([`no_oversub`]); the synchronisations among them also
//! about [`LIMIT`] ([`neither_oversub_nor_limit`]: the turns' probes note
//! when one returned).
//!
//! - [`UNMARKED`], [`BLOCKED`]: HAMi's gate (`hami/gate.rs`), which owns
//!   them: the watcher wants the next launch noted (set once a tick, the
//!   first launch after clears it), or a node monitor blocks launches.
//!   The watcher reads the region each tick and publishes here, so a
//!   monitor's write reaches launches within a tick, as before;
//! - [`LIMIT`]: an SM limit is in force on a device of this process
//!   (`limiter`; never cleared);
//! - [`OVERSUB`]: `CUDA_OVERSUBSCRIBE`: every hook counts and may restore
//!   the process first (`oversub::enter`; never cleared);
//! - [`TEST_PANIC`]: `VGPU_TEST_PANIC` names a hook (`guard`).
//!
//! Beside the word, one fact the entry paths read and `init` writes at
//! start: `CUDA_DISABLE_CONTROL` ([`control_disabled`]; not a bit of the
//! word, which would take every launch off its short path).
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

pub const UNMARKED: u8 = 1;
pub const BLOCKED: u8 = 2;
pub const LIMIT: u8 = 4;
pub const OVERSUB: u8 = 8;
pub const TEST_PANIC: u8 = 16;

/// A cache line of its own: no write to a neighbour takes it away from
/// the launching threads.
#[repr(align(64))]
struct Word(AtomicU8);

/// HAMi's gate starts unmarked: the first launch is noted.
static WORD: Word = Word(AtomicU8::new(UNMARKED));

/// Nothing to do for a launch: the hook may call the driver at once.
#[inline(always)]
pub fn none() -> bool {
    WORD.0.load(Ordering::Relaxed) == 0
}

/// Nothing to do for a call that only oversubscription concerns (the
/// synchronisations, copies and current-context calls of `cuda/wake.rs`).
#[inline(always)]
pub fn no_oversub() -> bool {
    !any(OVERSUB | TEST_PANIC)
}

/// Nothing to do for a synchronisation: no oversubscription, and no SM
/// limit (whose probes note when the GPU ran the thread's work dry,
/// `limiter/probes.rs`).
#[inline(always)]
pub fn neither_oversub_nor_limit() -> bool {
    !any(OVERSUB | LIMIT | TEST_PANIC)
}

/// Whether any of `bits` is set (relaxed: for the launch path's checks).
#[inline(always)]
pub fn any(bits: u8) -> bool {
    WORD.0.load(Ordering::Relaxed) & bits != 0
}

/// Whether any of `bits` is set, with everything written before it was.
#[inline]
pub fn any_acquire(bits: u8) -> bool {
    WORD.0.load(Ordering::Acquire) & bits != 0
}

/// Sets `bits`; the word before.
pub fn set(bits: u8) -> u8 {
    WORD.0.fetch_or(bits, Ordering::AcqRel)
}

/// Clears `bits`; the word before.
pub fn clear(bits: u8) -> u8 {
    WORD.0.fetch_and(!bits, Ordering::AcqRel)
}

/// Clears `bits` without ordering (the gate's note that a launch passed).
#[inline]
pub fn clear_relaxed(bits: u8) {
    WORD.0.fetch_and(!bits, Ordering::Relaxed);
}

/// `CUDA_DISABLE_CONTROL` is set (never cleared).
static CONTROL_DISABLED: AtomicBool = AtomicBool::new(false);

/// `init`, at start: `CUDA_DISABLE_CONTROL` is set, every call passes
/// through.
pub fn disable_control() {
    CONTROL_DISABLED.store(true, Ordering::Release);
}

/// Whether `CUDA_DISABLE_CONTROL` is set (false until `init` has started).
pub fn control_disabled() -> bool {
    CONTROL_DISABLED.load(Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_are_distinct() {
        let all = [UNMARKED, BLOCKED, LIMIT, OVERSUB, TEST_PANIC];
        assert_eq!(all.iter().fold(0, |a, b| a | b).count_ones(), 5);
    }
}

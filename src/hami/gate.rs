//! The gate every launch passes: HAMi's priority time-sharing. When a
//! node monitor writes `recent_kernel = -1` into the region, the watcher
//! closes the gate within a tick (100 ms), and launches wait, sleeping (no
//! core spins), until the monitor lifts it; HAMi-core polls once a second,
//! vgpu every 5 ms. The gate also notes that the container launched, for
//! the watcher to mark `recent_kernel` and `last_kernel_time`.
//!
//! On the launch path it is one relaxed load of a process-local atomic,
//! which changes at most once a tick: two bits of the launch path's word
//! (`duty.rs`), so that a launch with nothing to do reads one word.
#![forbid(unsafe_code)]

use std::time::Duration;

use crate::duty::{self, BLOCKED, UNMARKED};

/// How often a blocked launch looks again.
const WAIT_STEP: Duration = Duration::from_millis(5);

/// Called before every launch: returns at once unless the container is
/// blocked (then when it is lifted), and notes the launch.
#[inline]
pub fn launching() {
    if duty::any(UNMARKED | BLOCKED) {
        pass();
    }
}

#[cold]
fn pass() {
    if duty::any_acquire(BLOCKED) {
        crate::warn_once!(
            "a node monitor blocks this container's launches (recent_kernel = -1: a higher-priority task uses its GPU); they wait until it is lifted"
        );
        while duty::any_acquire(BLOCKED) {
            std::thread::sleep(WAIT_STEP);
        }
    }
    duty::clear_relaxed(UNMARKED);
}

/// The watcher says whether a monitor blocks the container.
pub(super) fn publish(blocked: bool) {
    if blocked {
        duty::set(BLOCKED);
    } else {
        duty::clear(BLOCKED);
    }
}

/// Whether a launch passed since the last call.
pub(super) fn take_launched() -> bool {
    duty::set(UNMARKED) & UNMARKED == 0
}

/// In a forked child: open until its own watcher looks.
pub fn reset_in_child() {
    duty::clear(BLOCKED);
    duty::set(UNMARKED);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_gate_holds_a_launch_until_it_opens_and_launches_are_noted() {
        reset_in_child();
        assert!(!take_launched());
        launching();
        assert!(take_launched());
        assert!(!take_launched());
        publish(true);
        let t = std::time::Instant::now();
        let opener = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            publish(false);
        });
        launching();
        assert!(t.elapsed() >= Duration::from_millis(100));
        opener.join().unwrap();
        assert!(take_launched());
    }
}

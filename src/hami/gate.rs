//! The gate every launch passes: HAMi's priority time-sharing. When a
//! node monitor writes `recent_kernel = -1` into the region, the watcher
//! closes the gate within a tick (100 ms), and launches wait, sleeping (no
//! core spins), until the monitor lifts it; HAMi-core polls once a second,
//! vgpu every 5 ms. The gate also notes that the container launched, for
//! the watcher to mark `recent_kernel` and `last_kernel_time`.
//!
//! On the launch path it is one relaxed load of a process-local atomic,
//! which changes at most once a tick.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

/// No launch since the watcher last looked.
const UNMARKED: u8 = 1;
/// A monitor blocks the container.
const BLOCKED: u8 = 2;
/// How often a blocked launch looks again.
const WAIT_STEP: Duration = Duration::from_millis(5);

static GATE: AtomicU8 = AtomicU8::new(UNMARKED);

/// Called before every launch: returns at once unless the container is
/// blocked (then when it is lifted), and notes the launch.
#[inline]
pub fn launching() {
    if GATE.load(Ordering::Relaxed) != 0 {
        pass();
    }
}

#[cold]
fn pass() {
    if GATE.load(Ordering::Acquire) & BLOCKED != 0 {
        crate::warn_once!(
            "a node monitor blocks this container's launches (recent_kernel = -1: a higher-priority task uses its GPU); they wait until it is lifted"
        );
        while GATE.load(Ordering::Acquire) & BLOCKED != 0 {
            std::thread::sleep(WAIT_STEP);
        }
    }
    GATE.fetch_and(!UNMARKED, Ordering::Relaxed);
}

/// The watcher says whether a monitor blocks the container.
pub(super) fn publish(blocked: bool) {
    if blocked {
        GATE.fetch_or(BLOCKED, Ordering::AcqRel);
    } else {
        GATE.fetch_and(!BLOCKED, Ordering::AcqRel);
    }
}

/// Whether a launch passed since the last call.
pub(super) fn take_launched() -> bool {
    GATE.fetch_or(UNMARKED, Ordering::AcqRel) & UNMARKED == 0
}

/// In a forked child: open until its own watcher looks.
pub fn reset_in_child() {
    GATE.store(UNMARKED, Ordering::Release);
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

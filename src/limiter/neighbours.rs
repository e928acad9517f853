//! Whether processes of other containers share a device, as its leader
//! judges from NVML (pure: the caller passes what NVML said).
//!
//! NVML hands each of its sample periods (about 1/6 s) to one process, so
//! beside a busy neighbour a light one shows with `smUtil > 0` in only a
//! few samples: on an H200 a 30 % container beside a 60 % one went
//! unseen for over 3 s within a 20 s run, and the 60 % one's controller
//! stepped on noise for those seconds (docs/benchmarks.md, run 16). So a
//! neighbour, once seen busy, counts as present while it still holds a
//! context on the device (NVML's list of compute processes), for up to
//! [`REMEMBER_NS`] since it last showed busy; one that left the list
//! counts for [`HOLD_NS`] more.
#![forbid(unsafe_code)]

use std::collections::HashMap;

/// A neighbour last seen busy this recently counts as present whatever
/// NVML's process list says.
pub const HOLD_NS: u64 = 3_000_000_000;
/// A neighbour still on the device counts as present this long after it
/// was last seen busy; an idle one (a notebook holding a context) then
/// stops counting.
pub const REMEMBER_NS: u64 = 30_000_000_000;

#[derive(Default)]
pub struct Neighbours {
    /// Host pid -> when (CLOCK_MONOTONIC ns) it last showed busy.
    last_busy_ns: HashMap<u32, u64>,
}

impl Neighbours {
    /// Notes the pids outside the container that NVML showed busy in this
    /// control period, and says whether a neighbour is present now.
    /// `on_device` lists the device's compute processes; it is asked only
    /// when a remembered neighbour has not shown busy for [`HOLD_NS`], and
    /// `None` (NVML could not say) keeps every remembered one.
    pub fn present(
        &mut self,
        now: u64,
        busy: &[u32],
        on_device: impl FnOnce() -> Option<Vec<u32>>,
    ) -> bool {
        for &pid in busy {
            self.last_busy_ns.insert(pid, now);
        }
        self.last_busy_ns
            .retain(|_, &mut t| now.saturating_sub(t) < REMEMBER_NS);
        if self.last_busy_ns.is_empty() {
            return false;
        }
        if self
            .last_busy_ns
            .values()
            .any(|&t| now.saturating_sub(t) < HOLD_NS)
        {
            return true;
        }
        match on_device() {
            Some(pids) => {
                self.last_busy_ns.retain(|pid, _| pids.contains(pid));
                !self.last_busy_ns.is_empty()
            }
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_neighbour_that_goes_unseen_but_keeps_its_context_stays_present() {
        let mut n = Neighbours::default();
        assert!(!n.present(S, &[], || panic!("nothing remembered: no NVML call")));
        assert!(n.present(2 * S, &[77], || panic!("seen now")));
        // Unseen for 8 s (NVML gave its periods to others): still there.
        assert!(n.present(10 * S, &[], || Some(vec![77, 5])));
        // Its process left the device: gone at once.
        assert!(!n.present(11 * S, &[], || Some(vec![5])));
        assert!(!n.present(12 * S, &[], || panic!("forgotten")));
    }

    #[test]
    fn a_neighbour_seen_busy_counts_for_the_hold_even_if_the_list_lags() {
        let mut n = Neighbours::default();
        assert!(n.present(S, &[9], || None));
        assert!(n.present(S + HOLD_NS - 1, &[], || Some(vec![])));
        assert!(!n.present(S + HOLD_NS, &[], || Some(vec![])));
    }

    #[test]
    fn an_idle_neighbour_is_forgotten_and_a_failed_list_keeps_it() {
        let mut n = Neighbours::default();
        assert!(n.present(0, &[3], || None));
        assert!(n.present(20 * S, &[], || None), "NVML could not say");
        assert!(n.present(REMEMBER_NS - 1, &[], || Some(vec![3])));
        assert!(!n.present(REMEMBER_NS, &[], || Some(vec![3])));
    }
}

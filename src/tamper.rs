//! A region file that shrinks under this process (whoever may write it
//! may `truncate` it, and it is 0666 by default) must not kill it with
//! SIGBUS. The mapping is touched only right after [`Attach::intact`] (one
//! `fstat`), never across a syscall: callers check again after every slow
//! step (a driver or NVML call, the region lock, /proc reads, a sleep). A
//! shrunk or re-created file is swapped, in place, for a private copy
//! holding this process's devices, the limits it last saw in the region,
//! and what it holds. From then on it is limited alone, and says so once.
//!
//! A thread preempted between its check and its accesses would fault if
//! the truncation landed meanwhile; `vgpu_shm::sigbus` repairs that fault
//! (zero pages over the mapping) and the next check swaps in the copy.
#![forbid(unsafe_code)]

use vgpu_shm::Tamper;

use crate::attach::Attach;

impl Attach {
    /// Whether the region may be touched now (one `fstat`: call it right
    /// before the accesses, after any slow step). On a shrunk file this
    /// switches to a private copy first; false only when even that failed.
    pub fn intact(&self) -> bool {
        match self.region.check_size() {
            Ok(()) => true,
            Err(why) => self.go_private(why),
        }
    }

    /// [`Attach::intact`], and the file is still the region we mapped (not
    /// truncated and created again): each watcher tick.
    pub fn still_ours(&self) -> bool {
        match self.region.check_intact() {
            Ok(()) => true,
            Err(why) => self.go_private(why),
        }
    }

    fn go_private(&self, why: Tamper) -> bool {
        let _one = self.switching.lock();
        if !self.region.is_shared() {
            return true;
        }
        let known = self.known.lock().clone();
        let (slot, me) = (self.slot_index(), self.me());
        let done = self.region.become_private(|fresh| {
            for (index, info, limits) in &known {
                fresh.put_device(*index, info, *limits);
            }
            if let (Some(slot), Some(me)) = (slot, me) {
                let host = crate::process::host_pid().map(|p| p as i32);
                fresh.claim_slot_at(slot, &me, host);
                (self.on_slot.refill)(fresh, slot);
            }
        });
        let limits: Vec<String> = known
            .iter()
            .map(|(_, info, l)| {
                format!(
                    "{} memory {} SM {}%",
                    vgpu_shm::format_uuid(&info.uuid),
                    l.mem,
                    l.sm
                )
            })
            .collect();
        match done {
            Ok(()) => {
                log::error!(
                    "region {}: {why}; this process is now limited alone, in private memory, by the limits it last saw there ({})",
                    self.region.path().display(),
                    if limits.is_empty() {
                        "none yet: its environment's apply".to_string()
                    } else {
                        limits.join(", ")
                    }
                );
                true
            }
            Err(e) => {
                crate::warn_once!("{e}: {why}; the region is not touched again");
                false
            }
        }
    }
}

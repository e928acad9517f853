//! The node monitor's half of HAMi's feedback loop, as HAMi's vGPUmonitor
//! runs it every 5 s (its `Observe`), so that a node needs no HAMi monitor
//! (`vgpuctl serve --feedback`). The container's half is `feedback.rs`.
//!
//! Each round, per region:
//! - `recent_kernel` is decremented when positive (a launch sets it to 2);
//!   a container whose value stays positive is *active* on every device
//!   in its `uuids`, at its `priority` (0 high, 1 normal);
//! - a container is *blocked* (`recent_kernel = -1`) when a container of a
//!   higher priority is active on its device, and unblocked (0) when none
//!   is. As in HAMi, the device that decides is the first of the
//!   container's devices that anyone is active on;
//! - `utilization_switch` is 1 when, on that device, a container of a
//!   higher priority or another of the same priority is active (the GPU
//!   is shared, so the SM limit applies), else 0.
//!
//! [`observe`] decides from copies of every region; [`HamiRegion::apply`]
//! writes one region's verdict with atomics (a launch may mark
//! `recent_kernel` at the same moment; a mark never lifts a block).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;

use memmap2::{MmapOptions, MmapRaw};

use super::layout::{HAMI_MAGIC, HAMI_SIZE, HamiRegion};
use super::{Opened, open_any};
use crate::error::ShmError;
use crate::file::FileOptions;
use crate::format::Format;

/// What a round needs to know of one region (read from a copy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// Its devices' UUIDs, in index order (empty ones are skipped).
    pub uuids: Vec<String>,
    /// `priority`: 0 high, anything else normal.
    pub priority: i32,
    /// `recent_kernel` before this round.
    pub recent_kernel: i32,
}

/// What a round decides for one region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Block its launches (`recent_kernel = -1`), or lift a block.
    pub block: bool,
    /// `utilization_switch`: the GPU is shared.
    pub shared: bool,
}

/// What [`HamiRegion::apply`] changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Changed {
    /// Some(true): blocked now; Some(false): its block was lifted.
    pub blocked: Option<bool>,
    /// The new `utilization_switch`, when it changed.
    pub switch: Option<i32>,
}

/// HAMi's priorities are 0 and 1; anything else counts as 1.
fn level(priority: i32) -> usize {
    usize::from(priority != 0)
}

/// One round's verdicts, one per region, in order.
pub fn observe(regions: &[Seen]) -> Vec<Verdict> {
    let mut active: HashMap<&str, [u32; 2]> = HashMap::new();
    for r in regions.iter().filter(|r| r.recent_kernel > 1) {
        for u in r.uuids.iter().filter(|u| !u.is_empty()) {
            active.entry(u.as_str()).or_default()[level(r.priority)] += 1;
        }
    }
    regions
        .iter()
        .map(|r| {
            let p = level(r.priority);
            let on = r
                .uuids
                .iter()
                .filter(|u| !u.is_empty())
                .find_map(|u| active.get(u.as_str()));
            let higher = on.is_some_and(|n| n[..p].iter().any(|&k| k > 0));
            Verdict {
                block: higher,
                shared: higher || on.is_some_and(|n| n[p] > 1),
            }
        })
        .collect()
}

impl HamiRegion {
    /// Writes one round's verdict: the decrement, the block or its lift,
    /// the switch.
    pub fn apply(&self, v: Verdict) -> Changed {
        let mut changed = Changed::default();
        let _ = self
            .recent_kernel
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |k| {
                (k > 0).then(|| k - 1)
            });
        let flip = |from_blocked: bool, to: i32| {
            self.recent_kernel
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |k| {
                    ((k < 0) == from_blocked).then_some(to)
                })
                .is_ok()
        };
        if v.block && flip(false, -1) {
            changed.blocked = Some(true);
        } else if !v.block && flip(true, 0) {
            changed.blocked = Some(false);
        }
        let switch = i32::from(v.shared);
        if self.utilization_switch.swap(switch, Ordering::AcqRel) != switch {
            changed.switch = Some(switch);
        }
        changed
    }
}

/// Applies `v` to the region file at `path`: a vgpu region through
/// [`open_any`], a HAMi-core file through a writable mapping of its HAMi
/// part (HAMi's monitor writes both). Nothing else in the file changes.
pub fn apply_to_file(path: &Path, v: Verdict) -> Result<Changed, ShmError> {
    if let Format::HamiCore { .. } = super::probe(path)? {
        return HamiCoreRw::open(path).map(|f| f.hami().apply(v));
    }
    match open_any(path, true)? {
        Opened::Vgpu(r) => Ok(r.hami().map(|h| h.apply(v)).unwrap_or_default()),
        Opened::HamiCore(_) => Ok(Changed::default()),
    }
}

/// A HAMi-core file's HAMi part, mapped for writing; a SIGBUS in it (the
/// file truncated under us) is repaired, not fatal (`sigbus.rs`).
struct HamiCoreRw {
    _watch: Option<crate::sigbus::Watch>,
    map: MmapRaw,
}

impl HamiCoreRw {
    fn open(path: &Path) -> Result<HamiCoreRw, ShmError> {
        let opts = FileOptions {
            create: None,
            any_owner: true,
        };
        let (file, _) = crate::file::open(path, opts)?;
        let len = super::check_hami_len(&file, path)?;
        let map = MmapOptions::new()
            .len(HAMI_SIZE)
            .map_raw(&file)
            .map_err(|e| ShmError::io(path, "mmap", e))?;
        let rw = HamiCoreRw {
            _watch: crate::sigbus::Watch::new(map.as_ptr(), HAMI_SIZE),
            map,
        };
        if rw.hami().initialized_flag.load(Ordering::Acquire) != HAMI_MAGIC {
            return Err(ShmError::Refused {
                path: path.to_path_buf(),
                why: crate::Refusal::Truncated { len },
            });
        }
        Ok(rw)
    }

    fn hami(&self) -> &HamiRegion {
        // SAFETY: the mapping is HAMI_SIZE bytes of a file at least that
        // long, page-aligned, and borrowed from self; HamiRegion is
        // repr(C), atomics only, valid for any bit pattern.
        unsafe { &*(self.map.as_ptr() as *const HamiRegion) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(uuids: &[&str], priority: i32, recent_kernel: i32) -> Seen {
        Seen {
            uuids: uuids.iter().map(|u| u.to_string()).collect(),
            priority,
            recent_kernel,
        }
    }

    fn v(block: bool, shared: bool) -> Verdict {
        Verdict { block, shared }
    }

    #[test]
    fn a_high_priority_container_blocks_a_normal_one_on_its_gpu_only() {
        let got = observe(&[
            seen(&["GPU-a"], 0, 2),
            seen(&["GPU-a"], 1, 2),
            seen(&["GPU-b"], 1, 2),
        ]);
        assert_eq!(got, [v(false, false), v(true, true), v(false, false)]);
    }

    #[test]
    fn two_of_one_priority_share_and_neither_is_blocked() {
        let got = observe(&[seen(&["GPU-a"], 1, 2), seen(&["GPU-a"], 1, 2)]);
        assert_eq!(got, [v(false, true), v(false, true)]);
    }

    #[test]
    fn a_container_going_idle_stops_counting() {
        // 1 decrements to 0 this round: not active; a blocked one (-1)
        // counts neither.
        let got = observe(&[
            seen(&["GPU-a"], 0, 1),
            seen(&["GPU-a"], 1, 2),
            seen(&["GPU-a"], 0, -1),
        ]);
        assert_eq!(got, [v(false, false), v(false, false), v(false, false)]);
    }

    #[test]
    fn the_first_busy_device_decides_as_in_hami() {
        // Priority 0 is active on GPU-b only; the normal container uses
        // GPU-a (where a normal one is also active) first: HAMi looks no
        // further than GPU-a.
        let got = observe(&[
            seen(&["GPU-b"], 0, 2),
            seen(&["GPU-a"], 1, 2),
            seen(&["", "GPU-a", "GPU-b"], 1, 2),
        ]);
        assert_eq!(got[2], v(false, true));
    }

    #[test]
    fn apply_decrements_blocks_lifts_and_switches() {
        let h = crate::Region::anonymous().unwrap();
        let h = h.hami().unwrap();
        h.recent_kernel.store(2, Ordering::Relaxed);
        h.utilization_switch.store(1, Ordering::Relaxed);
        let c = h.apply(v(false, false));
        assert_eq!(h.recent_kernel.load(Ordering::Relaxed), 1);
        assert_eq!(
            c,
            Changed {
                blocked: None,
                switch: Some(0)
            }
        );
        let c = h.apply(v(true, true));
        assert_eq!(h.recent_kernel.load(Ordering::Relaxed), -1);
        assert_eq!(c.blocked, Some(true));
        assert_eq!(h.apply(v(true, true)), Changed::default(), "no change");
        // A launch's mark never lifts a block.
        h.mark_launch(1);
        assert!(h.blocked());
        assert_eq!(h.apply(v(false, true)).blocked, Some(false));
        assert_eq!(h.recent_kernel.load(Ordering::Relaxed), 0);
    }
}

//! This process's attachment to the container's region: its slot, and the
//! map from its CUDA ordinals to the region's UUID-keyed device entries.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use parking_lot::Mutex;
use vgpu_shm::{DeviceInfo, Limits, ProcId, Region, format_uuid};

use crate::config::Config;

const NO_SLOT: usize = usize::MAX;
/// CUDA ordinals whose device entry we cache.
const ORDINALS: usize = 64;

pub struct Attach {
    pub region: Region,
    config: Config,
    slot: AtomicUsize,
    claiming: Mutex<()>,
    /// CUDA ordinal -> device entry index + 1 (0: not looked up yet).
    ordinals: [AtomicU32; ORDINALS],
}

impl Attach {
    pub fn new(region: Region, config: Config) -> Attach {
        Attach {
            region,
            config,
            slot: AtomicUsize::new(NO_SLOT),
            claiming: Mutex::new(()),
            ordinals: [const { AtomicU32::new(0) }; ORDINALS],
        }
    }

    /// Our slot, claimed on first use (and again in a forked child).
    pub fn slot(&self) -> Option<usize> {
        let s = self.slot.load(Ordering::Acquire);
        if s != NO_SLOT {
            return Some(s);
        }
        let _one_claimer = self.claiming.lock();
        let s = self.slot.load(Ordering::Acquire);
        if s != NO_SLOT {
            return Some(s);
        }
        match self.region.claim_slot(&ProcId::current()) {
            Ok(i) => {
                self.slot.store(i, Ordering::Release);
                Some(i)
            }
            Err(e) => {
                crate::warn_once!("{e}: this process is not counted");
                None
            }
        }
    }

    /// Frees the slots of dead processes; returns how many. `on_gpu` lists
    /// the host pids the driver still holds memory for (a killed process's
    /// memory is freed moments after it is gone); their slots wait.
    pub fn reclaim_dead(&self, on_gpu: &[u32]) -> u32 {
        let still_held = |pid: i32| on_gpu.contains(&(pid as u32));
        self.region
            .reclaim_dead_unless(ProcId::current().pidns, still_held)
            .unwrap_or_else(|e| {
                crate::warn_once!("{e}");
                0
            })
    }

    /// The device entry of CUDA ordinal `ordinal`; `info` is asked only the
    /// first time, to register the device.
    pub fn device(&self, ordinal: i32, info: impl FnOnce() -> Option<DeviceInfo>) -> Option<usize> {
        let n = usize::try_from(ordinal).ok()?;
        if let Some(cached) = self
            .ordinals
            .get(n)
            .map(|c| c.load(Ordering::Acquire))
            .filter(|&c| c != 0)
        {
            return Some(cached as usize - 1);
        }
        let index = self.register(n, &info()?)?;
        if let Some(c) = self.ordinals.get(n) {
            c.store(index as u32 + 1, Ordering::Release);
        }
        Some(index)
    }

    /// The device entry of a GPU seen through NVML (`index` is NVML's).
    /// Registers it when the environment has limits for it, so that
    /// nvidia-smi shows the quota before any CUDA process ran.
    pub fn device_by_uuid(&self, index: u32, info: &DeviceInfo) -> Option<usize> {
        if let Some(i) = self.region.find_device(&info.uuid) {
            return Some(i);
        }
        let n = index as usize;
        if self.config.mem_limit_for(n) == 0 && self.config.sm_limit_for(n) == 0 {
            return None;
        }
        self.register(n, info)
    }

    fn register(&self, ordinal: usize, info: &DeviceInfo) -> Option<usize> {
        let wanted = Limits {
            mem: self.config.mem_limit_for(ordinal),
            sm: self.config.sm_limit_for(ordinal),
            policy: self.config.policy as u32,
        };
        match self.region.register_device(info, wanted) {
            Ok(reg) => {
                if reg.conflict {
                    crate::warn_once!(
                        "the environment asks for limits (memory {} bytes, SM {}%) on {} that differ from those already in region {} (memory {} bytes, SM {}%); the region's apply",
                        wanted.mem,
                        wanted.sm,
                        format_uuid(&info.uuid),
                        self.region.path().display(),
                        reg.limits.mem,
                        reg.limits.sm
                    );
                }
                Some(reg.index)
            }
            Err(e) => {
                crate::warn_once!("{e}: device {} is not limited", format_uuid(&info.uuid));
                None
            }
        }
    }

    /// In a forked child: the parent's slot is not ours.
    pub fn after_fork_child(&self) {
        self.slot.store(NO_SLOT, Ordering::Release);
        if self.claiming.is_locked() {
            // SAFETY: a forked child runs one thread; a lock held at fork
            // time belonged to a parent thread that does not exist here.
            unsafe { self.claiming.force_unlock() };
        }
    }
}

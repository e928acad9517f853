//! A copy of the HAMi part as a monitor reads it: every figure HAMi's,
//! Volcano's and KAI's monitors export, read once, bounded (a garbage
//! `proc_num` is clamped, never trusted), and each process slot read under
//! its seqlock.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use super::layout::{HAMI_DEVICES, HAMI_PROCS, HamiProc, HamiRegion};

/// The HAMi part of a region, read once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// `major_version`.
    pub major: u32,
    /// `minor_version`.
    pub minor: u32,
    /// `device_num`.
    pub device_num: u64,
    /// Every device index that has a UUID or a limit, in index order.
    pub devices: Vec<Device>,
    /// `proc_num` as stored (a monitor iterates `procs[0..proc_num]`).
    pub proc_num: i32,
    /// `procs[0..proc_num]`, `proc_num` clamped to 0..=1024.
    pub procs: Vec<Proc>,
    /// `utilization_switch`: 1 when the SM limit should apply.
    pub utilization_switch: i32,
    /// `recent_kernel`: -1 while the monitor blocks the container.
    pub recent_kernel: i32,
    /// `priority`: 0 high, 1 normal.
    pub priority: i32,
    /// `last_kernel_time`, Unix seconds.
    pub last_kernel_time: u64,
}

/// One device index of the HAMi part (the container's device number).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// The index (0..16): `uuids[index]`, `limit[index]`, `used[index]`.
    pub index: usize,
    /// The NVML UUID string (`GPU-...`), empty when none.
    pub uuid: String,
    /// Memory limit, bytes (0: none).
    pub limit: u64,
    /// SM limit, percent (0 and 100: none).
    pub sm_limit: u64,
}

/// One process slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proc {
    /// The pid in the container.
    pub pid: i32,
    /// The host pid (0 while unknown).
    pub hostpid: i32,
    /// 1 running, 2 suspended.
    pub status: i32,
    /// Per device index.
    pub devices: [ProcDevice; HAMI_DEVICES],
    /// Whether the slot was being written every time it was read (its
    /// figures may mix two moments).
    pub torn: bool,
}

/// One device of one process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcDevice {
    /// `used[dev].context_size`.
    pub context_size: u64,
    /// `used[dev].module_size`.
    pub module_size: u64,
    /// `used[dev].data_size`.
    pub data_size: u64,
    /// `used[dev].total`.
    pub total: u64,
    /// `monitorused[dev]`: NVML's per-process used memory.
    pub monitorused: u64,
    /// `device_util[dev].sm_util`, percent.
    pub sm_util: u64,
}

/// How often a slot being written is read again before its figures are
/// taken as they are.
const SEQ_TRIES: u32 = 64;

impl HamiRegion {
    /// Reads the region once.
    pub fn snapshot(&self) -> Snapshot {
        let devices = (0..HAMI_DEVICES)
            .map(|i| Device {
                index: i,
                uuid: self.uuid(i),
                limit: self.limit[i].load(Ordering::Acquire),
                sm_limit: self.sm_limit[i].load(Ordering::Acquire),
            })
            .filter(|d| !d.uuid.is_empty() || d.limit != 0)
            .collect();
        let proc_num = self.proc_num.load(Ordering::Acquire);
        let n = usize::try_from(proc_num).unwrap_or(0).min(HAMI_PROCS);
        Snapshot {
            major: self.major_version.load(Ordering::Acquire),
            minor: self.minor_version.load(Ordering::Acquire),
            device_num: self.device_num.load(Ordering::Acquire),
            devices,
            proc_num,
            procs: self.procs[..n].iter().map(read_proc).collect(),
            utilization_switch: self.utilization_switch.load(Ordering::Acquire),
            recent_kernel: self.recent_kernel.load(Ordering::Acquire),
            priority: self.priority.load(Ordering::Acquire),
            last_kernel_time: self.last_kernel_time.load(Ordering::Acquire),
        }
    }

    /// `uuids[index]` as text, up to its NUL (non-UTF-8 bytes replaced).
    pub fn uuid(&self, index: usize) -> String {
        let bytes: Vec<u8> = self.uuids[index]
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .take_while(|&b| b != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

fn read_proc(p: &HamiProc) -> Proc {
    let mut torn = true;
    let mut out = read_fields(p);
    for _ in 0..SEQ_TRIES {
        let before = p.seqlock.load(Ordering::Acquire);
        if before & 1 == 1 {
            std::thread::yield_now();
            continue;
        }
        out = read_fields(p);
        if p.seqlock.load(Ordering::Acquire) == before {
            torn = false;
            break;
        }
    }
    Proc { torn, ..out }
}

fn read_fields(p: &HamiProc) -> Proc {
    let devices = std::array::from_fn(|d| {
        let u = &p.used[d];
        ProcDevice {
            context_size: u.context_size.load(Ordering::Acquire),
            module_size: u.module_size.load(Ordering::Acquire),
            data_size: u.data_size.load(Ordering::Acquire),
            total: u.total.load(Ordering::Acquire),
            monitorused: p.monitorused[d].load(Ordering::Acquire),
            sm_util: p.device_util[d].sm_util.load(Ordering::Acquire),
        }
    });
    Proc {
        pid: p.pid.load(Ordering::Acquire),
        hostpid: p.hostpid.load(Ordering::Acquire),
        status: p.status.load(Ordering::Acquire),
        devices,
        torn: false,
    }
}

//! HAMi's region layout 1.2, byte for byte (`/work/shared/HAMI-REGION.md`
//! is the contract; `include/hami_region.h` spells it in C). x86-64,
//! little-endian, `sizeof` = [`HAMI_SIZE`].
//!
//! Every field is an atomic: the region is shared with the node's monitor,
//! which writes `recent_kernel`, `utilization_switch` and sometimes the
//! limits, and with the other processes of the container. The one `unsafe`
//! step (turning a mapping into a `&HamiRegion`) lives in `region.rs`.
#![forbid(unsafe_code)]

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicI32, AtomicU8, AtomicU32, AtomicU64};

/// `initialized_flag` of an initialised region.
pub const HAMI_MAGIC: i32 = 19_920_718;
/// The layout's major version.
pub const HAMI_MAJOR: u32 = 1;
/// The layout's minor version.
pub const HAMI_MINOR: u32 = 2;
/// Devices in the layout (`CUDA_DEVICE_MAX_COUNT`).
pub const HAMI_DEVICES: usize = 16;
/// Process slots in the layout (`SHARED_REGION_MAX_PROCESS_NUM`).
pub const HAMI_PROCS: usize = 1024;
/// Bytes of a UUID string (`NVML_DEVICE_UUID_V2_BUFFER_SIZE`).
pub const HAMI_UUID_LEN: usize = 96;
/// `sizeof(shared_region_t)` of layout 1.2.
pub const HAMI_SIZE: usize = 2_008_952;
/// `status` of a running process.
pub const HAMI_STATUS_RUNNING: i32 = 1;

/// A `sem_t` (32 bytes on x86-64), opaque.
pub type Sem = [AtomicU64; 4];

/// One device's bytes in one process (`device_memory_t`, 64 bytes).
#[repr(C)]
pub struct HamiUsed {
    /// The process's context estimate.
    pub context_size: AtomicU64,
    /// Module memory (HAMi-core never writes it).
    pub module_size: AtomicU64,
    /// Allocations.
    pub data_size: AtomicU64,
    /// Unused by HAMi-core.
    pub offset: AtomicU64,
    /// `context_size + module_size + data_size`.
    pub total: AtomicU64,
    /// Zero.
    pub unused: [AtomicU64; 3],
}

/// One device's utilisation by one process (`device_util_t`, 48 bytes).
#[repr(C)]
pub struct HamiUtil {
    /// Decoder utilisation, percent (vgpu writes 0).
    pub dec_util: AtomicU64,
    /// Encoder utilisation, percent (vgpu writes 0).
    pub enc_util: AtomicU64,
    /// NVML SM utilisation of the process, percent (0-100).
    pub sm_util: AtomicU64,
    /// Zero.
    pub unused: [AtomicU64; 3],
}

/// One process (`shrreg_proc_slot_t`, 1960 bytes).
#[repr(C)]
pub struct HamiProc {
    /// The pid as seen in the container; 0 for a free slot.
    pub pid: AtomicI32,
    /// The pid NVML reports (the host's); 0 while unknown.
    pub hostpid: AtomicI32,
    /// Bytes per device.
    pub used: [HamiUsed; HAMI_DEVICES],
    /// NVML's per-process used memory per device.
    pub monitorused: [AtomicU64; HAMI_DEVICES],
    /// Utilisation per device.
    pub device_util: [HamiUtil; HAMI_DEVICES],
    /// [`HAMI_STATUS_RUNNING`], or 2 (suspended).
    pub status: AtomicI32,
    /// Padding.
    pub _pad: AtomicI32,
    /// Odd while a writer is filling the slot.
    pub seqlock: AtomicU64,
    /// Zero.
    pub unused: [AtomicU64; 2],
}

/// The whole region (`shared_region_t`).
#[repr(C)]
pub struct HamiRegion {
    /// [`HAMI_MAGIC`] once initialised (written last).
    pub initialized_flag: AtomicI32,
    /// [`HAMI_MAJOR`].
    pub major_version: AtomicU32,
    /// [`HAMI_MINOR`].
    pub minor_version: AtomicU32,
    /// Unused.
    pub sm_init_flag: AtomicI32,
    /// Holder of `sem` (HAMi-core's lock; vgpu never takes it).
    pub owner_pid: AtomicU64,
    /// A process-shared semaphore, initialised to 1 so that a HAMi-core
    /// process that attaches never waits on it forever.
    pub sem: Sem,
    /// Devices in `uuids`.
    pub device_num: AtomicU64,
    /// NVML UUID strings (`GPU-...`), NUL-terminated.
    pub uuids: [[AtomicU8; HAMI_UUID_LEN]; HAMI_DEVICES],
    /// Memory limit per device, bytes (0: none).
    pub limit: [AtomicU64; HAMI_DEVICES],
    /// SM limit per device, percent (0 and 100: none).
    pub sm_limit: [AtomicU64; HAMI_DEVICES],
    /// Process slots; `procs[0..proc_num]` are in use.
    pub procs: [HamiProc; HAMI_PROCS],
    /// Slots in use, packed at the front.
    pub proc_num: AtomicI32,
    /// Written by the monitor: 1 when the GPU is shared and the SM limit
    /// should apply, 0 when it need not.
    pub utilization_switch: AtomicI32,
    /// The container marks it 2 at its launches; the monitor decrements it,
    /// and writes -1 to block the container's launches.
    pub recent_kernel: AtomicI32,
    /// `CUDA_TASK_PRIORITY` of the container's first process (0 high, 1).
    pub priority: AtomicI32,
    /// Unix seconds of the container's last launch.
    pub last_kernel_time: AtomicU64,
    /// A second process-shared semaphore (HAMi-core's; initialised to 1).
    pub sem_postinit: Sem,
}

const _: () = {
    assert!(size_of::<HamiUsed>() == 64);
    assert!(size_of::<HamiUtil>() == 48);
    assert!(size_of::<HamiProc>() == 1960);
    assert!(offset_of!(HamiProc, used) == 8);
    assert!(offset_of!(HamiProc, monitorused) == 1032);
    assert!(offset_of!(HamiProc, device_util) == 1160);
    assert!(offset_of!(HamiProc, status) == 1928);
    assert!(offset_of!(HamiProc, seqlock) == 1936);
    assert!(offset_of!(HamiRegion, owner_pid) == 16);
    assert!(offset_of!(HamiRegion, sem) == 24);
    assert!(offset_of!(HamiRegion, device_num) == 56);
    assert!(offset_of!(HamiRegion, uuids) == 64);
    assert!(offset_of!(HamiRegion, limit) == 1600);
    assert!(offset_of!(HamiRegion, sm_limit) == 1728);
    assert!(offset_of!(HamiRegion, procs) == 1856);
    assert!(offset_of!(HamiRegion, proc_num) == 2_008_896);
    assert!(offset_of!(HamiRegion, utilization_switch) == 2_008_900);
    assert!(offset_of!(HamiRegion, recent_kernel) == 2_008_904);
    assert!(offset_of!(HamiRegion, priority) == 2_008_908);
    assert!(offset_of!(HamiRegion, last_kernel_time) == 2_008_912);
    assert!(offset_of!(HamiRegion, sem_postinit) == 2_008_920);
    assert!(size_of::<HamiRegion>() == HAMI_SIZE);
};

//! The binary layout of the shared region.
//!
//! Every field is an atomic, so the region is read and written through shared
//! references only; the single `unsafe` step (turning the mapping into a
//! `&Header`) lives in `region.rs`. The same layout is spelled in C in
//! `include/vgpu_shm.h`; the const asserts below and `tests/shm_layout.rs`
//! keep the two in step.
//!
//! A region file (layout 2.x) is HAMi's layout 1.2 (`hami::layout`, what
//! the node monitors of HAMi, Volcano and KAI read), padded to
//! [`VGPU_OFFSET`], then vgpu's own part: one [`Header`] (which holds the
//! device table), then [`MAX_SLOTS`] [`ProcSlot`]s; [`FILE_SIZE`] bytes in
//! all. The `VGPUSHM` header at [`VGPU_OFFSET`] is what tells vgpu the file
//! is its own. Layout 1.x (vgpu before issue 11) was vgpu's part alone, at
//! offset 0 ([`LEGACY_SIZE`] bytes). Slots have fixed indices and are never
//! moved.
#![forbid(unsafe_code)]

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicI32, AtomicU8, AtomicU32, AtomicU64};

/// `"VGPUSHM\0"` read as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"VGPUSHM\0");
/// Bumped when a field moves or changes meaning; readers refuse other majors.
/// 2: the part moved behind HAMi's layout, to [`VGPU_OFFSET`].
pub const VERSION_MAJOR: u32 = 2;
/// Bumped when fields are added in reserved space; readers accept any minor.
pub const VERSION_MINOR: u32 = 10;
/// The major version of layout 1.x, vgpu's part alone at offset 0.
pub const LEGACY_MAJOR: u32 = 1;
/// Device entries in a region: GPUs a container can use.
pub const MAX_DEVICES: usize = 16;
/// Process slots in a region: processes of a container counted at once.
pub const MAX_SLOTS: usize = 1024;
/// Kinds of counted bytes ([`Kind`]).
pub const NUM_KINDS: usize = 5;

/// `Header::state` once the creator has finished initialising the file.
pub const STATE_READY: u32 = 1;

/// `ProcSlot::flags`: the host pid was read from the kernel (`NSpid` in a
/// /proc of the initial pid namespace), not inferred from NVML's list.
pub const SLOT_HOST_PID_VERIFIED: u32 = 1;

/// What a counted byte is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Kind {
    /// `cuMemAlloc`, `cuMemAllocPitch`, `cuMemAllocManaged`.
    Buffer = 0,
    /// CUDA arrays and mipmapped arrays.
    Array = 1,
    /// Physical memory from `cuMemCreate` (expandable segments, NCCL).
    Vmm = 2,
    /// Stream-ordered allocations (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`).
    Pool = 3,
    /// Context and library overhead, reconciled against NVML.
    Context = 4,
}

impl Kind {
    /// Every kind, in counter order.
    pub const ALL: [Kind; NUM_KINDS] = [
        Kind::Buffer,
        Kind::Array,
        Kind::Vmm,
        Kind::Pool,
        Kind::Context,
    ];

    /// The kind's name in `vgpuctl` output.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Buffer => "buffer",
            Kind::Array => "array",
            Kind::Vmm => "vmm",
            Kind::Pool => "pool",
            Kind::Context => "context",
        }
    }
}

/// One physical GPU, keyed by UUID, with its limits and its compute bucket.
#[repr(C)]
pub struct DeviceEntry {
    /// The 16 bytes `cuDeviceGetUuid` returns.
    pub uuid: [AtomicU8; 16],
    /// 0: free entry, 1: in use.
    pub in_use: AtomicU32,
    /// Percent of the device's compute, 0 = unlimited.
    pub sm_limit: AtomicU32,
    /// Bytes, 0 = unlimited.
    pub mem_limit: AtomicU64,
    /// Physical memory of the device.
    pub total_mem: AtomicU64,
    /// Streaming multiprocessors of the device.
    pub sm_count: AtomicU32,
    /// `GPU_CORE_UTILIZATION_POLICY`: 0 default, 1 force, 2 disable.
    pub policy: AtomicU32,
    /// The compute bucket: a GCRA "theoretical arrival time" on
    /// `CLOCK_MONOTONIC`, in nanoseconds.
    pub tat_ns: AtomicU64,
    /// The controller's multiplier on the refill rate, ×1000 (0 reads as 1000).
    pub rate_scale_milli: AtomicU32,
    /// The container's last measured utilisation of this device, ×1000.
    pub util_milli: AtomicU32,
    /// The elected watcher: `pid << 32 | heartbeat` (monotonic seconds).
    pub leader: AtomicU64,
    /// Launches that had to wait for the bucket (tells the controller the
    /// limit, not the workload, is what holds utilisation down).
    pub waits: AtomicU64,
    /// What a new CUDA context costs on this device, as last measured
    /// (0 until then): reserved before a context is created.
    pub context_bytes: AtomicU64,
    /// The device's index in the HAMi part, plus one (0: none yet; 2.0).
    pub hami_index: AtomicU32,
    /// Zero: alignment.
    pub _pad: AtomicU32,
    /// The memory limit last written into the HAMi part's `limit` (2.0):
    /// a value there that differs was written by a monitor.
    pub hami_limit_seen: AtomicU64,
    /// The same for `sm_limit` (2.0).
    pub hami_sm_seen: AtomicU64,
    /// Requests refused with `CUDA_ERROR_OUT_OF_MEMORY` (2.0).
    pub oom_denials: AtomicU64,
    /// Nanoseconds launches spent waiting for the bucket (2.0).
    pub wait_ns: AtomicU64,
    /// Where the container's turns on the device begin: its windows open
    /// at this CLOCK_MONOTONIC time plus whole periods (0: not chosen yet;
    /// 2.1, `limiter/turns.rs`).
    pub turn_anchor_ns: AtomicU64,
    /// When the anchor last moved (CLOCK_MONOTONIC ns; 2.1).
    pub turn_moved_ns: AtomicU64,
    /// GPU time (ns) the container leaves unspent of each period's share
    /// while its windows run into the next one's (2.1).
    pub turn_cut_ns: AtomicU64,
    /// GPU time (ns) the bucket has admitted, ever (2.1): what the
    /// container can have used, against which NVML's figure is checked.
    pub admitted_ns: AtomicU64,
    /// `TURNS_PAUSED` while more than one process of the container uses
    /// the device: they would share each window and time-slice within it,
    /// so the bucket paces them as before turns (2.1).
    pub turn_flags: AtomicU64,
    /// How full the container's launches keep the GPU in its window when
    /// nothing else runs there: their cost over the time they span, ×1000
    /// (0: not measured yet; 2.2). A window holds its share of the period
    /// in span, not in cost.
    pub turn_fill_milli: AtomicU64,
    /// When a probe of the container last ran beside another context
    /// (CLOCK_MONOTONIC ns, 0: never; 2.2). For 10 s after it, NVML's
    /// per-process figures are not the container's share.
    pub turn_shared_ns: AtomicU64,
    /// GPU time (ns) the launches the bucket admitted typically hold:
    /// `admitted_ns` at each shape's typical time instead of its cost,
    /// the least of its newest timings near their floor (2.3). Beside
    /// other containers the region shows this, or `admitted_ns` where it
    /// is more (older libraries add nothing here).
    pub held_ns: AtomicU64,
    /// When the device's leader last found the container alone on the
    /// device: only its processes in NVML's list of compute processes,
    /// leaving less than a context of the memory allocated there unaccounted
    /// (CLOCK_MONOTONIC ns, 0: not alone, or not known; 2.4). While it is
    /// recent ([`TURN_ALONE_NS`]), a probe of the container's windows that
    /// lost time lost it to the container's own work on another stream.
    pub alone_ns: AtomicU64,
    /// When the device's leader last found, on the node's SM board, that
    /// the limits of every busy container on the device leave room for
    /// them to run side by side (CLOCK_MONOTONIC ns, 0: not, or not known;
    /// 2.5). While it is recent ([`TURN_PACED_NS`]), the container paces
    /// its share evenly beside others instead of taking turns.
    pub paced_ns: AtomicU64,
    /// Nanoseconds the container's processes spent in synchronisations
    /// while an SM limit was in force (2.5): a loop that waits there most
    /// of the time, yet gets less than its limit, is short of the GPU.
    pub sync_wait_ns: AtomicU64,
    /// The SM share (percent) a container without an SM limit takes while
    /// limited containers are busy on the device: what their limits leave
    /// (0: none, it runs free; 2.6, `limiter/rest.rs`). Its launches then
    /// go through the bucket as a limited container's do.
    pub rest_percent: AtomicU64,
    /// Synchronisations the container's processes made while an SM limit
    /// was in force (2.7): over the GPU time admitted, a loop's steps,
    /// which tell how many of them a window in turns would hold.
    pub syncs: AtomicU64,
    /// When the device's leader last found, on the node's SM board, that
    /// every other busy container on the device is one without an SM
    /// limit taking the rest (CLOCK_MONOTONIC ns, 0: not; 2.7). While it
    /// is recent ([`TURN_PACED_NS`]), the container's windows yield to
    /// the rest's as its queue hides them from it (the library's
    /// `limiter/judge.rs`).
    pub rest_beside_ns: AtomicU64,
    /// When the device's leader last found, on the node's SM board, a busy
    /// container with an SM limit beside this one, itself limited: both
    /// take turns (CLOCK_MONOTONIC ns, 0: not; 2.8). While it is recent
    /// ([`TURN_PACED_NS`]), the steps at the end of the container's
    /// windows are timed (the library's `limiter/probes.rs`).
    pub limited_beside_ns: AtomicU64,
    /// The period (ns) of the container's turns on the device, as its
    /// leader chose it from the node's SM board: longer than the
    /// configured one where a neighbour's short steps ask for it (0: the
    /// configured one; 2.9, the library's `limiter/period.rs`).
    pub turn_period_ns: AtomicU64,
}

/// The period of a container's turns on a device (`turn_anchor_ns` plus
/// whole periods opens each window; the library's `limiter/turns.rs`).
pub const TURN_PERIOD_NS: u64 = 100_000_000;

/// [`DeviceEntry::turn_flags`]: several processes of the container use the
/// device, so its turns are paused.
pub const TURNS_PAUSED: u64 = 1;
/// [`DeviceEntry::turn_flags`]: the device's leader places the container's
/// turns from the node's SM board, so its windows do not move on their
/// probes' word (the library's `limiter/tiling.rs`; a library from before
/// it ignores the bit).
pub const TURNS_TILED: u64 = 2;
/// [`DeviceEntry::turn_flags`], read only with [`TURNS_TILED`] and
/// cleared with it: the board's shares leave room after each of the
/// container's placed windows (twice the guard and two steps of its share
/// or more), so it keeps none of its share back for its end (the
/// library's `limiter/tiling.rs` and `limiter/cut.rs`; a library from
/// before it ignores the bit and keeps its floor).
pub const TURNS_ROOMY: u64 = 4;
/// How long after [`DeviceEntry::turn_shared_ns`] the container counts as
/// sharing the device.
pub const TURN_SHARED_NS: u64 = 10_000_000_000;
/// How long after [`DeviceEntry::alone_ns`] the container counts as alone
/// on the device: a few of its leader's looks (one every half second), so
/// that a leader that died leaves no stale word (a successor takes over
/// after 3 s; windows in between are judged as beside others).
pub const TURN_ALONE_NS: u64 = 2_000_000_000;
/// How long after [`DeviceEntry::paced_ns`] the container paces beside
/// others: as [`TURN_ALONE_NS`].
pub const TURN_PACED_NS: u64 = TURN_ALONE_NS;

/// One process of the container.
#[repr(C)]
pub struct ProcSlot {
    /// 0 when the slot is free.
    pub pid: AtomicI32,
    /// The pid NVML reports for this process, 0 while unknown.
    pub host_pid: AtomicI32,
    /// Field 22 of `/proc/<pid>/stat`: tells a reused pid from its owner.
    pub start_time: AtomicU64,
    /// Inode of `/proc/<pid>/ns/pid` (only slots of our namespace are checked).
    pub pidns: AtomicU64,
    /// When the slot was claimed (Unix seconds).
    pub claimed_unix_s: AtomicU64,
    /// Last NVML SM utilisation of this process per device, percent.
    pub sm_util: [AtomicU32; MAX_DEVICES],
    /// Bytes held per device and kind.
    pub usage: [[AtomicU64; NUM_KINDS]; MAX_DEVICES],
    /// When a reclaim first found the owner dead (CLOCK_MONOTONIC ms; 0:
    /// never). A dead owner whose host pid is unknown keeps its slot for a
    /// grace period: the driver may still be freeing its memory.
    pub dead_since_ms: AtomicU64,
    /// The owner's watcher writes CLOCK_MONOTONIC ms here every tick (since
    /// 1.1): a reclaimer that cannot see the owner in any /proc judges it
    /// by this and by NVML.
    pub heartbeat_ms: AtomicU64,
    /// [`SLOT_HOST_PID_VERIFIED`] (since 1.1).
    pub flags: AtomicU32,
    /// Zero: alignment.
    pub _pad: AtomicU32,
    /// NVML's used memory of this process per device entry, bytes, as
    /// last sampled (2.0; what monitors call `monitorused`).
    pub nvml_used: [AtomicU64; MAX_DEVICES],
    /// The device entry (index + 1) whose [`ProcSlot::host_gap_ns`] this
    /// process counts: the one device it uses (0: none yet; 2.10).
    pub gap_device: AtomicU64,
    /// Nanoseconds the process's threads took, under an SM limit, from a
    /// synchronisation's return to their next launch (2.10): time the
    /// process had no work for the GPU, a server waiting for requests or
    /// host work. A container that waits for the GPU yet gets less than
    /// its limit is short of it only over the time it had work (the
    /// library's `limiter/shortfall.rs`).
    pub host_gap_ns: AtomicU64,
    /// Zero; room for fields of later minor versions.
    pub _reserved: [AtomicU64; 15],
}

/// The start of a region file: its identity, its geometry, and the device
/// table.
#[repr(C)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: AtomicU64,
    /// [`VERSION_MAJOR`] of the library that created the file.
    pub version_major: AtomicU32,
    /// [`VERSION_MINOR`] of the library that created the file.
    pub version_minor: AtomicU32,
    /// Size of the whole file in bytes.
    pub size: AtomicU64,
    /// [`HEADER_SIZE`].
    pub header_size: AtomicU32,
    /// [`SLOT_SIZE`].
    pub slot_size: AtomicU32,
    /// [`MAX_DEVICES`].
    pub max_devices: AtomicU32,
    /// [`MAX_SLOTS`].
    pub max_slots: AtomicU32,
    /// [`STATE_READY`] once initialised.
    pub state: AtomicU32,
    /// One past the highest slot index ever claimed: bounds every scan.
    pub slot_hwm: AtomicU32,
    /// When the file was initialised (Unix seconds).
    pub created_unix_s: AtomicU64,
    /// Slots reclaimed from dead processes since creation.
    pub reclaims: AtomicU64,
    /// `/proc/sys/kernel/random/boot_id` of the boot that last used the
    /// region (since 1.1): slots and bucket state of another boot are reset.
    pub boot_id: [AtomicU64; 2],
    /// A random value set at each initialisation (since 1.1): a process
    /// notices when the file it mapped was re-created under it.
    pub region_id: AtomicU64,
    /// The process that keeps the HAMi part true: `pid << 32 | heartbeat`
    /// (monotonic seconds; 2.0).
    pub hami_writer: AtomicU64,
    /// What the file was before this layout (2.0): [`ORIGIN_NEW`],
    /// [`ORIGIN_VGPU_1`] or [`ORIGIN_HAMI_CORE`].
    pub origin: AtomicU64,
    /// Zero; room for fields of later minor versions.
    pub _reserved: [AtomicU64; 3],
    /// The device table.
    pub devices: [DeviceEntry; MAX_DEVICES],
}

/// `Header::origin`: created in this layout.
pub const ORIGIN_NEW: u64 = 0;
/// `Header::origin`: upgraded from vgpu's layout 1.x.
pub const ORIGIN_VGPU_1: u64 = 1;
/// `Header::origin`: adopted from HAMi-core's layout 1.2.
pub const ORIGIN_HAMI_CORE: u64 = 2;

/// Size of the [`Header`], device table included.
pub const HEADER_SIZE: usize = size_of::<Header>();
/// Size of one [`ProcSlot`].
pub const SLOT_SIZE: usize = size_of::<ProcSlot>();
/// Size of one [`DeviceEntry`].
pub const DEVICE_SIZE: usize = size_of::<DeviceEntry>();
/// Size of vgpu's part of a region: its header and slots.
pub const REGION_SIZE: usize = HEADER_SIZE + MAX_SLOTS * SLOT_SIZE;
/// Where vgpu's part starts: after HAMi's layout, on a page boundary.
pub const VGPU_OFFSET: usize = crate::hami::layout::HAMI_SIZE.next_multiple_of(4096);
/// Size of a region file of this layout version.
pub const FILE_SIZE: usize = VGPU_OFFSET + REGION_SIZE;
/// Size of a region file of layout 1.x (vgpu's part alone, at offset 0).
pub const LEGACY_SIZE: usize = REGION_SIZE;

const _: () = {
    assert!(DEVICE_SIZE == 256);
    assert!(offset_of!(DeviceEntry, in_use) == 16);
    assert!(offset_of!(DeviceEntry, mem_limit) == 24);
    assert!(offset_of!(DeviceEntry, tat_ns) == 48);
    assert!(offset_of!(DeviceEntry, leader) == 64);
    assert!(offset_of!(DeviceEntry, waits) == 72);
    assert!(offset_of!(DeviceEntry, context_bytes) == 80);
    assert!(offset_of!(DeviceEntry, hami_index) == 88);
    assert!(offset_of!(DeviceEntry, hami_limit_seen) == 96);
    assert!(offset_of!(DeviceEntry, hami_sm_seen) == 104);
    assert!(offset_of!(DeviceEntry, oom_denials) == 112);
    assert!(offset_of!(DeviceEntry, wait_ns) == 120);
    assert!(offset_of!(DeviceEntry, turn_anchor_ns) == 128);
    assert!(offset_of!(DeviceEntry, turn_moved_ns) == 136);
    assert!(offset_of!(DeviceEntry, turn_cut_ns) == 144);
    assert!(offset_of!(DeviceEntry, admitted_ns) == 152);
    assert!(offset_of!(DeviceEntry, turn_flags) == 160);
    assert!(offset_of!(DeviceEntry, turn_fill_milli) == 168);
    assert!(offset_of!(DeviceEntry, turn_shared_ns) == 176);
    assert!(offset_of!(DeviceEntry, held_ns) == 184);
    assert!(offset_of!(DeviceEntry, alone_ns) == 192);
    assert!(offset_of!(DeviceEntry, paced_ns) == 200);
    assert!(offset_of!(DeviceEntry, sync_wait_ns) == 208);
    assert!(offset_of!(DeviceEntry, rest_percent) == 216);
    assert!(offset_of!(DeviceEntry, syncs) == 224);
    assert!(offset_of!(DeviceEntry, rest_beside_ns) == 232);
    assert!(offset_of!(DeviceEntry, limited_beside_ns) == 240);
    assert!(offset_of!(DeviceEntry, turn_period_ns) == 248);
    assert!(SLOT_SIZE == 1024);
    assert!(offset_of!(ProcSlot, start_time) == 8);
    assert!(offset_of!(ProcSlot, sm_util) == 32);
    assert!(offset_of!(ProcSlot, usage) == 96);
    assert!(offset_of!(ProcSlot, dead_since_ms) == 736);
    assert!(offset_of!(ProcSlot, heartbeat_ms) == 744);
    assert!(offset_of!(ProcSlot, flags) == 752);
    assert!(offset_of!(ProcSlot, nvml_used) == 760);
    assert!(offset_of!(ProcSlot, gap_device) == 888);
    assert!(offset_of!(ProcSlot, host_gap_ns) == 896);
    assert!(offset_of!(Header, size) == 16);
    assert!(offset_of!(Header, state) == 40);
    assert!(offset_of!(Header, slot_hwm) == 44);
    assert!(offset_of!(Header, boot_id) == 64);
    assert!(offset_of!(Header, region_id) == 80);
    assert!(offset_of!(Header, hami_writer) == 88);
    assert!(offset_of!(Header, origin) == 96);
    assert!(offset_of!(Header, devices) == 128);
    assert!(HEADER_SIZE == 128 + MAX_DEVICES * 256);
    assert!(HEADER_SIZE.is_multiple_of(8));
    assert!(VGPU_OFFSET == 2_011_136 && VGPU_OFFSET >= crate::hami::layout::HAMI_SIZE);
    assert!(FILE_SIZE == 3_063_936);
};

/// The fields a reader checks before it maps a file, parsed from its first
/// [`PREFIX_LEN`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // the Header fields of the same names
pub struct Prefix {
    pub magic: u64,
    pub version_major: u32,
    pub version_minor: u32,
    pub size: u64,
    pub header_size: u32,
    pub slot_size: u32,
    pub max_devices: u32,
    pub max_slots: u32,
    pub state: u32,
}

/// Bytes of the file [`Prefix`] reads.
pub const PREFIX_LEN: usize = 44;

impl Prefix {
    /// Reads the prefix; `None` when fewer than [`PREFIX_LEN`] bytes are given.
    pub fn parse(bytes: &[u8]) -> Option<Prefix> {
        let b = bytes.get(..PREFIX_LEN)?;
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| u64::from(u32_at(o)) | (u64::from(u32_at(o + 4)) << 32);
        Some(Prefix {
            magic: u64_at(0),
            version_major: u32_at(8),
            version_minor: u32_at(12),
            size: u64_at(16),
            header_size: u32_at(24),
            slot_size: u32_at(28),
            max_devices: u32_at(32),
            max_slots: u32_at(36),
            state: u32_at(40),
        })
    }
}

//! What one region file holds, whatever its format: the model behind the
//! table, `--json` (docs/vgpuctl.md is its schema) and the exporter.
//!
//! Fields that only one format carries are `Option`s and print as `null`
//! in JSON, so a consumer can tell "not known" from zero.
#![forbid(unsafe_code)]

use serde::Serialize;

/// Bumped when a field changes meaning or goes away; additions keep it.
pub const SCHEMA_VERSION: u32 = 1;

/// The output of `vgpuctl status --json`.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Every region asked for, in order.
    pub regions: Vec<Snapshot>,
    /// Regions found under `--root` that could not be read.
    pub errors: Vec<Unreadable>,
}

/// A region found in a containers directory that could not be read.
#[derive(Clone, Debug, Serialize)]
pub struct Unreadable {
    /// The file.
    pub path: String,
    /// Why.
    pub error: String,
}

/// The layout a region file was written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// vgpu's layout: 2.x (HAMi's layout 1.2, then vgpu's part) or 1.x.
    Vgpu,
    /// HAMi-core's layout 1.2, as HAMi-core writes it (no vgpu part).
    Hami,
}

/// Whose pod and container a region belongs to, when it was found in a
/// containers directory (`{podUID}_{container}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Owner {
    /// The pod's namespace; empty when unknown (no pod list).
    pub namespace: String,
    /// The pod's name; its UID when the name is unknown.
    pub pod: String,
    /// The pod's UID, from the directory name.
    pub pod_uid: String,
    /// The container's name, from the directory name.
    pub container: String,
}

/// One region file.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    /// The file.
    pub path: String,
    /// Its layout.
    pub format: Format,
    /// The layout's version, `major.minor`.
    pub layout_version: String,
    /// The pod and container it belongs to, when known.
    pub owner: Option<Owner>,
    /// Slots reclaimed from dead processes since the file was created (vgpu).
    pub slots_reclaimed: Option<u64>,
    /// HAMi's priority and feedback fields, when the file has them.
    pub hami: Option<HamiFields>,
    /// Every device the container uses.
    pub devices: Vec<Device>,
    /// Every process that holds a slot.
    pub processes: Vec<Process>,
}

/// The fields of HAMi's layout that its monitor's feedback loop uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HamiFields {
    /// `CUDA_TASK_PRIORITY` of the container (0 high, 1 default).
    pub priority: i32,
    /// -1 while the monitor blocks the container's launches.
    pub recent_kernel: i32,
    /// 1 when the monitor says the GPU is shared and limits apply.
    pub utilization_switch: i32,
    /// Unix seconds of the container's last kernel launch (0: none yet).
    pub last_kernel_time: u64,
}

/// One device of the container.
#[derive(Clone, Debug, Serialize)]
pub struct Device {
    /// Its index in the region: vgpu's device entry (what `vgpuctl usage`
    /// takes), or HAMi's device index in a HAMi-core file.
    pub index: usize,
    /// Its index in the HAMi part, the container's device number (HAMi's
    /// `vdevice_index`); the entry index where there is no HAMi part.
    pub vdevice_index: usize,
    /// NVML's UUID, `GPU-…`.
    pub uuid: String,
    /// Memory limit in bytes, 0 for none.
    pub memory_limit_bytes: u64,
    /// SM limit in percent, 0 for none.
    pub sm_limit_percent: u32,
    /// Without an SM limit: the share it takes beside busy limited
    /// containers on the GPU, percent (0: it runs free; vgpu 2.6).
    pub sm_rest_percent: Option<u32>,
    /// `GPU_CORE_UTILIZATION_POLICY`: `default`, `force` or `disable` (vgpu).
    pub policy: Option<&'static str>,
    /// Physical memory of the device (vgpu).
    pub total_memory_bytes: Option<u64>,
    /// What the container's live processes hold.
    pub used_bytes: u64,
    /// What the quota counts: slots of dead processes not yet reclaimed too
    /// (vgpu).
    pub counted_bytes: Option<u64>,
    /// The container's SM utilisation of the device, percent: what HAMi's
    /// monitor computes from the same file, the sum of its processes'
    /// `sm_util` (`read::hami::sm_util_sum`).
    pub utilization_percent: f64,
    /// The controller's multiplier on the bucket's refill rate (vgpu).
    pub bucket_scale: Option<f64>,
    /// The process that leads the device's bucket, 0 for none (vgpu).
    pub leader_pid: Option<u32>,
    /// Launches that waited for the bucket (vgpu).
    pub launches_throttled: Option<u64>,
    /// Seconds launches spent waiting for the bucket (vgpu).
    pub throttled_seconds: Option<f64>,
    /// Requests refused with `CUDA_ERROR_OUT_OF_MEMORY` (vgpu).
    pub oom_denials: Option<u64>,
    /// What a new context costs on this device, as last measured (vgpu).
    pub context_estimate_bytes: Option<u64>,
    /// Where the container's turns on the device stand (vgpu 2.1, once
    /// an SM limit chose them).
    pub turns: Option<Turns>,
}

/// A container's turns on one device: its window opens `phase_ms` into
/// every period of CLOCK_MONOTONIC (periods counted from 0).
#[derive(Clone, Debug, Serialize)]
pub struct Turns {
    /// Where in each period its window opens, ms (0 to `period_ms`).
    pub phase_ms: f64,
    /// The period, ms: the default, or what the container's leader chose
    /// (layout 2.9: longer where short steps on the device ask for it,
    /// `limiter/period.rs`).
    pub period_ms: f64,
    /// GPU time left unspent of each period's share, ms.
    pub unspent_ms: f64,
    /// How full its launches keep the GPU in its window (cost over span;
    /// layout 2.2), null until measured: a share spans its part of the
    /// period.
    pub fill: Option<f64>,
    /// Paused: several processes of the container use the device.
    pub paused: bool,
    /// A probe of its windows met another context in the last 10 s
    /// (layout 2.2).
    pub shared: bool,
    /// Its leader found, in the last 2 s, only the container's processes
    /// in NVML's list for the device, leaving less than a context of the
    /// memory allocated there unaccounted (layout 2.4): what its probes lose
    /// then is its own work on another stream, and its windows neither
    /// move nor leave time unspent.
    pub alone: bool,
    /// Its leader found, in the last 2 s, that the SM limits of the busy
    /// containers on the device (the node's SM board) leave room for them
    /// to run side by side (layout 2.5): beside others its share is paced
    /// evenly, as alone, not spent in windows.
    pub paced: bool,
    /// Its leader places its windows from the node's SM board, where three
    /// or more containers take turns on the device: their shares end to
    /// end in the order of their slots (`limiter/tiling.rs`). False once
    /// the leader is gone (`Region::may_live`).
    pub placed: bool,
    /// Seconds of GPU time the bucket has admitted, ever.
    pub admitted_gpu_seconds: f64,
}

/// Whether a slot's owner is alive, as far as this machine can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Alive {
    /// Its pid and start time match.
    Yes,
    /// It is gone; the slot waits to be reclaimed.
    No,
    /// Its pid namespace is not visible here, and its heartbeat is fresh
    /// (or it has none).
    Unknown,
}

/// One process of the container.
#[derive(Clone, Debug, Serialize)]
pub struct Process {
    /// Its slot in the region.
    pub slot: usize,
    /// Its pid in its own namespace.
    pub pid: i32,
    /// Its pid as NVML reports it, when known.
    pub host_pid: Option<i32>,
    /// The host pid came from the kernel, not from NVML's list (vgpu).
    pub host_pid_verified: Option<bool>,
    /// Whether it lives.
    pub alive: Alive,
    /// How long ago its watcher last beat, ms (vgpu).
    pub heartbeat_age_ms: Option<u64>,
    /// Its use of each device it touched.
    pub devices: Vec<ProcessDevice>,
}

/// One process's use of one device.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessDevice {
    /// [`Device::index`].
    pub index: usize,
    /// Every byte it holds there.
    pub used_bytes: u64,
    /// Context and library overhead: vgpu's estimate, reconciled with NVML.
    pub context_bytes: u64,
    /// Module (code) bytes; vgpu and HAMi-core count none separately.
    pub module_bytes: u64,
    /// Allocations (buffers, arrays, VMM, pools).
    pub buffer_bytes: u64,
    /// Bytes by vgpu's kinds: `buffer`, `array`, `vmm`, `pool`, `context` (vgpu).
    pub by_kind: Option<std::collections::BTreeMap<&'static str, u64>>,
    /// NVML's figure of its used memory, as the library last wrote it (HAMi's
    /// `monitorused`).
    pub nvml_used_bytes: Option<u64>,
    /// Its SM utilisation of the device, percent.
    pub sm_util_percent: u32,
}

impl Snapshot {
    /// Sum of the live processes' [`ProcessDevice`] figures on device `index`.
    pub fn live_sum(&self, index: usize, field: impl Fn(&ProcessDevice) -> u64) -> u64 {
        self.processes
            .iter()
            .filter(|p| p.alive != Alive::No)
            .flat_map(|p| p.devices.iter())
            .filter(|d| d.index == index)
            .map(field)
            .sum()
    }
}

//! One scrape's exposition, built with `prometheus-client` from the
//! regions' snapshots and the host's GPUs.
//!
//! - HAMi's families, names, labels and units, as HAMi's vGPUmonitor
//!   exports them (its docs/metrics reference): `hami_vgpu_memory_*`,
//!   `hami_container_*` with `namespace, pod, container, vdevice_index,
//!   device_uuid`; `hami_host_gpu_*` with `device_index, device_uuid,
//!   device_type`; every series with `zone`.
//! - With `legacy`, the names HAMi's monitor used before (`vGPU_…`,
//!   `HostGPUMemoryUsage`, …) with their labels (`podnamespace, podname,
//!   ctrname, vdeviceid, deviceuuid`).
//! - What only vgpu knows, as `vgpu_*` families: OOM denials, throttled
//!   launches and the time they waited, the bucket's scale, the SM limit,
//!   each process's memory and context estimate, slots reclaimed; and,
//!   when the node has an oversubscription board, its processes
//!   (`vgpu_oversub_*`, `oversub.rs`).
#![forbid(unsafe_code)]

use std::borrow::Cow;

use prometheus_client::encoding::text;
use prometheus_client::registry::Registry;

use super::family::{ContainerDevice, Counters, Gauges, Labels, counter, gauge, memory_parts, set};
use super::host::HostGpu;
use super::legacy::Legacy;
use super::oversub::Oversub;
use crate::snapshot::{Alive, Device, Snapshot};

/// What every scrape's exposition carries besides the regions.
#[derive(Clone, Debug)]
pub struct Options {
    /// The `zone` label on every series.
    pub zone: String,
    /// The `node` label of the host families.
    pub node: String,
    /// HAMi's families (`hami_*`), off where HAMi's own monitor exports
    /// them on the node.
    pub hami: bool,
    /// Also the legacy names.
    pub legacy: bool,
}

impl Options {
    /// The options `vgpuctl serve`'s arguments ask for.
    pub fn from_args(a: &crate::cli::ServeArgs) -> Options {
        Options {
            zone: a.zone.clone(),
            node: a.node.clone().unwrap_or_else(hostname),
            hami: !a.without_hami_families,
            legacy: a.legacy_metrics,
        }
    }
}

/// The kernel's host name (a pod on the host network has the node's).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Region files that were found but could not be read, this scrape.
pub type Unreadable = usize;

/// The OpenMetrics text of one scrape; `board`: the node's
/// oversubscription board, if it has one.
pub fn encode(
    regions: &[Snapshot],
    host: &[HostGpu],
    unreadable: Unreadable,
    board: Option<&vgpu_shm::board::Board>,
    opts: &Options,
) -> String {
    let zone = [(Cow::Borrowed("zone"), Cow::Owned(opts.zone.clone()))];
    let mut registry = Registry::with_labels(zone.clone().into_iter());
    // HAMi's families, encoded only when asked for.
    let mut hami = Registry::with_labels(zone.into_iter());
    let mut f = Families::new(&mut hami, &mut registry, opts.legacy);
    for s in regions {
        f.region(s);
    }
    for h in host {
        f.host(h, &opts.node);
    }
    f.exporter_regions
        .get_or_create(&Vec::new())
        .set(regions.len() as f64);
    f.exporter_unreadable
        .get_or_create(&Vec::new())
        .set(unreadable as f64);
    if let Some(b) = board {
        Oversub::register(&mut registry).board(b, vgpu_shm::board::monotonic_ns());
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    if opts.hami {
        let _ = text::encode_registry(&mut out, &hami);
    }
    let _ = text::encode_registry(&mut out, &registry);
    if opts.hami {
        // As HAMi's monitor registers it: without `zone`.
        let _ = text::encode_registry(&mut out, &build_info());
    }
    let _ = text::encode_eof(&mut out);
    out
}

/// `hami_build_info`, with the labels of HAMi's (`pkg/metrics`): vgpu's
/// version, and Rust's where HAMi names Go's.
fn build_info() -> Registry {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let labels = [
        ("version", env!("CARGO_PKG_VERSION").to_string()),
        ("revision", "unknown".to_string()),
        ("build_date", "unknown".to_string()),
        ("go_version", "none".to_string()),
        ("compiler", "rustc".to_string()),
        ("platform", format!("{}/{arch}", std::env::consts::OS)),
    ];
    let mut r = Registry::default();
    let g = gauge(
        &mut r,
        "hami_build_info",
        "hami build metadata exposed as labels with a constant value of 1.",
    );
    set(&g, &labels.to_vec(), 1.0);
    r
}

/// The families of one exposition.
struct Families {
    used: Gauges,
    limit: Gauges,
    container_memory: Gauges,
    utilization: Gauges,
    last_kernel: Gauges,
    context: Gauges,
    module: Gauges,
    buffer: Gauges,
    host_memory: Gauges,
    host_util: Gauges,
    host_memory_util: Gauges,
    host_temperature: Gauges,
    host_power: Gauges,
    host_ecc: Counters,
    oom_denials: Counters,
    throttled: Counters,
    throttled_seconds: Counters,
    scale: Gauges,
    sm_limit: Gauges,
    counted: Gauges,
    context_estimate: Gauges,
    process_used: Gauges,
    process_context: Gauges,
    process_sm: Gauges,
    processes: Gauges,
    blocked: Gauges,
    reclaimed: Counters,
    exporter_regions: Gauges,
    exporter_unreadable: Gauges,
    legacy: Option<Legacy>,
}

impl Families {
    /// HAMi's families into `h`, vgpu's into `r`.
    fn new(h: &mut Registry, r: &mut Registry, legacy: bool) -> Families {
        let legacy = legacy.then(|| Legacy::register(h));
        Families {
            used: gauge(
                h,
                "hami_vgpu_memory_used_bytes",
                "vGPU device memory usage in bytes",
            ),
            limit: gauge(
                h,
                "hami_vgpu_memory_limit_bytes",
                "vGPU device memory limit in bytes",
            ),
            container_memory: gauge(
                h,
                "hami_container_device_memory_bytes",
                "Container device memory usage in bytes",
            ),
            utilization: gauge(
                h,
                "hami_container_device_utilization_ratio",
                "Container device SM utilization ratio (0-100)",
            ),
            last_kernel: gauge(
                h,
                "hami_container_last_kernel_elapsed_seconds",
                "Seconds since last kernel execution in container",
            ),
            context: gauge(
                h,
                "hami_vgpu_memory_context_bytes",
                "Container device memory context size in bytes",
            ),
            module: gauge(
                h,
                "hami_vgpu_memory_module_bytes",
                "Container device memory module size in bytes",
            ),
            buffer: gauge(
                h,
                "hami_vgpu_memory_buffer_bytes",
                "Container device memory buffer size in bytes",
            ),
            host_memory: gauge(
                h,
                "hami_host_gpu_memory_used_bytes",
                "GPU device memory usage in bytes",
            ),
            host_util: gauge(
                h,
                "hami_host_gpu_utilization_ratio",
                "GPU core utilization ratio (0-100)",
            ),
            host_memory_util: gauge(
                h,
                "hami_host_gpu_memory_controller_utilization_ratio",
                "GPU memory controller utilization ratio (0-100)",
            ),
            host_temperature: gauge(
                r,
                "vgpu_host_gpu_temperature_celsius",
                "GPU temperature in degrees Celsius",
            ),
            host_power: gauge(r, "vgpu_host_gpu_power_watts", "GPU power usage in watts"),
            host_ecc: counter(
                r,
                "vgpu_host_gpu_ecc_errors",
                "Uncorrected GPU ECC errors since the driver loaded",
            ),
            oom_denials: counter(
                r,
                "vgpu_container_oom_denials",
                "Requests on the device refused with CUDA_ERROR_OUT_OF_MEMORY by the container's memory limit",
            ),
            throttled: counter(
                r,
                "vgpu_container_launches_throttled",
                "Launches that waited for the device's compute bucket (the SM limit)",
            ),
            throttled_seconds: counter(
                r,
                "vgpu_container_throttled_seconds",
                "Seconds launches spent waiting for the device's compute bucket",
            ),
            scale: gauge(
                r,
                "vgpu_container_bucket_scale",
                "The feedback controller's multiplier on the compute bucket's refill rate",
            ),
            sm_limit: gauge(
                r,
                "vgpu_container_sm_limit_ratio",
                "The container's SM limit on the device as a fraction of its SMs (0-1; 0: none)",
            ),
            counted: gauge(
                r,
                "vgpu_container_memory_counted_bytes",
                "What the memory quota counts: slots of dead processes not yet reclaimed too",
            ),
            context_estimate: gauge(
                r,
                "vgpu_container_context_estimate_bytes",
                "What a new CUDA context costs on the device, as last measured",
            ),
            process_used: gauge(
                r,
                "vgpu_process_memory_used_bytes",
                "Device memory a process of the container holds",
            ),
            process_context: gauge(
                r,
                "vgpu_process_context_bytes",
                "A process's context and library overhead: vgpu's estimate, reconciled with NVML",
            ),
            process_sm: gauge(
                r,
                "vgpu_process_sm_utilization_ratio",
                "A process's SM utilization of the device (0-1), from NVML",
            ),
            processes: gauge(
                r,
                "vgpu_container_processes",
                "Processes of the container that hold a slot in its region",
            ),
            blocked: gauge(
                r,
                "vgpu_container_launches_blocked",
                "1 while a node monitor blocks the container's launches (HAMi's recent_kernel -1; each process lifts a block nobody lifts after a bound)",
            ),
            reclaimed: counter(
                r,
                "vgpu_container_slots_reclaimed",
                "Slots of dead processes reclaimed since the region was created",
            ),
            exporter_regions: gauge(
                r,
                "vgpu_exporter_regions",
                "Region files read in this scrape",
            ),
            exporter_unreadable: gauge(
                r,
                "vgpu_exporter_unreadable_regions",
                "Region files found but not readable in this scrape (wrong format, cut short)",
            ),
            legacy,
        }
    }

    fn region(&mut self, s: &Snapshot) {
        let owner = s.owner.clone().unwrap_or_default();
        let container = vec![
            ("namespace", owner.namespace.clone()),
            ("pod", owner.pod.clone()),
            ("container", owner.container.clone()),
        ];
        if let Some(n) = s.slots_reclaimed {
            self.reclaimed.get_or_create(&container).inc_by(n as f64);
        }
        let live = s.processes.iter().filter(|p| p.alive != Alive::No).count();
        self.processes.get_or_create(&container).set(live as f64);
        if let Some(h) = &s.hami {
            let blocked = i64::from(h.recent_kernel < 0);
            self.blocked.get_or_create(&container).set(blocked as f64);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        for d in &s.devices {
            let mut labels = container.clone();
            labels.push(("vdevice_index", d.vdevice_index.to_string()));
            labels.push(("device_uuid", d.uuid.clone()));
            self.device(s, d, &labels, now);
            if let Some(l) = &self.legacy {
                let old = vec![
                    ("podnamespace", owner.namespace.clone()),
                    ("podname", owner.pod.clone()),
                    ("ctrname", owner.container.clone()),
                    ("vdeviceid", d.vdevice_index.to_string()),
                    ("deviceuuid", d.uuid.clone()),
                ];
                l.device(s, d, &old, now);
            }
            for p in s.processes.iter().filter(|p| p.alive != Alive::No) {
                let Some(pd) = p.devices.iter().find(|x| x.index == d.index) else {
                    continue;
                };
                let mut pl = labels.clone();
                pl.push(("pid", p.pid.to_string()));
                pl.push((
                    "host_pid",
                    p.host_pid.map_or(String::new(), |h| h.to_string()),
                ));
                set(&self.process_used, &pl, pd.used_bytes as f64);
                set(&self.process_context, &pl, pd.context_bytes as f64);
                set(&self.process_sm, &pl, f64::from(pd.sm_util_percent) / 100.0);
            }
        }
    }

    fn device(&self, s: &Snapshot, d: &Device, labels: &Labels, now: u64) {
        set(&self.container_memory, labels, d.used_bytes as f64);
        let container = ContainerDevice {
            used: &self.used,
            limit: &self.limit,
            utilization: &self.utilization,
            last_kernel: &self.last_kernel,
        };
        container.set(s, d, labels, now);
        let [context, module, buffer] = memory_parts(s, d);
        set(&self.context, labels, context as f64);
        set(&self.module, labels, module as f64);
        set(&self.buffer, labels, buffer as f64);
        set(
            &self.sm_limit,
            labels,
            f64::from(d.sm_limit_percent) / 100.0,
        );
        let counters = [
            (&self.oom_denials, d.oom_denials.map(|v| v as f64)),
            (&self.throttled, d.launches_throttled.map(|v| v as f64)),
            (&self.throttled_seconds, d.throttled_seconds),
        ];
        for (family, value) in counters {
            if let Some(v) = value {
                family.get_or_create(labels).inc_by(v);
            }
        }
        let gauges = [
            (&self.scale, d.bucket_scale),
            (&self.counted, d.counted_bytes.map(|v| v as f64)),
            (
                &self.context_estimate,
                d.context_estimate_bytes.map(|v| v as f64),
            ),
        ];
        for (family, value) in gauges {
            if let Some(v) = value {
                set(family, labels, v);
            }
        }
    }

    /// One GPU of the node. HAMi's families carry `node` where HAMi's
    /// monitor puts it (memory used and utilisation); vgpu's all do.
    fn host(&mut self, h: &HostGpu, node: &str) {
        let labels = vec![
            ("device_index", h.index.to_string()),
            ("device_uuid", h.uuid.clone()),
            ("device_type", h.device_type.clone()),
        ];
        let mut with_node = vec![("node", node.to_string())];
        with_node.extend(labels.iter().cloned());
        let gauges = [
            (
                &self.host_memory,
                &with_node,
                h.memory_used_bytes.map(|v| v as f64),
            ),
            (
                &self.host_util,
                &with_node,
                h.utilization_percent.map(f64::from),
            ),
            (
                &self.host_memory_util,
                &labels,
                h.memory_utilization_percent.map(f64::from),
            ),
            (
                &self.host_temperature,
                &with_node,
                h.temperature_celsius.map(f64::from),
            ),
            (&self.host_power, &with_node, h.power_watts),
        ];
        for (family, labels, value) in gauges {
            if let Some(v) = value {
                set(family, labels, v);
            }
        }
        if let Some(n) = h.ecc_errors {
            self.host_ecc.get_or_create(&with_node).inc_by(n as f64);
        }
        if let Some(l) = &self.legacy {
            l.host(h, node);
        }
    }
}

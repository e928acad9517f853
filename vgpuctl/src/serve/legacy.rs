//! HAMi's metric names before its `hami_` families (`--legacy-metrics`),
//! as HAMi 2.10's monitor still exports them with its `--legacy-metrics`
//! (`cmd/vGPUmonitor/metrics.go`), with their labels: `podnamespace,
//! podname, ctrname, vdeviceid, deviceuuid` for containers (and `context,
//! module, data, offset` on `Device_memory_desc_of_container`), `nodeid,
//! deviceidx, deviceuuid, devicetype` for the host's GPUs. (`MigInfo` is
//! left out, as `hami_mig_device_info` is: docs/vgpuctl.md.)
#![forbid(unsafe_code)]

use prometheus_client::registry::Registry;

use super::family::{ContainerDevice, Gauges, Labels, gauge, memory_parts, set};
use super::host::HostGpu;
use crate::snapshot::{Device, Snapshot};

/// HAMi's names before its `hami_` families.
pub(super) struct Legacy {
    used: Gauges,
    limit: Gauges,
    utilization: Gauges,
    last_kernel: Gauges,
    memory: Gauges,
    host_memory: Gauges,
    host_util: Gauges,
}

impl Legacy {
    /// Registers the legacy families in `r`.
    pub(super) fn register(r: &mut Registry) -> Legacy {
        Legacy {
            used: gauge(r, "vGPU_device_memory_usage_in_bytes", "vGPU device usage"),
            limit: gauge(r, "vGPU_device_memory_limit_in_bytes", "vGPU device limit"),
            utilization: gauge(
                r,
                "Device_utilization_desc_of_container",
                "Container device utilization description",
            ),
            last_kernel: gauge(
                r,
                "Device_last_kernel_of_container",
                "Container device last kernel description",
            ),
            memory: gauge(
                r,
                "Device_memory_desc_of_container",
                "Container device memory description",
            ),
            host_memory: gauge(r, "HostGPUMemoryUsage", "GPU device memory usage"),
            host_util: gauge(r, "HostCoreUtilization", "GPU core utilization"),
        }
    }

    /// One device of a container under the old names.
    pub(super) fn device(&self, s: &Snapshot, d: &Device, labels: &Labels, now: u64) {
        ContainerDevice {
            used: &self.used,
            limit: &self.limit,
            utilization: &self.utilization,
            last_kernel: &self.last_kernel,
        }
        .set(s, d, labels, now);
        // The memory's parts as labels, as HAMi's monitor writes them: the
        // offset is what the parts leave of the usage.
        let [context, module, data] = memory_parts(s, d);
        let offset = d
            .used_bytes
            .saturating_sub(context)
            .saturating_sub(module)
            .saturating_sub(data);
        let mut parts = labels.clone();
        parts.extend([
            ("context", context.to_string()),
            ("module", module.to_string()),
            ("data", data.to_string()),
            ("offset", offset.to_string()),
        ]);
        set(&self.memory, &parts, d.used_bytes as f64);
    }

    /// The host families under their old names.
    pub(super) fn host(&self, h: &HostGpu, node: &str) {
        let old = vec![
            ("nodeid", node.to_string()),
            ("deviceidx", h.index.to_string()),
            ("deviceuuid", h.uuid.clone()),
            ("devicetype", h.device_type.clone()),
        ];
        if let Some(v) = h.memory_used_bytes {
            set(&self.host_memory, &old, v as f64);
        }
        if let Some(v) = h.utilization_percent {
            set(&self.host_util, &old, f64::from(v));
        }
    }
}

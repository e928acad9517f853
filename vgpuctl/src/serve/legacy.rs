//! HAMi's metric names before its `hami_` families (`--legacy-metrics`),
//! with their labels: `podnamespace, podname, ctrname, vdeviceid,
//! deviceuuid` for containers, `nodeid, deviceidx, deviceuuid, devicetype` for
//! the host's GPUs.
#![forbid(unsafe_code)]

use prometheus_client::registry::Registry;

use super::family::{ContainerDevice, Gauges, Labels, gauge, set};
use super::host::HostGpu;
use crate::snapshot::{Device, Snapshot};

/// HAMi's names before its `hami_` families.
pub(super) struct Legacy {
    used: Gauges,
    limit: Gauges,
    utilization: Gauges,
    last_kernel: Gauges,
    context: Gauges,
    module: Gauges,
    buffer: Gauges,
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
            context: gauge(
                r,
                "vGPU_device_memory_context_size_bytes",
                "Container device memory context size",
            ),
            module: gauge(
                r,
                "vGPU_device_memory_module_size_bytes",
                "Container device memory module size",
            ),
            buffer: gauge(
                r,
                "vGPU_device_memory_buffer_size_bytes",
                "Container device memory buffer size",
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
            context: &self.context,
            module: &self.module,
            buffer: &self.buffer,
            last_kernel: &self.last_kernel,
        }
        .set(s, d, labels, now);
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

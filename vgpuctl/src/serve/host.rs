//! The host families (`hami_host_gpu_*`): every GPU of the node, from
//! NVML through `nvml-wrapper`. Without NVML (no driver, CI) they are
//! absent, said once at start-up; a figure a device does not support is
//! left out, not reported as zero.

use std::ffi::OsStr;
use std::path::Path;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};

/// One GPU of the node as NVML shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostGpu {
    /// NVML's index.
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// `NVIDIA-` and NVML's name, as HAMi's monitor labels it.
    pub device_type: String,
    /// Bytes used on the device, by every process.
    pub memory_used_bytes: Option<u64>,
    /// Percent of the last sample period a kernel ran.
    pub utilization_percent: Option<u32>,
    /// Percent of the last sample period memory was read or written.
    pub memory_utilization_percent: Option<u32>,
    /// Degrees Celsius.
    pub temperature_celsius: Option<u32>,
    /// Watts.
    pub power_watts: Option<f64>,
    /// Uncorrected ECC errors since the driver loaded.
    pub ecc_errors: Option<u64>,
}

/// The node's NVML, when it could be loaded.
pub struct Host {
    nvml: Option<Nvml>,
}

impl Host {
    /// Loads NVML from `lib` (a file name the loader searches for, or a
    /// path); says once on stderr when it cannot.
    pub fn open(lib: &Path) -> Host {
        let nvml = Nvml::builder().lib_path(OsStr::new(lib.as_os_str())).init();
        match nvml {
            Ok(nvml) => Host { nvml: Some(nvml) },
            Err(e) => {
                eprintln!(
                    "vgpuctl serve: NVML ({}) unavailable: {e}; the hami_host_gpu_* families are not exported",
                    lib.display()
                );
                Host { nvml: None }
            }
        }
    }

    /// A host without NVML.
    pub fn none() -> Host {
        Host { nvml: None }
    }

    /// Every GPU of the node now; empty without NVML.
    pub fn read(&self) -> Vec<HostGpu> {
        let Some(nvml) = &self.nvml else {
            return Vec::new();
        };
        let count = nvml.device_count().unwrap_or(0);
        (0..count)
            .filter_map(|i| {
                let d = nvml.device_by_index(i).ok()?;
                let util = d.utilization_rates().ok();
                Some(HostGpu {
                    index: i,
                    uuid: d.uuid().ok()?,
                    device_type: format!("NVIDIA-{}", d.name().unwrap_or_default()),
                    // HAMi's monitor reads NVML's v1 figure, reserved
                    // memory included; nvml-wrapper's `used` is v2's,
                    // without it (616 MiB less on an H200, run 20).
                    memory_used_bytes: d.memory_info().ok().map(|m| m.total.saturating_sub(m.free)),
                    utilization_percent: util.as_ref().map(|u| u.gpu),
                    memory_utilization_percent: util.as_ref().map(|u| u.memory),
                    temperature_celsius: d.temperature(TemperatureSensor::Gpu).ok(),
                    power_watts: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                    ecc_errors: d
                        .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
                        .ok(),
                })
            })
            .collect()
    }
}

//! What every family module shares: the label and family types, and the
//! registration and setting helpers; and `ContainerDevice`, the families
//! of a container's device that HAMi's names and its older ones share.
#![forbid(unsafe_code)]

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::snapshot::{Device, Snapshot};

/// Label names and values of one series.
pub(super) type Labels = Vec<(&'static str, String)>;
pub(super) type Gauges = Family<Labels, Gauge<f64, AtomicU64>>;
pub(super) type Counters = Family<Labels, Counter<f64, AtomicU64>>;

pub(super) fn gauge(r: &mut Registry, name: &str, help: &str) -> Gauges {
    let f = Gauges::default();
    r.register(name, help, f.clone());
    f
}

/// A counter family; its samples are named `{name}_total`.
pub(super) fn counter(r: &mut Registry, name: &str, help: &str) -> Counters {
    let f = Counters::default();
    r.register(name, help, f.clone());
    f
}

pub(super) fn set(family: &Gauges, labels: &Labels, v: f64) {
    family.get_or_create(labels).set(v);
}

/// A container's device in the families HAMi's names and its older ones
/// share: memory used and limit, utilisation, seconds since the last
/// kernel.
pub(super) struct ContainerDevice<'a> {
    pub used: &'a Gauges,
    pub limit: &'a Gauges,
    pub utilization: &'a Gauges,
    pub last_kernel: &'a Gauges,
}

/// Context, module and buffer bytes of a device's live processes.
pub(super) fn memory_parts(s: &Snapshot, d: &Device) -> [u64; 3] {
    [
        s.live_sum(d.index, |p| p.context_bytes),
        s.live_sum(d.index, |p| p.module_bytes),
        s.live_sum(d.index, |p| p.buffer_bytes),
    ]
}

impl ContainerDevice<'_> {
    pub(super) fn set(&self, s: &Snapshot, d: &Device, labels: &Labels, now: u64) {
        set(self.used, labels, d.used_bytes as f64);
        set(self.limit, labels, d.memory_limit_bytes as f64);
        set(self.utilization, labels, d.utilization_percent);
        if let Some(h) = s.hami.filter(|h| h.last_kernel_time > 0) {
            set(
                self.last_kernel,
                labels,
                now.saturating_sub(h.last_kernel_time) as f64,
            );
        }
    }
}

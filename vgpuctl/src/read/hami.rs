//! A HAMi-core file (HAMi's layout 1.2 alone) as a [`Snapshot`], from
//! `vgpu-shm`'s snapshot of its HAMi part: what HAMi's own monitor reads.
#![forbid(unsafe_code)]

use std::path::Path;

use vgpu_shm::hami;

use crate::snapshot::{Alive, Device, Format, HamiFields, Process, ProcessDevice, Snapshot};

/// What a HAMi-core file at `path` holds, from its snapshot `h`.
pub fn snapshot(path: &Path, h: &hami::Snapshot) -> Snapshot {
    let processes: Vec<Process> = h
        .procs
        .iter()
        .enumerate()
        .filter(|(_, p)| p.pid != 0)
        .map(|(slot, p)| process(slot, p, h))
        .collect();
    let devices = h
        .devices
        .iter()
        .map(|d| {
            let on_it = processes
                .iter()
                .flat_map(|p| &p.devices)
                .filter(|x| x.index == d.index);
            let used = on_it.fold(0u64, |u, x| u.saturating_add(x.used_bytes));
            Device {
                index: d.index,
                vdevice_index: d.index,
                uuid: d.uuid.clone(),
                memory_limit_bytes: d.limit,
                sm_limit_percent: hami::sm_from_hami(d.sm_limit),
                sm_rest_percent: None,
                policy: None,
                total_memory_bytes: None,
                used_bytes: used,
                counted_bytes: None,
                utilization_percent: sm_util_sum(h, d.index) as f64,
                bucket_scale: None,
                leader_pid: None,
                launches_throttled: None,
                throttled_seconds: None,
                oom_denials: None,
                context_estimate_bytes: None,
                turns: None,
            }
        })
        .collect();
    Snapshot {
        path: path.display().to_string(),
        format: Format::Hami,
        layout_version: format!("{}.{}", h.major, h.minor),
        owner: None,
        slots_reclaimed: None,
        hami: Some(fields(h)),
        devices,
        processes,
    }
}

/// The container's SM utilisation of HAMi device `index`, percent, as
/// HAMi's monitor computes it (`DeviceSmUtil` of its v1 spec): the sum of
/// `device_util[index].sm_util` over `procs[0..proc_num)`, skipping slots
/// whose `status` is 0, unclamped (`h.procs` is already cut at
/// `proc_num`).
pub fn sm_util_sum(h: &hami::Snapshot, index: usize) -> u64 {
    h.procs
        .iter()
        .filter(|p| p.status != 0)
        .filter_map(|p| p.devices.get(index))
        .fold(0u64, |s, d| s.saturating_add(d.sm_util))
}

/// The feedback fields of a HAMi part.
pub fn fields(h: &hami::Snapshot) -> HamiFields {
    HamiFields {
        priority: h.priority,
        recent_kernel: h.recent_kernel,
        utilization_switch: h.utilization_switch,
        last_kernel_time: h.last_kernel_time,
    }
}

fn process(slot: usize, p: &hami::Proc, h: &hami::Snapshot) -> Process {
    Process {
        slot,
        pid: p.pid,
        host_pid: (p.hostpid > 0).then_some(p.hostpid),
        host_pid_verified: None,
        // HAMi-core keeps live processes in 0..proc_num by its own
        // bookkeeping; nothing here can check it (another pid namespace).
        alive: Alive::Unknown,
        heartbeat_age_ms: None,
        devices: h
            .devices
            .iter()
            .filter_map(|d| {
                let u = p.devices.get(d.index)?;
                let pd = ProcessDevice {
                    index: d.index,
                    used_bytes: u.total,
                    context_bytes: u.context_size,
                    module_bytes: u.module_size,
                    buffer_bytes: u.data_size,
                    by_kind: None,
                    nvml_used_bytes: Some(u.monitorused),
                    sm_util_percent: u32::try_from(u.sm_util).unwrap_or(u32::MAX),
                };
                (pd.used_bytes > 0 || pd.sm_util_percent > 0 || u.monitorused > 0).then_some(pd)
            })
            .collect(),
    }
}

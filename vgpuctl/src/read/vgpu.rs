//! A vgpu region (layout 2.x with its HAMi part, or 1.x without) as a
//! [`Snapshot`]: vgpu's own part for usage, owners and the bucket, the
//! HAMi part for what HAMi's monitor writes and the device numbering its
//! dashboards show.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use vgpu_shm::layout::{DeviceEntry, TURN_PERIOD_NS, TURNS_PAUSED, TURNS_TILED};
use vgpu_shm::{EntryIndex, Kind, Owners, ProcView, Region, format_uuid, procinfo};

use crate::snapshot::{Alive, Device, Format, Process, ProcessDevice, Snapshot, Turns};

/// What `region` shows, judging its owners from `view`.
pub fn snapshot(region: &Region, view: &ProcView) -> Snapshot {
    let h = region.header();
    let devices: Vec<EntryIndex> = EntryIndex::all()
        .filter(|&d| region.device(d).is_used())
        .collect();
    let part = region.hami().map(|part| part.snapshot());
    Snapshot {
        path: region.path().display().to_string(),
        format: Format::Vgpu,
        layout_version: format!(
            "{}.{}",
            h.version_major.load(Ordering::Relaxed),
            h.version_minor.load(Ordering::Relaxed)
        ),
        owner: None,
        slots_reclaimed: Some(h.reclaims.load(Ordering::Relaxed)),
        hami: part.as_ref().map(super::hami::fields),
        devices: devices
            .iter()
            .map(|&d| device(region, d, part.as_ref(), view))
            .collect(),
        processes: region
            .occupied_slots()
            .map(|i| process(region, i, &devices, view))
            .collect(),
    }
}

/// The container's SM utilisation of `dev`, percent: what HAMi's monitor
/// computes from the HAMi part (the sum of its processes' `sm_util`, which
/// the library keeps current in every policy and switch state), or where
/// there is none (layout 1.x, no index yet) the same sum over vgpu's slots
/// whose owner may live. Not the leader's figure: there is no leader
/// without an SM limit, and none while the switch lifts the limit.
fn utilization(
    region: &Region,
    dev: EntryIndex,
    part: Option<&vgpu_shm::hami::Snapshot>,
    view: &ProcView,
) -> f64 {
    if let (Some(h), Some(i)) = (part, region.hami_index(dev)) {
        return super::hami::sm_util_sum(h, i) as f64;
    }
    region
        .occupied_slots()
        .filter(|&s| procinfo::liveness(&region.owner(s), view) != procinfo::Liveness::Dead)
        .map(|s| u64::from(region.sm_util(s, dev)))
        .sum::<u64>() as f64
}

/// Whether the process that leads a device's limiter (`leader`, 0: none)
/// may still run: one of the region's owners that may live
/// (`Region::may_live`: alive by `kill` in our pid namespace, by its
/// heartbeat from another, such as the node's). The flags it sets are its
/// word only while it runs; a container that exited, or was killed
/// outright, leaves them as it last set them.
fn leader_runs(region: &Region, leader: u32, view: &ProcView) -> bool {
    let now = procinfo::monotonic_ms();
    leader != 0
        && region.occupied_slots().any(|s| {
            u32::try_from(region.owner(s).pid).ok() == Some(leader)
                && region.may_live(s, view.my_ns, now)
        })
}

/// The period of the container's turns on `d`, as its leader chose it
/// (layout 2.9): the default where the region holds none, or one no
/// library would choose (10 ms to 1 s).
fn turn_period_ns(d: &DeviceEntry) -> u64 {
    match d.turn_period_ns() {
        p @ 10_000_000..=1_000_000_000 => p,
        _ => TURN_PERIOD_NS,
    }
}

fn device(
    region: &Region,
    dev: EntryIndex,
    part: Option<&vgpu_shm::hami::Snapshot>,
    view: &ProcView,
) -> Device {
    let d = region.device(dev);
    let limits = d.limits();
    Device {
        index: dev.get(),
        vdevice_index: region.hami_index(dev).unwrap_or(dev.get()),
        uuid: format_uuid(&d.uuid()),
        memory_limit_bytes: limits.mem,
        sm_limit_percent: limits.sm,
        sm_rest_percent: Some(d.rest_percent()),
        policy: Some(match limits.policy {
            vgpu_shm::CorePolicy::Default => "default",
            vgpu_shm::CorePolicy::Force => "force",
            vgpu_shm::CorePolicy::Disable => "disable",
        }),
        total_memory_bytes: Some(d.total_mem()),
        used_bytes: region.device_usage(dev, Owners::Live),
        counted_bytes: Some(region.device_usage(dev, Owners::All)),
        utilization_percent: utilization(region, dev, part, view),
        bucket_scale: Some(f64::from(d.rate_scale_milli()) / 1000.0),
        leader_pid: Some(d.leader_pid()),
        launches_throttled: Some(d.waits()),
        throttled_seconds: Some(d.wait_ns() as f64 / 1e9),
        oom_denials: Some(d.oom_denials()),
        context_estimate_bytes: d.context_bytes(),
        turns: (d.turn_anchor() != 0).then(|| Turns {
            phase_ms: (d.turn_anchor() % turn_period_ns(d)) as f64 / 1e6,
            period_ms: turn_period_ns(d) as f64 / 1e6,
            unspent_ms: d.turn_cut_ns() as f64 / 1e6,
            fill: match d.turn_fill_milli() {
                0 => None,
                f => Some(f as f64 / 1000.0),
            },
            paused: d.turn_flag(TURNS_PAUSED),
            shared: d.turn_shared(vgpu_shm::board::monotonic_ns()),
            alone: d.alone(vgpu_shm::board::monotonic_ns()),
            paced: d.paced(vgpu_shm::board::monotonic_ns()),
            placed: d.turn_flag(TURNS_TILED) && leader_runs(region, d.leader_pid(), view),
            admitted_gpu_seconds: d.admitted_ns() as f64 / 1e9,
        }),
    }
}

fn process(
    region: &Region,
    slot: vgpu_shm::SlotIndex,
    devices: &[EntryIndex],
    view: &ProcView,
) -> Process {
    let owner = region.owner(slot);
    Process {
        slot: slot.get(),
        pid: owner.pid,
        host_pid: (owner.host_pid > 0).then_some(owner.host_pid),
        host_pid_verified: Some(owner.host_pid_verified),
        alive: match procinfo::liveness(&owner, view) {
            procinfo::Liveness::Alive => Alive::Yes,
            procinfo::Liveness::Dead => Alive::No,
            procinfo::Liveness::Unknown => Alive::Unknown,
        },
        heartbeat_age_ms: region.heartbeat_age_ms(slot, procinfo::monotonic_ms()),
        devices: devices
            .iter()
            .filter(|&&d| region.slot_total(slot, d) > 0 || region.sm_util(slot, d) > 0)
            .map(|&d| {
                let kinds: BTreeMap<&'static str, u64> = Kind::ALL
                    .iter()
                    .map(|&k| (k.name(), region.slot_usage(slot, d, k)))
                    .collect();
                let context = kinds["context"];
                let total = region.slot_total(slot, d);
                ProcessDevice {
                    index: d.get(),
                    used_bytes: total,
                    context_bytes: context,
                    module_bytes: 0,
                    buffer_bytes: total.saturating_sub(context),
                    by_kind: Some(kinds),
                    nvml_used_bytes: region.hami().map(|_| region.nvml_used(slot, d)),
                    sm_util_percent: region.sm_util(slot, d),
                }
            })
            .collect(),
    }
}

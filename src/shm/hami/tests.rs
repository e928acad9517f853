//! The HAMi part of a vgpu region: what a fresh one holds, and the mirror.

use std::sync::atomic::Ordering;

use super::*;
use crate::layout::{FILE_SIZE, Kind};
use crate::{CorePolicy, DeviceInfo, Limits, OpenMode, ProcId, format_uuid};

fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn info(b: u8) -> DeviceInfo {
    DeviceInfo {
        uuid: [b; 16],
        total_mem: 1 << 34,
        sm_count: 132,
    }
}

fn limits(mem: u64, sm: u32) -> Limits {
    Limits {
        mem,
        sm,
        policy: CorePolicy::Default,
    }
}

#[test]
fn a_new_region_reads_as_hami_layout_1_2() {
    let dir = temp_dir();
    let path = dir.path().join("r.cache");
    drop(Region::open(&path, OpenMode::CreateIfMissing).unwrap());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), FILE_SIZE as u64);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        i32::from_le_bytes(bytes[0..4].try_into().unwrap()),
        HAMI_MAGIC
    );
    assert_eq!(u32::from_le_bytes(bytes[4..8].try_into().unwrap()), 1);
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 2);
    assert_eq!(
        probe(&path).unwrap(),
        Format::Vgpu {
            major: crate::layout::VERSION_MAJOR,
            minor: crate::layout::VERSION_MINOR
        }
    );
    let opened = open_any(&path, false).unwrap();
    let s = opened.snapshot().unwrap();
    assert_eq!((s.major, s.minor, s.proc_num), (1, 2, 0));
    assert_eq!(
        (s.utilization_switch, s.recent_kernel, s.priority),
        (1, 2, 1)
    );
    assert!(s.last_kernel_time > 1_600_000_000);
    assert!(s.procs.is_empty() && s.devices.is_empty());
}

#[test]
fn the_mirror_shows_live_processes_packed_with_their_usage_and_limits() {
    let dir = temp_dir();
    let r = Region::open(&dir.path().join("r.cache"), OpenMode::CreateIfMissing).unwrap();
    let dev = r
        .register_device(&info(0xab), limits(4 << 30, 30))
        .unwrap()
        .index;
    assert_eq!(r.assign_hami_index(dev, Some(3)).unwrap(), Some(3));
    // Already assigned: the same answer, whatever is preferred.
    assert_eq!(r.assign_hami_index(dev, Some(5)).unwrap(), Some(3));
    let me = r.claim_slot(&ProcId::current()).unwrap();
    r.reserve(me, dev, Kind::Buffer, 1000);
    r.reserve(me, dev, Kind::Context, 300);
    r.set_sm_util(me, dev, 42);
    r.set_nvml_used(me, dev, 1400);
    // A dead process's slot is not shown.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = ProcId {
        pid: child.id() as i32,
        start_time: 1,
        pidns: ProcId::current().pidns,
    };
    child.wait().unwrap();
    let gone = r.claim_slot(&dead).unwrap();
    r.add_usage(gone, dev, Kind::Buffer, 5000);

    let done = r.mirror_hami();
    assert_eq!((done.procs, done.written), (1, 1));
    let s = r.hami().unwrap().snapshot();
    assert_eq!(s.proc_num, 1);
    let p = &s.procs[0];
    assert_eq!(p.pid, std::process::id() as i32);
    assert_eq!(p.status, HAMI_STATUS_RUNNING);
    assert!(!p.torn);
    let d = p.devices[3];
    assert_eq!(
        (
            d.context_size,
            d.data_size,
            d.total,
            d.monitorused,
            d.sm_util
        ),
        (300, 1000, 1300, 1400, 42)
    );
    assert_eq!(p.devices[0], ProcDevice::default());
    let shown = s.devices.iter().find(|d| d.index == 3).unwrap();
    assert_eq!(shown.uuid, format_uuid(&[0xab; 16]));
    assert_eq!((shown.limit, shown.sm_limit), (4 << 30, 30));
    assert_eq!(s.device_num, 4);
    // Nothing changed: nothing is written again.
    assert_eq!(r.mirror_hami().written, 0);
}

#[test]
fn a_limit_a_monitor_writes_becomes_the_region_limit() {
    let r = Region::anonymous().unwrap();
    let dev = r
        .register_device(&info(1), limits(4 << 30, 0))
        .unwrap()
        .index;
    r.assign_hami_index(dev, Some(0)).unwrap();
    r.mirror_hami();
    let h = r.hami().unwrap();
    assert_eq!(h.limit[0].load(Ordering::Relaxed), 4 << 30);
    assert_eq!(
        h.sm_limit[0].load(Ordering::Relaxed),
        100,
        "none, as HAMi says it"
    );
    // The monitor lowers both.
    h.limit[0].store(1 << 30, Ordering::Relaxed);
    h.sm_limit[0].store(25, Ordering::Relaxed);
    assert_eq!(r.mirror_hami().limits_taken, 2);
    assert_eq!(r.device(dev).limits().mem, 1 << 30);
    assert_eq!(r.device(dev).sm_limit(), 25);
    // And vgpu's own change goes the other way.
    r.device(dev).mem_limit.store(2 << 30, Ordering::Relaxed);
    assert_eq!(r.mirror_hami().limits_taken, 0);
    assert_eq!(h.limit[0].load(Ordering::Relaxed), 2 << 30);
    assert_eq!(r.device(dev).limits().mem, 2 << 30);
}

#[test]
fn a_monitor_written_limit_may_narrow_but_never_widen_or_remove() {
    // Issue 26, finding 6: limit 0 or -1 and sm_limit 0 written into the
    // HAMi part removed the quota (-1: cuMemGetInfo said 2^64-1).
    let r = Region::anonymous().unwrap();
    let dev = r
        .register_device(&info(1), limits(4 << 30, 30))
        .unwrap()
        .index;
    r.assign_hami_index(dev, Some(0)).unwrap();
    r.mirror_hami();
    let h = r.hami().unwrap();
    for (mem, sm) in [(0u64, 0u64), (u64::MAX, 100), (8 << 30, 60)] {
        h.limit[0].store(mem, Ordering::Relaxed);
        h.sm_limit[0].store(sm, Ordering::Relaxed);
        assert_eq!(r.mirror_hami().limits_taken, 0, "{mem} {sm}");
        assert_eq!(r.device(dev).limits().mem, 4 << 30);
        assert_eq!(r.device(dev).sm_limit(), 30);
        // vgpu's own limits are written back.
        assert_eq!(h.limit[0].load(Ordering::Relaxed), 4 << 30);
        assert_eq!(h.sm_limit[0].load(Ordering::Relaxed), 30);
    }
    h.sm_limit[0].store(20, Ordering::Relaxed);
    assert_eq!(r.mirror_hami().limits_taken, 1);
    assert_eq!(r.device(dev).sm_limit(), 20);
}

#[test]
fn processes_keep_their_place_and_the_last_fills_a_hole() {
    let r = Region::anonymous().unwrap();
    let dev = r.register_device(&info(2), limits(0, 0)).unwrap().index;
    r.assign_hami_index(dev, None).unwrap();
    // Three live owners (children that sleep).
    let mut kids: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap()
        })
        .collect();
    let ns = ProcId::current().pidns;
    let slots: Vec<_> = kids
        .iter()
        .map(|c| {
            r.claim_slot(&ProcId {
                pid: c.id() as i32,
                start_time: 0,
                pidns: ns,
            })
            .unwrap()
        })
        .collect();
    for (i, s) in slots.iter().enumerate() {
        r.add_usage(*s, dev, Kind::Buffer, 100 * (i as u64 + 1));
    }
    r.mirror_hami();
    let pids = |r: &Region| -> Vec<i32> {
        r.hami()
            .unwrap()
            .snapshot()
            .procs
            .iter()
            .map(|p| p.pid)
            .collect()
    };
    let before = pids(&r);
    assert_eq!(before.len(), 3);
    // The first one dies: the last one moves into its place.
    kids[0].kill().unwrap();
    kids[0].wait().unwrap();
    r.mirror_hami();
    let after = pids(&r);
    assert_eq!(after, vec![before[2], before[1]]);
    for k in &mut kids[1..] {
        let _ = k.kill();
        let _ = k.wait();
    }
    r.mirror_hami();
    assert!(pids(&r).is_empty());
    assert_eq!(r.hami().unwrap().proc_num.load(Ordering::Relaxed), 0);
}

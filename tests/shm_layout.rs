//! include/vgpu_shm.h and the Rust layout agree: every size and offset,
//! and a region written by Rust reads back through the header in C.

mod common;

use std::mem::{offset_of, size_of};
use std::process::Command;

use common::*;
use vgpu_shm::layout::*;
use vgpu_shm::{DeviceInfo, Kind, Limits, OpenMode, ProcId, Region};

#[test]
fn the_c_header_matches_the_rust_layout() {
    let exe = artifacts().bin.join("shm_layout");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/programs/shm_layout.c");
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(src)
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.cache");
    let r = Region::open(&path, OpenMode::CreateIfMissing).unwrap();
    let slot = r.claim_slot(&ProcId::current()).unwrap();
    let info = DeviceInfo {
        uuid: [0xab; 16],
        total_mem: 1 << 34,
        sm_count: 132,
    };
    let dev = r
        .register_device(
            &info,
            Limits {
                mem: 3 << 30,
                sm: 40,
                policy: vgpu_shm::CorePolicy::Default,
            },
        )
        .unwrap()
        .index;
    r.reserve(slot, dev, Kind::Vmm, 12345);

    let c = Run::from(Command::new(&exe).arg(&path).output().unwrap()).ok();
    assert_eq!(c.u64("magic"), MAGIC);
    assert_eq!(c.u64("sizeof.header"), HEADER_SIZE as u64);
    assert_eq!(c.u64("sizeof.device"), size_of::<DeviceEntry>() as u64);
    assert_eq!(c.u64("sizeof.slot"), size_of::<ProcSlot>() as u64);
    assert_eq!(c.u64("part"), REGION_SIZE as u64);
    assert_eq!(c.u64("file"), FILE_SIZE as u64);
    assert_eq!(c.u64("offset"), VGPU_OFFSET as u64);
    let expect = [
        (
            "vgpu_shm_header.version_major",
            offset_of!(Header, version_major),
        ),
        ("vgpu_shm_header.size", offset_of!(Header, size)),
        (
            "vgpu_shm_header.header_size",
            offset_of!(Header, header_size),
        ),
        ("vgpu_shm_header.state", offset_of!(Header, state)),
        ("vgpu_shm_header.slot_hwm", offset_of!(Header, slot_hwm)),
        (
            "vgpu_shm_header.created_unix_s",
            offset_of!(Header, created_unix_s),
        ),
        ("vgpu_shm_header.reclaims", offset_of!(Header, reclaims)),
        ("vgpu_shm_header.boot_id", offset_of!(Header, boot_id)),
        ("vgpu_shm_header.region_id", offset_of!(Header, region_id)),
        (
            "vgpu_shm_header.hami_writer",
            offset_of!(Header, hami_writer),
        ),
        ("vgpu_shm_header.origin", offset_of!(Header, origin)),
        ("vgpu_shm_header.devices", offset_of!(Header, devices)),
        ("vgpu_shm_device.in_use", offset_of!(DeviceEntry, in_use)),
        (
            "vgpu_shm_device.sm_limit",
            offset_of!(DeviceEntry, sm_limit),
        ),
        (
            "vgpu_shm_device.mem_limit",
            offset_of!(DeviceEntry, mem_limit),
        ),
        (
            "vgpu_shm_device.total_mem",
            offset_of!(DeviceEntry, total_mem),
        ),
        (
            "vgpu_shm_device.sm_count",
            offset_of!(DeviceEntry, sm_count),
        ),
        ("vgpu_shm_device.policy", offset_of!(DeviceEntry, policy)),
        ("vgpu_shm_device.tat_ns", offset_of!(DeviceEntry, tat_ns)),
        (
            "vgpu_shm_device.rate_scale_milli",
            offset_of!(DeviceEntry, rate_scale_milli),
        ),
        (
            "vgpu_shm_device.util_milli",
            offset_of!(DeviceEntry, util_milli),
        ),
        ("vgpu_shm_device.leader", offset_of!(DeviceEntry, leader)),
        ("vgpu_shm_device.waits", offset_of!(DeviceEntry, waits)),
        (
            "vgpu_shm_device.context_bytes",
            offset_of!(DeviceEntry, context_bytes),
        ),
        (
            "vgpu_shm_device.hami_index",
            offset_of!(DeviceEntry, hami_index),
        ),
        (
            "vgpu_shm_device.hami_limit_seen",
            offset_of!(DeviceEntry, hami_limit_seen),
        ),
        (
            "vgpu_shm_device.hami_sm_seen",
            offset_of!(DeviceEntry, hami_sm_seen),
        ),
        (
            "vgpu_shm_device.oom_denials",
            offset_of!(DeviceEntry, oom_denials),
        ),
        ("vgpu_shm_device.wait_ns", offset_of!(DeviceEntry, wait_ns)),
        (
            "vgpu_shm_device.turn_anchor_ns",
            offset_of!(DeviceEntry, turn_anchor_ns),
        ),
        (
            "vgpu_shm_device.turn_moved_ns",
            offset_of!(DeviceEntry, turn_moved_ns),
        ),
        (
            "vgpu_shm_device.turn_cut_ns",
            offset_of!(DeviceEntry, turn_cut_ns),
        ),
        (
            "vgpu_shm_device.admitted_ns",
            offset_of!(DeviceEntry, admitted_ns),
        ),
        (
            "vgpu_shm_device.turn_flags",
            offset_of!(DeviceEntry, turn_flags),
        ),
        (
            "vgpu_shm_device.turn_fill_milli",
            offset_of!(DeviceEntry, turn_fill_milli),
        ),
        (
            "vgpu_shm_device.turn_shared_ns",
            offset_of!(DeviceEntry, turn_shared_ns),
        ),
        ("vgpu_shm_slot.host_pid", offset_of!(ProcSlot, host_pid)),
        ("vgpu_shm_slot.start_time", offset_of!(ProcSlot, start_time)),
        ("vgpu_shm_slot.pidns", offset_of!(ProcSlot, pidns)),
        (
            "vgpu_shm_slot.claimed_unix_s",
            offset_of!(ProcSlot, claimed_unix_s),
        ),
        ("vgpu_shm_slot.sm_util", offset_of!(ProcSlot, sm_util)),
        ("vgpu_shm_slot.usage", offset_of!(ProcSlot, usage)),
        (
            "vgpu_shm_slot.dead_since_ms",
            offset_of!(ProcSlot, dead_since_ms),
        ),
        (
            "vgpu_shm_slot.heartbeat_ms",
            offset_of!(ProcSlot, heartbeat_ms),
        ),
        ("vgpu_shm_slot.flags", offset_of!(ProcSlot, flags)),
        ("vgpu_shm_slot.nvml_used", offset_of!(ProcSlot, nvml_used)),
    ];
    for (field, offset) in expect {
        assert_eq!(c.u64(field), offset as u64, "{field}");
    }
    assert_eq!(c.u64("read.mem_limit"), 3 << 30);
    assert_eq!(c.u64("read.sm_limit"), 40);
    assert_eq!(c.u64("read.uuid0"), 0xab);
    assert_eq!(
        c.u64(&format!("read.slot{slot}.pid")),
        u64::from(std::process::id())
    );
    assert_eq!(c.u64(&format!("read.slot{slot}.vmm")), 12345);
}

/// A reader of this layout detects a bumped version instead of misreading.
#[test]
fn a_version_bump_is_detected_by_readers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.cache");
    drop(Region::open(&path, OpenMode::CreateIfMissing).unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    let at = VGPU_OFFSET + 8;
    bytes[at..at + 4].copy_from_slice(&(VERSION_MAJOR + 1).to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let err = Region::open(&path, OpenMode::ExistingOnly)
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains(&format!(
            "layout version {}.{VERSION_MINOR} is newer",
            VERSION_MAJOR + 1
        )),
        "{err}"
    );
    // The C reader refuses it too (exit 3).
    let exe = artifacts().bin.join("shm_layout_reader");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/programs/shm_layout.c");
    assert!(
        Command::new("cc")
            .args(["-O1", "-o"])
            .arg(&exe)
            .arg(src)
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(
        Command::new(&exe)
            .arg(&path)
            .output()
            .unwrap()
            .status
            .code(),
        Some(3)
    );
}

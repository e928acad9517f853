//! include/vgpu_shm.h and the Rust layout agree: every size and offset,
//! and a region written by Rust reads back through the header in C.

mod common;

use std::mem::{offset_of, size_of};
use std::process::Command;

use common::*;
use vgpu_shm::layout::*;
use vgpu_shm::{DeviceInfo, Kind, Limits, OpenMode, ProcId, Region};

/// Appends `("c_struct.field", offset_of!(RustType, field))` for each field.
macro_rules! offsets {
    ($out:ident, $c:literal, $t:ty: $($f:ident),+) => {
        $($out.push((concat!($c, ".", stringify!($f)), offset_of!($t, $f)));)+
    };
}

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
    // Each C struct's fields against the Rust struct's, by name.
    let mut expect = Vec::new();
    offsets!(expect, "vgpu_shm_header", Header: version_major, size, header_size, state, slot_hwm, created_unix_s, reclaims, boot_id, region_id, hami_writer, origin, devices);
    offsets!(expect, "vgpu_shm_device", DeviceEntry: in_use, sm_limit, mem_limit, total_mem, sm_count, policy, tat_ns, rate_scale_milli, util_milli, leader, waits, context_bytes, hami_index, hami_limit_seen, hami_sm_seen, oom_denials, wait_ns, turn_anchor_ns, turn_moved_ns, turn_cut_ns, admitted_ns, turn_flags, turn_fill_milli, turn_shared_ns, held_ns, alone_ns, paced_ns, sync_wait_ns, rest_percent, syncs, rest_beside_ns, limited_beside_ns, turn_period_ns);
    offsets!(expect, "vgpu_shm_slot", ProcSlot: host_pid, start_time, pidns, claimed_unix_s, sm_util, usage, dead_since_ms, heartbeat_ms, flags, nvml_used, gap_device, host_gap_ns);
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

//! Older region files: vgpu's layout 1.x and HAMi-core's 1.2, each kept,
//! upgraded, adopted or refused (`adopt.rs`), never misread.

use std::io::{BufRead, BufReader};
use std::mem::offset_of;
use std::path::Path;
use std::sync::atomic::Ordering;

use super::*;
use crate::hami::{HAMI_SIZE, HamiProc, HamiRegion};
use crate::layout::{FILE_SIZE, Kind, LEGACY_SIZE, ORIGIN_HAMI_CORE, ORIGIN_VGPU_1, VGPU_OFFSET};

fn limits(mem: u64, sm: u32, policy: CorePolicy) -> Limits {
    Limits { mem, sm, policy }
}

fn info(b: u8) -> DeviceInfo {
    DeviceInfo {
        uuid: [b; 16],
        total_mem: 1 << 34,
        sm_count: 132,
    }
}

/// Writes at `path` a region of vgpu's layout 1.1 holding what `fill`
/// puts in a region: vgpu's part alone, at offset 0.
fn legacy_file(path: &Path, fill: impl FnOnce(&Region)) {
    let tmp = path.with_extension("new");
    let r = Region::open(&tmp, OpenMode::CreateIfMissing).unwrap();
    fill(&r);
    drop(r);
    let bytes = std::fs::read(&tmp).unwrap();
    std::fs::remove_file(&tmp).unwrap();
    let mut old = bytes[VGPU_OFFSET..].to_vec();
    assert_eq!(old.len(), LEGACY_SIZE);
    old[8..12].copy_from_slice(&1u32.to_le_bytes());
    old[12..16].copy_from_slice(&1u32.to_le_bytes());
    old[16..24].copy_from_slice(&(LEGACY_SIZE as u64).to_le_bytes());
    std::fs::write(path, old).unwrap();
}

/// A HAMi-core file, as HAMi-core writes it (one byte longer than its
/// layout).
struct HamiCoreFile(Vec<u8>);

impl HamiCoreFile {
    fn new(major: u32, minor: u32) -> HamiCoreFile {
        let mut f = HamiCoreFile(vec![0u8; HAMI_SIZE + 1]);
        f.put(0, &crate::hami::HAMI_MAGIC.to_le_bytes());
        f.put(4, &major.to_le_bytes());
        f.put(8, &minor.to_le_bytes());
        f.put(offset_of!(HamiRegion, priority), &1i32.to_le_bytes());
        f.put(
            offset_of!(HamiRegion, utilization_switch),
            &1i32.to_le_bytes(),
        );
        f.put(offset_of!(HamiRegion, recent_kernel), &2i32.to_le_bytes());
        for d in 0..16 {
            f.put(
                offset_of!(HamiRegion, sm_limit) + 8 * d,
                &100u64.to_le_bytes(),
            );
        }
        f
    }

    fn put(&mut self, at: usize, bytes: &[u8]) {
        self.0[at..at + bytes.len()].copy_from_slice(bytes);
    }

    fn device(&mut self, d: usize, uuid: Option<[u8; 16]>, mem: u64, sm: u64) {
        if let Some(u) = uuid {
            self.put(
                offset_of!(HamiRegion, uuids) + 96 * d,
                format_uuid(&u).as_bytes(),
            );
            let n = (d as u64 + 1).max(self.u64_at(offset_of!(HamiRegion, device_num)));
            self.put(offset_of!(HamiRegion, device_num), &n.to_le_bytes());
        }
        self.put(offset_of!(HamiRegion, limit) + 8 * d, &mem.to_le_bytes());
        self.put(offset_of!(HamiRegion, sm_limit) + 8 * d, &sm.to_le_bytes());
    }

    fn process(&mut self, k: usize, pid: i32) {
        let at = offset_of!(HamiRegion, procs) + k * std::mem::size_of::<HamiProc>();
        self.put(at, &pid.to_le_bytes());
        self.put(at + offset_of!(HamiProc, status), &1i32.to_le_bytes());
        self.put(
            offset_of!(HamiRegion, proc_num),
            &(k as i32 + 1).to_le_bytes(),
        );
    }

    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.0[at..at + 8].try_into().unwrap())
    }
}

fn dead_pid() -> i32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    pid
}

fn entry_of(r: &Region, uuid: [u8; 16]) -> &crate::layout::DeviceEntry {
    r.device(r.find_device(&uuid).expect("the device is in the region"))
}

#[test]
fn a_vgpu_1_file_without_live_processes_is_upgraded_keeping_its_limits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.cache");
    legacy_file(&path, |r| {
        let dev = r
            .register_device(&info(5), limits(3 << 30, 40, CorePolicy::Force))
            .unwrap()
            .index;
        r.device(dev).set_context_bytes(600 << 20);
        let gone = r
            .claim_slot(&ProcId {
                pid: dead_pid(),
                start_time: 1,
                pidns: ProcId::current().pidns,
            })
            .unwrap();
        r.add_usage(gone, dev, Kind::Buffer, 1 << 30);
    });
    assert_eq!(
        crate::hami::probe(&path).unwrap(),
        Format::VgpuLegacy { major: 1, minor: 1 }
    );
    let r = Region::open(&path, OpenMode::ExistingOnly).unwrap();
    assert!(matches!(r.format(), Format::Vgpu { major: 2, .. }));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), FILE_SIZE as u64);
    let d = entry_of(&r, [5; 16]);
    assert_eq!(d.limits(), limits(3 << 30, 40, CorePolicy::Force));
    assert_eq!(d.context_bytes(), Some(600 << 20));
    assert_eq!(r.header().origin.load(Ordering::Relaxed), ORIGIN_VGPU_1);
    assert_eq!(
        r.occupied_slots().count(),
        0,
        "the dead process's slot went"
    );
    let s = r.hami().unwrap().snapshot();
    assert_eq!((s.major, s.minor, s.proc_num, s.priority), (1, 2, 0, 1));
    assert!(
        r.created(),
        "the HAMi part is new: its priority is the opener's"
    );
}

#[test]
fn a_vgpu_1_file_with_a_live_process_is_used_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.cache");
    let me = ProcId::current();
    // A process of the old library, alive.
    let mut old = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    legacy_file(&path, |r| {
        let dev = r
            .register_device(&info(6), limits(1 << 30, 25, CorePolicy::Default))
            .unwrap()
            .index;
        let slot = r
            .claim_slot(&ProcId {
                pid: old.id() as i32,
                start_time: 0,
                pidns: me.pidns,
            })
            .unwrap();
        r.add_usage(slot, dev, Kind::Buffer, 700 << 20);
    });
    let r = Region::open(&path, OpenMode::ExistingOnly).unwrap();
    assert_eq!(r.format(), Format::VgpuLegacy { major: 1, minor: 1 });
    assert!(r.hami().is_none());
    let dev = r.find_device(&[6; 16]).unwrap();
    // The old process's 700 MiB count: 400 MiB more do not fit under 1 GiB.
    let slot = r.claim_slot(&me).unwrap();
    assert!(matches!(
        r.reserve(slot, dev, Kind::Buffer, 400 << 20),
        Reservation::Denied { used, .. } if used == 700 << 20
    ));
    assert!(r.enforces_sm_limit(dev), "no switch in a 1.x file");
    assert_eq!(r.mirror_hami(), crate::hami::Mirrored::default());
    r.release_slot(slot);
    drop(r);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), LEGACY_SIZE as u64);
    assert_eq!(&std::fs::read(&path).unwrap()[..8], b"VGPUSHM\0");
    // Once the old process is gone, the next open upgrades the file.
    old.kill().unwrap();
    old.wait().unwrap();
    let r = Region::open(&path, OpenMode::ExistingOnly).unwrap();
    assert!(matches!(r.format(), Format::Vgpu { major: 2, .. }));
    assert_eq!(entry_of(&r, [6; 16]).limits().sm, 25);
}

#[test]
fn an_upgrade_cut_short_is_finished_by_the_next_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.cache");
    let r = Region::open(&path, OpenMode::CreateIfMissing).unwrap();
    r.register_device(&info(7), limits(2 << 30, 0, CorePolicy::Default))
        .unwrap();
    drop(r);
    // The new part is whole; the old one still lies at offset 0.
    let mut bytes = std::fs::read(&path).unwrap();
    let old: Vec<u8> = bytes[VGPU_OFFSET..VGPU_OFFSET + 4096].to_vec();
    bytes[..4096].copy_from_slice(&old);
    std::fs::write(&path, &bytes).unwrap();
    let r = Region::open(&path, OpenMode::ExistingOnly).unwrap();
    assert_eq!(entry_of(&r, [7; 16]).limits().mem, 2 << 30);
    let s = r.hami().unwrap().snapshot();
    assert_eq!((s.major, s.minor, s.proc_num), (1, 2, 0));
    assert_eq!(
        &std::fs::read(&path).unwrap()[..4],
        &19_920_718i32.to_le_bytes()
    );
}

#[test]
fn a_hami_core_file_nobody_uses_is_adopted_with_its_limits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.cache");
    let mut f = HamiCoreFile::new(1, 2);
    f.device(0, Some([0x11; 16]), 1 << 30, 30);
    f.device(1, Some([0x22; 16]), 2 << 30, 100);
    // A limit for a device the file names no UUID for.
    f.device(2, None, 4 << 30, 100);
    f.put(offset_of!(HamiRegion, priority), &0i32.to_le_bytes());
    f.put(
        offset_of!(HamiRegion, utilization_switch),
        &0i32.to_le_bytes(),
    );
    f.process(0, dead_pid());
    std::fs::write(&path, &f.0).unwrap();
    assert_eq!(
        crate::hami::probe(&path).unwrap(),
        Format::HamiCore { major: 1, minor: 2 }
    );
    let r = Region::open(&path, OpenMode::ExistingOnly).unwrap();
    assert!(matches!(r.format(), Format::Vgpu { major: 2, .. }));
    assert!(!r.created(), "HAMi-core's settings stay");
    assert_eq!(r.header().origin.load(Ordering::Relaxed), ORIGIN_HAMI_CORE);
    assert_eq!(
        entry_of(&r, [0x11; 16]).limits(),
        limits(1 << 30, 30, CorePolicy::Default)
    );
    assert_eq!(entry_of(&r, [0x22; 16]).limits().mem, 2 << 30);
    assert_eq!(entry_of(&r, [0x22; 16]).sm_limit(), 0, "HAMi's 100 is none");
    let s = r.hami().unwrap().snapshot();
    assert_eq!((s.proc_num, s.priority, s.utilization_switch), (0, 0, 0));
    assert_eq!(s.devices.len(), 3);
    assert_eq!(s.devices[2].limit, 4 << 30);
    // The switch the monitor wrote holds: the SM limit is off until it
    // says the GPU is shared again.
    let first = r.find_device(&[0x11; 16]).unwrap();
    assert!(!r.enforces_sm_limit(first));
    // The third device, registered later with the environment's 8 GiB,
    // gets the 4 GiB the file stored for its index.
    let third = r
        .register_device(&info(0x33), limits(8 << 30, 0, CorePolicy::Default))
        .unwrap()
        .index;
    assert_eq!(r.assign_hami_index(third, Some(2)).unwrap(), Some(2));
    r.mirror_hami();
    assert_eq!(r.device(third).limits().mem, 4 << 30);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), FILE_SIZE as u64);
}

#[test]
fn a_hami_core_file_in_use_is_refused_untouched_with_its_limits_then_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.cache");
    let mut f = HamiCoreFile::new(1, 2);
    f.device(0, Some([0x44; 16]), 512 << 20, 100);
    // A HAMi-core process: it maps the file.
    let mut user = std::process::Command::new("python3")
        .args([
            "-c",
            "import mmap,sys,time; f=open(sys.argv[1],'rb'); m=mmap.mmap(f.fileno(),0,access=mmap.ACCESS_READ); print('mapped',flush=True); time.sleep(60)",
        ])
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    f.process(0, user.id() as i32);
    std::fs::write(&path, &f.0).unwrap();
    let mut line = String::new();
    BufReader::new(user.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "mapped");
    let err = Region::open(&path, OpenMode::ExistingOnly).err().unwrap();
    let ShmError::Refused {
        why: Refusal::HamiCoreInUse { pids, limits },
        ..
    } = &err
    else {
        panic!("{err}");
    };
    assert_eq!(pids, &[user.id() as i32]);
    assert_eq!(
        (limits[0].index, limits[0].mem, limits[0].sm),
        (0, 512 << 20, 0)
    );
    assert_eq!(limits[0].uuid, format_uuid(&[0x44; 16]));
    let text = err.to_string();
    assert!(
        text.contains(&user.id().to_string()) && text.contains("Delete the file"),
        "{text}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), f.0, "untouched");
    // A reader sees it as it is.
    let opened = crate::hami::open_any(&path, false).unwrap();
    assert!(matches!(opened.format(), Format::HamiCore { .. }));
    assert_eq!(opened.snapshot().unwrap().procs[0].pid, user.id() as i32);
    drop(opened);
    user.kill().unwrap();
    user.wait().unwrap();
    let r = Region::open(&path, OpenMode::ExistingOnly).unwrap();
    assert_eq!(entry_of(&r, [0x44; 16]).limits().mem, 512 << 20);
}

#[test]
fn hami_files_of_other_layouts_are_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.cache");
    for (major, minor) in [(1, 1), (0, 0), (2, 0)] {
        let f = HamiCoreFile::new(major, minor);
        std::fs::write(&path, &f.0).unwrap();
        let err = Region::open(&path, OpenMode::CreateIfMissing)
            .err()
            .unwrap();
        assert!(
            matches!(
                err,
                ShmError::Refused {
                    why: Refusal::HamiCoreVersion { .. },
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("delete it"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), f.0);
        assert!(crate::hami::probe(&path).is_err());
    }
}

#[test]
fn an_adoption_cut_short_is_finished_keeping_the_limits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.cache");
    let mut f = HamiCoreFile::new(1, 2);
    f.device(0, Some([0x55; 16]), 3 << 30, 50);
    let mut bytes = f.0;
    bytes.resize(FILE_SIZE, 0);
    // vgpu's magic written, `state` not yet.
    bytes[VGPU_OFFSET..VGPU_OFFSET + 8].copy_from_slice(b"VGPUSHM\0");
    bytes[VGPU_OFFSET + 8..VGPU_OFFSET + 12].copy_from_slice(&2u32.to_le_bytes());
    bytes[VGPU_OFFSET + 16..VGPU_OFFSET + 24].copy_from_slice(&(FILE_SIZE as u64).to_le_bytes());
    for (at, v) in [
        (24, crate::layout::HEADER_SIZE),
        (28, crate::layout::SLOT_SIZE),
        (32, MAX_DEVICES),
        (36, MAX_SLOTS),
    ] {
        bytes[VGPU_OFFSET + at..VGPU_OFFSET + at + 4].copy_from_slice(&(v as u32).to_le_bytes());
    }
    std::fs::write(&path, &bytes).unwrap();
    let r = Region::open(&path, OpenMode::ExistingOnly).unwrap();
    assert_eq!(
        entry_of(&r, [0x55; 16]).limits(),
        limits(3 << 30, 50, CorePolicy::Default)
    );
}

#[test]
fn a_reader_opens_old_files_as_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.cache");
    legacy_file(&path, |r| {
        r.register_device(&info(8), limits(1 << 30, 0, CorePolicy::Default))
            .unwrap();
    });
    let before = std::fs::read(&path).unwrap();
    let opened = crate::hami::open_any(&path, false).unwrap();
    assert_eq!(opened.format(), Format::VgpuLegacy { major: 1, minor: 1 });
    assert!(opened.snapshot().is_none());
    let r = opened.region().unwrap();
    assert_eq!(entry_of(r, [8; 16]).limits().mem, 1 << 30);
    drop(opened);
    assert_eq!(std::fs::read(&path).unwrap(), before, "not upgraded");
}

//! A read-only copy sees what the file holds and never changes the file.

use super::*;

fn temp_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("vgpu-shm-copy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

fn live_region(p: &std::path::Path) -> (Region, EntryIndex, SlotIndex) {
    let r = Region::open(p, OpenMode::CreateIfMissing).unwrap();
    let slot = r.claim_slot(&ProcId::current()).unwrap();
    let info = DeviceInfo {
        uuid: [3; 16],
        total_mem: 1 << 34,
        sm_count: 8,
    };
    let limits = Limits {
        mem: 1 << 30,
        sm: 25,
        policy: CorePolicy::Default,
    };
    let dev = r.register_device(&info, limits).unwrap().index;
    (r, dev, slot)
}

fn copy(p: &std::path::Path) -> Region {
    match read_copy(p) {
        Ok(hami::Opened::Vgpu(r)) => r,
        Ok(_) => panic!("{} read as HAMi-core's", p.display()),
        Err(e) => panic!("{}: {e}", p.display()),
    }
}

fn refusal(p: &std::path::Path) -> String {
    match read_copy(p) {
        Ok(_) => panic!("{} was read", p.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_copy_reads_usage_limits_and_owners_without_touching_the_file() {
    let p = temp_path("live.cache");
    let (r, dev, slot) = live_region(&p);
    assert_eq!(
        r.reserve(slot, dev, Kind::Buffer, 300),
        Reservation::Granted
    );
    r.add_usage(slot, dev, Kind::Context, 50);
    r.device(dev).count_oom_denial();
    let before = std::fs::read(&p).unwrap();

    let c = copy(&p);
    assert_eq!(c.path(), p.as_path());
    assert!(!c.is_shared());
    assert_eq!(c.device(dev).mem_limit(), 1 << 30);
    assert_eq!(c.device(dev).sm_limit(), 25);
    assert_eq!(c.device(dev).oom_denials(), 1);
    assert_eq!(c.device_usage(dev, Owners::Live), 350);
    assert_eq!(c.slot_usage(slot, dev, Kind::Context), 50);
    assert_eq!(c.owner(slot), r.owner(slot));
    assert_eq!(c.occupied_slots().count(), 1);
    // A later change in the file shows in the next copy, not in this one.
    r.reserve(slot, dev, Kind::Buffer, 1);
    assert_eq!(c.device_usage(dev, Owners::All), 350);
    assert_eq!(copy(&p).device_usage(dev, Owners::All), 351);
    drop(c);
    let after = std::fs::read(&p).unwrap();
    // Only the reservation above changed the file.
    let diff = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    assert!(diff <= 1, "{diff} bytes changed");
}

#[test]
fn a_copy_refuses_what_open_refuses_and_leaves_it_as_it_was() {
    // HAMi-core's magic on a file too short for its layout, random bytes,
    // a short file, a symbolic link, an empty file.
    let hami = temp_path("hami.cache");
    let mut bytes = vec![0u8; 4096];
    bytes[..4].copy_from_slice(&19920718i32.to_le_bytes());
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(&hami, &bytes).unwrap();
    let e = refusal(&hami);
    assert!(e.contains("4096 bytes"), "{e}");
    assert_eq!(std::fs::read(&hami).unwrap(), bytes);

    let junk = temp_path("junk.cache");
    std::fs::write(&junk, [7u8; 64]).unwrap();
    let e = refusal(&junk);
    assert!(e.contains("wrong magic"), "{e}");

    let short = temp_path("short.cache");
    std::fs::write(&short, b"VGPU").unwrap();
    let e = refusal(&short);
    assert!(e.contains("shorter than a region header"), "{e}");

    let (_r, _, _) = live_region(&temp_path("target.cache"));
    let link = temp_path("link.cache");
    std::os::unix::fs::symlink(temp_path("target.cache"), &link).unwrap();
    let e = refusal(&link);
    assert!(e.contains("symbolic link"), "{e}");

    let empty = temp_path("empty.cache");
    std::fs::write(&empty, b"").unwrap();
    assert!(read_copy(&empty).is_err());
    assert_eq!(
        std::fs::metadata(&empty).unwrap().len(),
        0,
        "never initialised"
    );

    let missing = temp_path("missing.cache");
    assert!(read_copy(&missing).is_err());
    assert!(!missing.exists(), "never created");
}

#[test]
fn a_truncated_file_is_read_for_what_is_left_or_refused() {
    let p = temp_path("shrunk.cache");
    let (r, dev, slot) = live_region(&p);
    r.reserve(slot, dev, Kind::Buffer, 10);
    drop(r);
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    // Cut inside vgpu's part: what is left is a whole HAMi part.
    f.set_len(layout::VGPU_OFFSET as u64 + layout::HEADER_SIZE as u64 + 10)
        .unwrap();
    assert!(matches!(read_copy(&p), Ok(hami::Opened::HamiCore(_))));
    // Cut inside the HAMi part: nothing to read.
    f.set_len(1000).unwrap();
    let e = refusal(&p);
    assert!(e.contains("1000 bytes"), "{e}");
}

#[test]
fn a_vgpu_1x_file_is_read_as_its_part_alone() {
    let p = temp_path("new.cache");
    let (r, dev, slot) = live_region(&p);
    r.reserve(slot, dev, Kind::Buffer, 4242);
    drop(r);
    // Layout 1.x was vgpu's part alone at offset 0, major version 1.
    let bytes = std::fs::read(&p).unwrap();
    let mut old = bytes[layout::VGPU_OFFSET..].to_vec();
    old[8..12].copy_from_slice(&layout::LEGACY_MAJOR.to_le_bytes());
    old[16..24].copy_from_slice(&(layout::LEGACY_SIZE as u64).to_le_bytes());
    let legacy = temp_path("legacy.cache");
    std::fs::write(&legacy, &old).unwrap();
    let c = copy(&legacy);
    assert!(c.hami().is_none());
    assert!(matches!(c.format(), Format::VgpuLegacy { major: 1, .. }));
    assert_eq!(c.device_usage(dev, Owners::All), 4242);
    assert_eq!(c.device(dev).mem_limit(), 1 << 30);
    assert_eq!(std::fs::read(&legacy).unwrap(), old);
}

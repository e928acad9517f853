//! Unit tests of the region on files in a temp dir.

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

fn temp_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("vgpu-shm-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn uuid_round_trips_through_nvml_text() {
    let u = [
        0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
    ];
    let text = format_uuid(&u);
    assert_eq!(text, "GPU-deadbeef-0102-0304-0506-0708090a0b0c");
    assert_eq!(parse_uuid(&text), Some(u));
    assert_eq!(parse_uuid("MIG-deadbeef"), None);
    assert_eq!(parse_uuid("GPU-zz"), None);
}

#[test]
fn create_then_attach_sees_the_same_counters() {
    let p = temp_path("attach.cache");
    let a = Region::open(&p, OpenMode::CreateIfMissing).unwrap();
    let me = ProcId::current();
    let slot = a.claim_slot(&me).unwrap();
    let info = DeviceInfo {
        uuid: [7; 16],
        total_mem: 1 << 30,
        sm_count: 4,
    };
    let reg = a
        .register_device(
            &info,
            Limits {
                mem: 1000,
                sm: 0,
                policy: CorePolicy::Default,
            },
        )
        .unwrap();
    assert_eq!(
        a.reserve(slot, reg.index, Kind::Buffer, 600),
        Reservation::Granted
    );
    let b = Region::open(&p, OpenMode::ExistingOnly).unwrap();
    assert_eq!(b.device_usage(reg.index, Owners::All), 600);
    assert_eq!(
        b.reserve(slot, reg.index, Kind::Vmm, 500),
        Reservation::Denied {
            limit: 1000,
            used: 600,
            asked: 500
        }
    );
    assert_eq!(
        a.device_usage(reg.index, Owners::All),
        600,
        "a denial must take its bytes back"
    );
}

#[test]
fn region_limits_win_over_a_later_environment() {
    let p = temp_path("limits.cache");
    let r = Region::open(&p, OpenMode::CreateIfMissing).unwrap();
    let info = DeviceInfo {
        uuid: [9; 16],
        total_mem: 1 << 30,
        sm_count: 4,
    };
    r.register_device(
        &info,
        Limits {
            mem: 4096,
            sm: 30,
            policy: CorePolicy::Default,
        },
    )
    .unwrap();
    let none = r.register_device(&info, Limits::default()).unwrap();
    assert_eq!(
        (none.limits.mem, none.limits.sm, none.conflict),
        (4096, 30, false)
    );
    let other = r
        .register_device(
            &info,
            Limits {
                mem: 8192,
                sm: 30,
                policy: CorePolicy::Default,
            },
        )
        .unwrap();
    assert_eq!((other.limits.mem, other.conflict), (4096, true));
}

#[test]
fn refuses_foreign_truncated_and_newer_files_without_touching_them() {
    let p = temp_path("foreign.cache");
    std::fs::write(&p, vec![0xabu8; 4096]).unwrap();
    let err = Region::open(&p, OpenMode::CreateIfMissing).err().unwrap();
    assert!(
        matches!(
            err,
            ShmError::Refused {
                why: Refusal::BadMagic { .. },
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(std::fs::read(&p).unwrap(), vec![0xabu8; 4096]);

    std::fs::write(&p, b"VGPU").unwrap();
    let err = Region::open(&p, OpenMode::ExistingOnly).err().unwrap();
    assert!(
        matches!(
            err,
            ShmError::Refused {
                why: Refusal::Truncated { .. },
                ..
            }
        ),
        "{err}"
    );

    let _ = std::fs::remove_file(&p);
    drop(Region::open(&p, OpenMode::CreateIfMissing).unwrap());
    let mut bytes = std::fs::read(&p).unwrap();
    let at = layout::VGPU_OFFSET + 8;
    bytes[at..at + 4].copy_from_slice(&(layout::VERSION_MAJOR + 1).to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    let err = Region::open(&p, OpenMode::ExistingOnly).err().unwrap();
    assert!(
        matches!(
            err,
            ShmError::Refused {
                why: Refusal::NewerLayout { .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("newer"), "{err}");
}

#[test]
fn check_rejects_lying_sizes() {
    let r = Region::anonymous().unwrap();
    let mut file = vec![0u8; format::HEAD_LEN];
    let head = &mut file[layout::VGPU_OFFSET..];
    let h = r.header();
    head[0..8].copy_from_slice(&h.magic.load(Ordering::Relaxed).to_le_bytes());
    head[8..12].copy_from_slice(&layout::VERSION_MAJOR.to_le_bytes());
    head[16..24].copy_from_slice(&(layout::FILE_SIZE as u64 * 2).to_le_bytes());
    // The geometry is right: only the size lies.
    for (at, v) in [
        (24, h.header_size.load(Ordering::Relaxed)),
        (28, h.slot_size.load(Ordering::Relaxed)),
        (32, h.max_devices.load(Ordering::Relaxed)),
        (36, h.max_slots.load(Ordering::Relaxed)),
    ] {
        head[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    let len = layout::FILE_SIZE as u64;
    assert!(matches!(
        check(&file, len),
        Err(Refusal::SizeMismatch { .. })
    ));
}

#[test]
fn reclaim_frees_slots_of_dead_processes_only() {
    let r = Region::anonymous().unwrap();
    let me = ProcId::current();
    let mine = r.claim_slot(&me).unwrap();
    let info = DeviceInfo {
        uuid: [1; 16],
        total_mem: 1 << 30,
        sm_count: 4,
    };
    let dev = r
        .register_device(
            &info,
            Limits {
                mem: 1 << 20,
                sm: 0,
                policy: CorePolicy::Default,
            },
        )
        .unwrap()
        .index;
    assert_eq!(
        r.reserve(mine, dev, Kind::Buffer, 100),
        Reservation::Granted
    );
    // A child that exits: its slot must come back.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = ProcId {
        pid: child.id() as i32,
        start_time: 1,
        pidns: me.pidns,
    };
    child.wait().unwrap();
    let theirs = r.claim_slot(&dead).unwrap();
    assert_ne!(theirs, mine);
    r.slot(theirs).host_pid.store(dead.pid, Ordering::Relaxed);
    assert_eq!(
        r.reserve(theirs, dev, Kind::Buffer, 1000),
        Reservation::Granted
    );
    assert_eq!(r.device_usage(dev, Owners::All), 1100);
    assert_eq!(r.reclaim_dead(&ProcView::current(), None).unwrap(), 1);
    assert_eq!(r.device_usage(dev, Owners::All), 100);
    assert_eq!(r.slot(mine).pid.load(Ordering::Relaxed), me.pid);
}

#[test]
fn racing_threads_never_overcommit() {
    let r = std::sync::Arc::new(Region::anonymous().unwrap());
    let me = ProcId::current();
    let info = DeviceInfo {
        uuid: [2; 16],
        total_mem: 1 << 30,
        sm_count: 4,
    };
    let dev = r
        .register_device(
            &info,
            Limits {
                mem: 1000,
                sm: 0,
                policy: CorePolicy::Default,
            },
        )
        .unwrap()
        .index;
    // Eight live owners, so no claim reclaims another's slot.
    let mut owners: Vec<_> = (0..8)
        .map(|_| {
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap()
        })
        .collect();
    let slots: Vec<SlotIndex> = owners
        .iter()
        .map(|c| {
            r.claim_slot(&ProcId {
                pid: c.id() as i32,
                start_time: 0,
                pidns: me.pidns,
            })
            .unwrap()
        })
        .collect();
    // Bytes currently granted: raised after a grant, lowered before the free.
    let granted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let over = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let threads: Vec<_> = slots
        .into_iter()
        .map(|slot| {
            let (r, over, granted) = (r.clone(), over.clone(), granted.clone());
            std::thread::spawn(move || {
                for _ in 0..20_000 {
                    if r.reserve(slot, dev, Kind::Buffer, 300) == Reservation::Granted {
                        if granted.fetch_add(300, Ordering::SeqCst) + 300 > 1000 {
                            over.fetch_add(1, Ordering::Relaxed);
                        }
                        granted.fetch_sub(300, Ordering::SeqCst);
                        r.unreserve(slot, dev, Kind::Buffer, 300);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for c in &mut owners {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert_eq!(over.load(Ordering::Relaxed), 0);
    assert_eq!(r.device_usage(dev, Owners::All), 0);
}

#[test]
fn a_dead_owner_with_an_unknown_host_pid_keeps_its_slot_for_a_grace_period() {
    let r = Region::anonymous().unwrap();
    let me = ProcId::current();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = ProcId {
        pid: child.id() as i32,
        start_time: 1,
        pidns: me.pidns,
    };
    child.wait().unwrap();
    let slot = r.claim_slot(&dead).unwrap();
    r.slot(slot).host_pid.store(0, Ordering::Relaxed);
    assert_eq!(
        r.reclaim_dead(&ProcView::current(), None).unwrap(),
        0,
        "kept: the driver may still hold its memory"
    );
    assert_ne!(r.slot(slot).dead_since_ms.load(Ordering::Relaxed), 0);
    // Known host pid: kept exactly while the driver lists it.
    r.slot(slot).host_pid.store(dead.pid, Ordering::Relaxed);
    let view = ProcView::current();
    let listed = [dead.pid as u32];
    assert_eq!(r.reclaim_dead(&view, Some(&listed)).unwrap(), 0);
    assert_eq!(r.reclaim_dead(&view, Some(&[])).unwrap(), 1);
}

/// An empty directory of its own for one test.
fn fresh_dir(name: &str) -> std::path::PathBuf {
    let d = temp_path(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn racing_creators_make_one_file_and_the_others_open_it() {
    let dir = fresh_dir("race");
    let p = dir.as_path().join("race.cache");
    let opts = crate::FileOptions {
        create: Some(0o640),
        any_owner: false,
    };
    let created: usize = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| s.spawn(|| crate::file::open(&p, opts).unwrap().1))
            .collect();
        hs.into_iter().map(|h| usize::from(h.join().unwrap())).sum()
    });
    assert_eq!(created, 1);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o640
    );
}

#[test]
fn links_fifos_directories_and_hard_links_are_refused() {
    let dir = fresh_dir("links");
    let opts = crate::FileOptions {
        create: Some(0o666),
        any_owner: false,
    };
    let link = dir.as_path().join("link.cache");
    std::os::unix::fs::symlink(dir.as_path().join("target"), &link).unwrap();
    let fifo = dir.as_path().join("fifo.cache");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    let file = dir.as_path().join("file");
    std::fs::write(&file, b"").unwrap();
    let hard = dir.as_path().join("hard.cache");
    std::fs::hard_link(&file, &hard).unwrap();
    for (p, what) in [
        (link, "a symbolic link"),
        (fifo, "a FIFO"),
        (dir.as_path().to_path_buf(), "a directory"),
        (hard, "a file with several hard links"),
    ] {
        match crate::file::open(&p, opts) {
            Err(ShmError::NotRegular { what: w, .. }) => assert_eq!(w, what, "{}", p.display()),
            // A directory cannot be opened for writing at all.
            Err(ShmError::Io { source, .. }) if what == "a directory" => {
                assert_eq!(source.raw_os_error(), Some(libc::EISDIR))
            }
            other => panic!("{}: {:?}", p.display(), other.map(|(_, c)| c)),
        }
    }
    assert!(!dir.as_path().join("target").exists());
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 0);
}

#[test]
fn a_wrong_slot_count_is_named_not_reported_as_equal_sizes() {
    let dir = fresh_dir("slots");
    let p = dir.as_path().join("r.cache");
    drop(Region::open(&p, OpenMode::CreateIfMissing).unwrap());
    let mut head = std::fs::read(&p).unwrap();
    let at = layout::VGPU_OFFSET + 36;
    head[at..at + 4].copy_from_slice(&7u32.to_le_bytes());
    let why = check(&head, head.len() as u64).unwrap_err();
    assert_eq!(
        why.to_string(),
        format!(
            "layout mismatch: the header says max_slots = 7, this library's layout has {}",
            crate::MAX_SLOTS
        )
    );
}

/// A new region at `name` with one device of uuid `[uuid; 16]` at SM 30 %,
/// and its entry.
fn region_with_a_device_at_30(name: &str, uuid: u8) -> (Region, EntryIndex) {
    let r = Region::open(&temp_path(name), OpenMode::CreateIfMissing).unwrap();
    let info = DeviceInfo {
        uuid: [uuid; 16],
        total_mem: 1 << 30,
        sm_count: 4,
    };
    let limits = Limits {
        mem: 0,
        sm: 30,
        policy: CorePolicy::Default,
    };
    let at = r.register_device(&info, limits).unwrap().index;
    (r, at)
}

#[test]
fn the_leader_s_word_that_the_container_is_alone_lasts_a_few_looks() {
    let (r, at) = region_with_a_device_at_30("alone.cache", 9);
    let e = r.device(at);
    let s = 1_000_000_000;
    assert!(!e.alone(5 * s), "never looked: not alone");
    e.note_alone(true, 5 * s);
    assert!(e.alone(5 * s) && e.alone(6 * s));
    // A leader that died leaves no stale word.
    assert!(!e.alone(5 * s + crate::layout::TURN_ALONE_NS));
    // Another container seen, or NVML silent: at once.
    e.note_alone(true, 7 * s);
    e.note_alone(false, 7 * s + s / 2);
    assert!(!e.alone(7 * s + s / 2));
    // A word from the future (another boot's clock) is no word.
    e.note_alone(true, 20 * s);
    assert!(!e.alone(19 * s));
    // Alone at time 0 still counts (0 is "no word").
    e.note_alone(true, 0);
    assert!(e.alone(1));
}

/// The leader's other words expire as `alone` does, and one written far
/// ahead of the reader's clock (a hostile writer's `u64::MAX`) never
/// stands: it would never expire.
#[test]
fn the_leader_s_words_expire_and_words_from_the_future_do_not_stand() {
    let (r, at) = region_with_a_device_at_30("words.cache", 8);
    let e = r.device(at);
    let s = 1_000_000_000;
    let bound = crate::layout::TURN_PACED_NS;
    type Note = fn(&crate::layout::DeviceEntry, bool, u64);
    type Read = fn(&crate::layout::DeviceEntry, u64) -> bool;
    let words: [(&str, Note, Read, &AtomicU64); 3] = [
        (
            "paced",
            |e, on, now| e.note_paced(on, now),
            |e, now| e.paced(now),
            &e.paced_ns,
        ),
        (
            "rest_beside",
            |e, on, now| e.note_rest_beside(on, now),
            |e, now| e.rest_beside(now),
            &e.rest_beside_ns,
        ),
        (
            "limited_beside",
            |e, on, now| e.note_limited_beside(on, now),
            |e, now| e.limited_beside(now),
            &e.limited_beside_ns,
        ),
    ];
    for (name, note, read, word) in words {
        assert!(!read(e, 5 * s), "{name}: never noted");
        note(e, true, 5 * s);
        assert!(read(e, 5 * s) && read(e, 5 * s + bound - 1), "{name}");
        assert!(!read(e, 5 * s + bound), "{name}: a stale word stands");
        note(e, false, 6 * s);
        assert!(!read(e, 6 * s), "{name}: cleared");
        // Stamped by the leader between a reader's clock read and its load.
        note(e, true, 7 * s + 1000);
        assert!(read(e, 7 * s), "{name}: a word a moment ahead");
        word.store(u64::MAX, Ordering::Relaxed);
        assert!(!read(e, 7 * s), "{name}: a word from the future");
        word.store(9 * s, Ordering::Relaxed);
        assert!(!read(e, 8 * s), "{name}: a word a second ahead");
    }
    // A probe's note: garbage from the future neither stands nor blocks
    // the next real note.
    assert!(!e.turn_shared(5 * s), "never noted");
    e.note_turn_shared(5 * s);
    assert!(e.turn_shared(6 * s));
    e.turn_shared_ns.store(u64::MAX, Ordering::Relaxed);
    assert!(!e.turn_shared(6 * s), "a note from the future stands");
    e.note_turn_shared(6 * s);
    assert!(e.turn_shared(6 * s), "a real note after garbage is lost");
    // Notes from several processes out of order: the latest stands.
    e.note_turn_shared(7 * s);
    e.note_turn_shared(6 * s);
    assert!(e.turn_shared(7 * s + crate::layout::TURN_SHARED_NS - 1));
}

#[test]
fn host_gaps_sum_the_live_slots_of_their_one_device() {
    let r = Region::anonymous().unwrap();
    let me = ProcId::current();
    let mine = r.claim_slot(&me).unwrap();
    let other = ProcId {
        pid: me.pid + 1,
        ..me
    };
    let theirs = r.claim_slot(&other).unwrap();
    let dev = |i: usize| EntryIndex::new(i).unwrap();
    r.add_host_gap(mine, dev(0), 300);
    r.add_host_gap(theirs, dev(0), 20);
    // A slot counts for the first device it was given, not another.
    r.add_host_gap(mine, dev(1), 5);
    assert_eq!(r.host_gap_ns(dev(0)), 320);
    assert_eq!(r.host_gap_ns(dev(1)), 0);
    // A forged count saturates the sum; it does not wrap to a small one.
    r.slot(theirs)
        .host_gap_ns
        .store(u64::MAX, Ordering::Relaxed);
    assert_eq!(r.host_gap_ns(dev(0)), u64::MAX);
    // A slot given back leaves the sum, and its next owner starts clean.
    r.release_slot(theirs);
    assert_eq!(r.host_gap_ns(dev(0)), 300);
    let again = r.claim_slot(&other).unwrap();
    assert_eq!(r.slot(again).host_gap_ns.load(Ordering::Relaxed), 0);
    r.add_host_gap(again, dev(1), 7);
    assert_eq!(r.host_gap_ns(dev(1)), 7);
}

//! Unit tests of what issue 13 added: owners only the driver can judge,
//! another boot's state, and a file truncated under its mapping.

use std::sync::atomic::Ordering;

use super::*;
use crate::procinfo::{monotonic_ms, my_pidns};
use crate::slots::{BEAT_STOPPED_MS, STALE_MS, VERDICT_MARGIN_MS, beat_word};

fn temp_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("vgpu-shm-survival-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

const SLOT5: SlotIndex = SlotIndex::new(5).unwrap();

fn device(r: &Region) -> EntryIndex {
    let info = DeviceInfo {
        uuid: [9; 16],
        total_mem: 1 << 30,
        sm_count: 4,
    };
    let limits = Limits {
        mem: 1 << 20,
        sm: 30,
        policy: CorePolicy::Default,
    };
    r.register_device(&info, limits).unwrap().index
}

#[test]
fn an_owner_no_proc_can_see_is_the_drivers_to_judge_once_its_beat_is_stale() {
    let r = Region::anonymous().unwrap();
    let dev = device(&r);
    // Pid 1 of another namespace, host pid 4242 (inferred from NVML).
    let foreign = ProcId {
        pid: 1,
        start_time: 7,
        pidns: my_pidns() ^ 0x5a5a,
    };
    let slot = r.claim_slot(&foreign).unwrap();
    r.set_host_pid(slot, 4242, false);
    r.add_usage(slot, dev, Kind::Buffer, 1000);
    let view = ProcView::current();
    // A fresh beat: alive, whatever the driver says.
    assert_eq!(r.reclaim_dead(&view, Some(&[])).unwrap(), 0);
    let stale = beat_word(1, monotonic_ms().saturating_sub(STALE_MS + 1));
    r.slot(slot).heartbeat_ms.store(stale, Ordering::Release);
    // Stale, but the driver lists it (frozen, holding memory): kept.
    assert_eq!(r.reclaim_dead(&view, Some(&[4242])).unwrap(), 0);
    // No driver to ask: kept.
    assert_eq!(r.reclaim_dead(&view, None).unwrap(), 0);
    // A beat left by another pid is no beat: kept.
    r.slot(slot)
        .heartbeat_ms
        .store(beat_word(2, 1), Ordering::Release);
    assert_eq!(r.reclaim_dead(&view, Some(&[])).unwrap(), 0);
    // Stale and not listed: reclaimed, its memory back.
    r.slot(slot).heartbeat_ms.store(stale, Ordering::Release);
    assert_eq!(r.reclaim_dead(&view, Some(&[7])).unwrap(), 1);
    assert_eq!(r.device_usage(dev, Owners::All), 0);
}

#[test]
fn another_boots_slots_and_bucket_are_reset_and_limits_kept() {
    let p = temp_path("boot.cache");
    let r = Region::open(&p, OpenMode::CreateIfMissing).unwrap();
    let dev = device(&r);
    let me = ProcId::current();
    let slot = r.claim_slot(&me).unwrap();
    r.add_usage(slot, dev, Kind::Buffer, 999);
    r.device(dev).tat_ns.store(u64::MAX / 2, Ordering::Release);
    r.header().boot_id[1].fetch_xor(1, Ordering::AcqRel);
    drop(r);
    let r = Region::open(&p, OpenMode::ExistingOnly).unwrap();
    assert_eq!(r.occupied_slots().count(), 0);
    assert_eq!(r.device(dev).tat_ns.load(Ordering::Acquire), 0);
    assert_eq!(r.device(dev).limits().mem, 1 << 20);
    // A 1.0 file (no boot recorded) is only stamped.
    let slot = r.claim_slot(&me).unwrap();
    r.header().boot_id[0].store(0, Ordering::Release);
    r.header().boot_id[1].store(0, Ordering::Release);
    drop(r);
    let r = Region::open(&p, OpenMode::ExistingOnly).unwrap();
    assert_eq!(r.slot(slot).pid.load(Ordering::Acquire), me.pid);
    assert_ne!(r.header().boot_id[0].load(Ordering::Acquire), 0);
}

#[test]
fn a_truncated_file_is_noticed_and_swapped_for_a_private_copy_in_place() {
    let p = temp_path("truncated.cache");
    let r = Region::open(&p, OpenMode::CreateIfMissing).unwrap();
    assert_eq!(r.check_intact(), Ok(()));
    let dev = device(&r);
    let header: &layout::Header = r.header();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(0)
        .unwrap();
    assert_eq!(r.check_intact(), Err(Tamper::Shrunk { len: 0 }));
    let me = ProcId::current();
    r.become_private(|fresh| {
        let info = DeviceInfo {
            uuid: [9; 16],
            total_mem: 1 << 30,
            sm_count: 4,
        };
        fresh.put_device(
            dev,
            &info,
            Limits {
                mem: 1 << 20,
                sm: 30,
                policy: CorePolicy::Default,
            },
        );
        fresh.claim_slot_at(SLOT5, &me, None);
    })
    .unwrap();
    // The same addresses, now private memory holding the copy.
    assert!(!r.is_shared());
    assert_eq!(r.check_intact(), Ok(()));
    assert_eq!(
        header.devices[dev.get()].mem_limit.load(Ordering::Acquire),
        1 << 20
    );
    assert_eq!(r.slot(SLOT5).pid.load(Ordering::Acquire), me.pid);
    assert_eq!(
        r.reserve(SLOT5, dev, Kind::Buffer, 2 << 20),
        Reservation::Denied {
            limit: 1 << 20,
            used: 0,
            asked: 2 << 20
        }
    );
    // A file created again under the same name is another region.
    let a = Region::open(&p, OpenMode::CreateIfMissing).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(0)
        .unwrap();
    drop(Region::open(&p, OpenMode::CreateIfMissing).unwrap());
    assert_eq!(a.check_intact(), Err(Tamper::Replaced));
}

#[test]
fn a_dead_owner_whose_namespace_pid_is_another_process_now_is_not_kept_by_that_ones_listing() {
    let r = Region::anonymous().unwrap();
    let dev = device(&r);
    let me = ProcId::current();
    let view = ProcView::current();
    // A restarted container whose namespace got its predecessor's inode:
    // the dead predecessor had our pid there (another start time), and
    // NVML gave it that pid; NVML asked from here lists our pid (us).
    let dead = ProcId {
        start_time: me.start_time + 1,
        ..me
    };
    let slot = r.claim_slot(&dead).unwrap();
    r.set_host_pid(slot, me.pid, false);
    r.add_usage(slot, dev, Kind::Buffer, 1000);
    let us = [me.pid as u32];
    // Just died: the driver may still be freeing its memory.
    assert_eq!(r.reclaim_dead(&view, Some(&us)).unwrap(), 0);
    assert!(r.owners_fading(&view, 0));
    // Its beat stopped as long as an unseen owner's must: reclaimed,
    // though the listing shows "its" pid.
    let stale = beat_word(me.pid, monotonic_ms().saturating_sub(STALE_MS + 1));
    r.slot(slot).heartbeat_ms.store(stale, Ordering::Release);
    assert_eq!(r.reclaim_dead(&view, Some(&us)).unwrap(), 1);
    assert_eq!(r.device_usage(dev, Owners::All), 0);

    // A dead sibling of our namespace whose pid is free: the listing is
    // its own (the driver still frees its memory), so it is kept.
    let gone = ProcId {
        pid: 4_194_303,
        ..me
    };
    let slot = r.claim_slot(&gone).unwrap();
    r.set_host_pid(slot, gone.pid, false);
    let stale = beat_word(gone.pid, monotonic_ms().saturating_sub(STALE_MS + 1));
    r.slot(slot).heartbeat_ms.store(stale, Ordering::Release);
    assert_eq!(r.reclaim_dead(&view, Some(&[gone.pid as u32])).unwrap(), 0);
    assert_eq!(r.reclaim_dead(&view, Some(&[])).unwrap(), 1);
}

#[test]
fn a_refusal_waits_a_moment_for_an_unseen_owner_whose_beat_is_fresh() {
    let r = Region::anonymous().unwrap();
    let foreign = ProcId {
        pid: 1,
        start_time: 7,
        pidns: my_pidns() ^ 0x5a5a,
    };
    r.claim_slot(&foreign).unwrap();
    let view = ProcView::current();
    // Fresh beat (just claimed): it may have died a moment ago.
    assert!(r.owners_fading(&view, 0));
    // Still fresh after a beat's stop time: alive.
    assert!(!r.owners_fading(&view, BEAT_STOPPED_MS + 200));
}

#[test]
fn an_unseen_owner_just_past_stale_is_still_awaited_and_one_long_stale_is_not() {
    // A refusal's wait that crossed the 3 s mark with no verdict (a poll
    // that found no driver list) keeps trying for the margin; a slot
    // stale for longer (no NVML here to judge it) does not hold every
    // refusal up.
    let r = Region::anonymous().unwrap();
    let foreign = ProcId {
        pid: 1,
        start_time: 7,
        pidns: my_pidns() ^ 0x5a5a,
    };
    let slot = r.claim_slot(&foreign).unwrap();
    let view = ProcView::current();
    let aged = |ms: u64| beat_word(1, monotonic_ms().saturating_sub(ms));
    r.slot(slot)
        .heartbeat_ms
        .store(aged(STALE_MS + 100), Ordering::Release);
    assert!(r.owners_fading(&view, 2_800));
    r.slot(slot)
        .heartbeat_ms
        .store(aged(STALE_MS + VERDICT_MARGIN_MS + 100), Ordering::Release);
    assert!(!r.owners_fading(&view, 3_800));
}

#[test]
fn a_dead_looking_owner_that_still_beats_keeps_its_slot_past_the_grace() {
    // /proc calls a thread-group leader that exited a zombie ("dead")
    // while its other threads, the watcher among them, live on and keep
    // the slot beating: its memory is still held, so its slot must stay.
    let r = Region::anonymous().unwrap();
    let dev = device(&r);
    let me = ProcId::current();
    let view = ProcView::current();
    let dead = ProcId {
        start_time: me.start_time + 1,
        ..me
    };
    let slot = r.claim_slot(&dead).unwrap();
    r.set_host_pid(slot, me.pid, false);
    r.add_usage(slot, dev, Kind::Buffer, 1000);
    // First seen dead long ago: the grace is over.
    let long_ago = monotonic_ms().saturating_sub(crate::slots::UNKNOWN_PID_GRACE_MS + 1);
    r.slot(slot)
        .dead_since_ms
        .store(long_ago, Ordering::Release);
    // A fresh beat: kept.
    let fresh = beat_word(me.pid, monotonic_ms());
    r.slot(slot).heartbeat_ms.store(fresh, Ordering::Release);
    assert_eq!(r.reclaim_dead(&view, Some(&[])).unwrap(), 0);
    assert_eq!(r.device_usage(dev, Owners::All), 1000);
    // Its beat stopped: reclaimed.
    let stopped = beat_word(me.pid, monotonic_ms().saturating_sub(BEAT_STOPPED_MS + 1));
    r.slot(slot).heartbeat_ms.store(stopped, Ordering::Release);
    assert_eq!(r.reclaim_dead(&view, Some(&[])).unwrap(), 1);
    assert_eq!(r.device_usage(dev, Owners::All), 0);
}

//! Writing the HAMi part from scratch: a fresh part, a HAMi-core file's
//! slots reset, one slot emptied, and HAMi's SM limit in vgpu's terms.
//! Below the region (which writes a fresh part when it is made) and the
//! mirror; above nothing but the layout.

use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use super::layout::{self, HAMI_DEVICES, HAMI_MAGIC, HAMI_MAJOR, HAMI_MINOR, HamiProc, HamiRegion};

/// HAMi's `sm_limit` as vgpu's percent: 0 and 100 (or more) mean none.
pub fn sm_from_hami(v: u64) -> u32 {
    if v == 0 || v >= 100 { 0 } else { v as u32 }
}

/// vgpu's SM percent as HAMi stores it: none is 100, as HAMi-core writes.
pub fn sm_to_hami(percent: u32) -> u64 {
    if percent == 0 || percent >= 100 {
        100
    } else {
        u64::from(percent)
    }
}

/// Writes a fresh HAMi part on zeroed memory; the magic goes last, with
/// Release ordering. `recent_kernel` starts at 2 and `utilization_switch`
/// at 1, as HAMi-core starts them: the SM limit applies until a monitor
/// says the GPU is not shared.
pub(crate) fn initialise(h: &HamiRegion) {
    h.major_version.store(HAMI_MAJOR, Ordering::Relaxed);
    h.minor_version.store(HAMI_MINOR, Ordering::Relaxed);
    h.sm_init_flag.store(0, Ordering::Relaxed);
    h.utilization_switch.store(1, Ordering::Relaxed);
    h.recent_kernel.store(2, Ordering::Relaxed);
    h.priority.store(1, Ordering::Relaxed);
    h.last_kernel_time.store(unix_now(), Ordering::Relaxed);
    h.device_num.store(0, Ordering::Relaxed);
    for l in &h.sm_limit {
        l.store(100, Ordering::Relaxed);
    }
    // The slots are zero already: free.
    h.proc_num.store(0, Ordering::Relaxed);
    h.owner_pid.store(0, Ordering::Relaxed);
    init_sem(&h.sem);
    init_sem(&h.sem_postinit);
    h.initialized_flag.store(HAMI_MAGIC, Ordering::Release);
}

/// Frees every process slot a HAMi-core file holds and resets its
/// semaphores (their holders are gone: the file lock is held and no
/// HAMi-core process maps the file).
pub(crate) fn reset_procs(h: &HamiRegion) {
    h.proc_num.store(0, Ordering::Release);
    for p in &h.procs {
        if p.pid.load(Ordering::Acquire) != 0 || p.seqlock.load(Ordering::Acquire) != 0 {
            clear(p);
        }
    }
    h.owner_pid.store(0, Ordering::Relaxed);
    init_sem(&h.sem);
    init_sem(&h.sem_postinit);
}

/// A process-shared semaphore of value 1 (so a HAMi-core process that
/// attaches to a vgpu region never waits on it forever).
fn init_sem(sem: &layout::Sem) {
    for w in sem {
        w.store(0, Ordering::Relaxed);
    }
    let p = sem.as_ptr() as *mut libc::sem_t;
    // SAFETY: `sem` is 32 bytes, 8-aligned, in shared memory that outlives
    // the call: exactly a sem_t on x86-64 glibc; nobody waits on it now.
    unsafe { libc::sem_init(p, 1, 1) };
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Empties a HAMi slot (under its seqlock).
pub(crate) fn clear(p: &HamiProc) {
    let seq = p.seqlock.load(Ordering::Relaxed);
    p.seqlock.store(seq | 1, Ordering::Relaxed);
    std::sync::atomic::fence(Ordering::Release);
    p.pid.store(0, Ordering::Relaxed);
    p.hostpid.store(0, Ordering::Relaxed);
    p.status.store(0, Ordering::Relaxed);
    for d in 0..HAMI_DEVICES {
        let u = &p.used[d];
        for f in [
            &u.context_size,
            &u.module_size,
            &u.data_size,
            &u.offset,
            &u.total,
        ] {
            f.store(0, Ordering::Relaxed);
        }
        p.monitorused[d].store(0, Ordering::Relaxed);
        p.device_util[d].sm_util.store(0, Ordering::Relaxed);
    }
    p.seqlock.store((seq | 1) + 1, Ordering::Release);
}

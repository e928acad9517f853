//! The state every process of the simulated machine shares: devices, their
//! schedulers, and per process its memory, its work queues and the
//! intervals in which it kept each device busy (sched.rs runs the queues).
//! Physical usage is the sum over live processes, so a killed process's
//! memory comes back the way the real driver frees it at exit. Liveness is
//! a POSIX lock each process holds on its entry's byte of the state file:
//! the kernel releases it at exit (or exec), in any pid namespace.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use memmap2::{MmapOptions, MmapRaw};
use vgpu_shm::procinfo::ProcId;

use crate::config::Config;
use crate::queue;
use crate::sched::{Queue, Sched};

pub const MAX_DEV: usize = 4;
/// Processes with a context or memory at once (a process that only calls
/// `cuInit` takes no entry, so thousands of those are cheap).
pub const MAX_PROC: usize = 48;
pub const RING: usize = 16384;
/// Entries are claimed and judged alive through locks (not pids): a
/// process of an older build at the same path would read them otherwise.
const MAGIC: u64 = u64::from_le_bytes(*b"SIMGPU05");
/// Sequence numbers of one claim of a process entry: each claim starts its
/// queues at a fresh multiple, so a stale number (a forked child's copy of
/// its parent's streams) is never mistaken for pending work.
const SEQ_SPAN: u64 = 1 << 40;

#[repr(C)]
pub struct Interval {
    pub start: AtomicU64,
    pub end: AtomicU64,
}

#[repr(C)]
pub struct Dev {
    pub total: AtomicU64,
    pub sms: AtomicU32,
    pub _pad: AtomicU32,
    pub ctx_overhead: AtomicU64,
    pub block_ns: AtomicU64,
    /// How long a context runs while others wait for the device.
    pub slice_ns: AtomicU64,
    /// Device time a switch between contexts costs.
    pub switch_ns: AtomicU64,
}

#[repr(C)]
pub struct Proc {
    /// The host pid (what NVML reports, before `SIM_GPU_PID_OFFSET`);
    /// 0: free entry.
    pub pid: AtomicI32,
    /// The pid in the process's own namespace.
    pub local_pid: AtomicI32,
    pub start_time: AtomicU64,
    pub pidns: AtomicU64,
    /// Device memory this process holds, context overhead included.
    pub used: [AtomicU64; MAX_DEV],
    /// Live contexts per device: NVML lists a process that has one.
    pub contexts: [AtomicU32; MAX_DEV],
    /// Busy intervals recorded so far (the ring holds the last `RING`),
    /// written by the scheduler.
    pub head: [AtomicU64; MAX_DEV],
    pub ring: [[Interval; RING]; MAX_DEV],
    /// Work queued on each device, in launch order.
    pub queue: [Queue; MAX_DEV],
}

#[repr(C)]
pub struct Shared {
    magic: AtomicU64,
    pub ndev: AtomicU32,
    _pad: AtomicU32,
    /// NVML's sample period (µs).
    pub nvml_period_us: AtomicU64,
    /// CLOCK_REALTIME - CLOCK_MONOTONIC in µs, fixed when the state was
    /// made: NVML's timestamps, the same in every process.
    pub clock_offset_us: AtomicU64,
    /// The next claim's first sequence number.
    pub next_seq: AtomicU64,
    pub dev: [Dev; MAX_DEV],
    pub sched: [Sched; MAX_DEV],
    pub procs: [Proc; MAX_PROC],
}

struct State {
    map: MmapRaw,
    /// Never closed, and the only descriptor of the file this process
    /// opens: closing any would drop every POSIX lock the process holds on
    /// it, its entry's lock and the schedulers' locks alike.
    file: File,
    /// Held while an entry is claimed, and across `fork` (`local.rs`): a
    /// child must not inherit it held by a thread it does not have. A std
    /// mutex, so that the child can unlock it (its waiters are the
    /// kernel's).
    claiming: Mutex<()>,
    pid_offset: u32,
    nvml_delay_us: u64,
    jitter_pct: u64,
    wander_pct: u64,
    /// (pid, proc index) of the caller, re-claimed after fork.
    me: AtomicU64,
    /// The state file's path: host copies of checkpointed processes lie
    /// beside it (`ckpt_path`).
    path: std::path::PathBuf,
}

static STATE: OnceLock<State> = OnceLock::new();

fn state() -> &'static State {
    STATE.get_or_init(|| {
        let cfg = Config::from_env();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&cfg.state)
            .unwrap_or_else(|e| panic!("sim-gpu: open {}: {e}", cfg.state.display()));
        // SAFETY: flock on an fd we own; released below.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        let size = std::mem::size_of::<Shared>() as u64;
        let mut magic = [0u8; 8];
        let current = std::os::unix::fs::FileExt::read_exact_at(&file, &mut magic, 0).is_ok()
            && u64::from_le_bytes(magic) == MAGIC
            && file.metadata().map_or(0, |m| m.len()) >= size;
        if !current {
            // Another layout's state (or none): start from zeros.
            file.set_len(0).expect("sim-gpu: clear state file");
            file.set_len(size).expect("sim-gpu: size state file");
        }
        let map = MmapOptions::new()
            .len(size as usize)
            .map_raw(&file)
            .expect("sim-gpu: map state file");
        let st = State {
            map,
            file,
            claiming: Mutex::new(()),
            pid_offset: cfg.pid_offset,
            nvml_delay_us: cfg.nvml_delay_us,
            jitter_pct: cfg.jitter_pct,
            wander_pct: cfg.wander_pct,
            me: AtomicU64::new(0),
            path: cfg.state.clone(),
        };
        let sh = st.shared();
        if sh.magic.load(Ordering::Acquire) != MAGIC {
            sh.ndev.store(cfg.count, Ordering::Relaxed);
            sh.nvml_period_us
                .store(cfg.nvml_period_us, Ordering::Relaxed);
            sh.clock_offset_us
                .store(unix_us().saturating_sub(now_ns() / 1000), Ordering::Relaxed);
            sh.next_seq.store(SEQ_SPAN, Ordering::Relaxed);
            for d in &sh.dev {
                d.total.store(cfg.memory, Ordering::Relaxed);
                d.sms.store(cfg.sms, Ordering::Relaxed);
                d.ctx_overhead.store(cfg.ctx_overhead, Ordering::Relaxed);
                d.block_ns.store(cfg.block_ns, Ordering::Relaxed);
                d.slice_ns.store(cfg.slice_ns, Ordering::Relaxed);
                d.switch_ns.store(cfg.switch_ns, Ordering::Relaxed);
            }
            sh.magic.store(MAGIC, Ordering::Release);
        }
        // SAFETY: as above.
        unsafe { libc::flock(st.file.as_raw_fd(), libc::LOCK_UN) };
        st
    })
}

impl State {
    fn shared(&self) -> &Shared {
        // SAFETY: the mapping is size_of::<Shared>() bytes, page-aligned,
        // lives for the process (the State is in a static), and Shared is
        // atomics only, valid for every bit pattern.
        unsafe { &*(self.map.as_ptr() as *const Shared) }
    }
}

pub fn shared() -> &'static Shared {
    state().shared()
}

/// The state file's descriptor, for the schedulers' record locks (bytes
/// `0..MAX_DEV`; the entries' locks lie past the shared state).
pub fn fd() -> i32 {
    state().file.as_raw_fd()
}

/// The pid NVML shows the caller for `p`, if it shows `p` at all. Like
/// driver 580's (docs/benchmarks.md, run 18): a caller in the host's pid
/// namespace sees every process by its host pid (plus
/// `SIM_GPU_PID_OFFSET`); one in another namespace sees only the
/// processes of its own namespace, by their pids there.
pub fn reported_pid(p: &Proc) -> Option<u32> {
    let host = p.pid.load(Ordering::Acquire);
    if host <= 0 {
        return None;
    }
    // Our pid as the host sees it equals getpid() in the host's namespace.
    if host_pid() == std::process::id() as i32 {
        return Some((host as u32).wrapping_add(state().pid_offset));
    }
    let mine = vgpu_shm::procinfo::my_pidns();
    (p.pidns.load(Ordering::Acquire) == mine).then(|| p.local_pid.load(Ordering::Acquire) as u32)
}

/// How long an NVML process list takes to come back after it was read.
pub fn nvml_delay() -> std::time::Duration {
    std::time::Duration::from_micros(state().nvml_delay_us)
}

/// `ns` of a kernel's work as this process's kernels take it: stretched
/// by up to `SIM_GPU_JITTER_PCT` per cent, each launch its own amount (a
/// graph's kernel node keeps what it got when it was added; a
/// compute-bound kernel's time varies a few per cent from launch to
/// launch, and the least of its timings is under its typical one).
pub fn jittered(ns: u64) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
    let pct = state().jitter_pct;
    if pct == 0 {
        return ns;
    }
    // (xorshift: any spread will do, races included.)
    let mut x = NEXT.load(Ordering::Relaxed) ^ u64::from(std::process::id());
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    NEXT.store(x, Ordering::Relaxed);
    let more = u128::from(ns) * u128::from(pct) * u128::from(x % 1000) / 100_000;
    ns.saturating_add(u64::try_from(more).unwrap_or(u64::MAX))
}

/// `ns` of a kernel's work as the device's wandering clock takes it at
/// `now` (`SIM_GPU_WANDER_PCT`: [`stretched_at`]).
pub fn wandered(ns: u64, now: u64) -> u64 {
    stretched_at(ns, now, state().wander_pct)
}

/// `ns` stretched by up to `pct` per cent, by the same amount in every
/// process at the same `now`, drifting from one value to the next every
/// [`WANDER_KNOT_NS`]: a power-bound GEMM's clock (the same kernel took
/// 1.41-1.65 ms within a second on an H100, and an H200 window's fill
/// ranged 0.88-1.00: docs/limits.md).
pub fn stretched_at(ns: u64, now: u64, pct: u64) -> u64 {
    if pct == 0 {
        return ns;
    }
    let knot = |i: u64| {
        // (A hash of the knot's index, so every process draws the same.)
        let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
        x ^= x >> 31;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 29;
        x % 1000
    };
    let (i, into) = (now / WANDER_KNOT_NS, now % WANDER_KNOT_NS);
    // Per mille of `pct`, on the line between the two knots.
    let at = (knot(i) * (WANDER_KNOT_NS - into) + knot(i + 1) * into) / WANDER_KNOT_NS;
    let more = u128::from(ns) * u128::from(pct) * u128::from(at) / 100_000;
    ns.saturating_add(u64::try_from(more).unwrap_or(u64::MAX))
}

/// How far apart the wandering clock takes a new value ([`stretched_at`]).
const WANDER_KNOT_NS: u64 = 40_000_000;

pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The calling process's entry, claimed on first use (and again after fork).
pub fn me() -> &'static Proc {
    let st = state();
    let pid = std::process::id() as i32;
    if let Some(p) = cached(st, pid) {
        return p;
    }
    let _one = st.claiming.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(p) = cached(st, pid) {
        return p;
    }
    let id = ProcId::current();
    let sh = st.shared();
    let host = host_pid();
    for (i, p) in sh.procs.iter().enumerate() {
        // Free, or its owner died: the lock is ours to take.
        if !lock_entry(&st.file, i, true) {
            continue;
        }
        // A host copy left by the entry's last, dead owner is freed, as
        // the kernel frees a dead process's memory.
        let _ = std::fs::remove_file(ckpt_path(i));
        p.local_pid.store(pid, Ordering::Relaxed);
        p.start_time.store(id.start_time, Ordering::Release);
        p.pidns.store(id.pidns, Ordering::Release);
        for u in &p.used {
            u.store(0, Ordering::Release);
        }
        for c in &p.contexts {
            c.store(0, Ordering::Release);
        }
        // The scheduler reads the queues and writes the busy intervals
        // under its lock. Until `pid` is stored, the queue's owner differs
        // from it and the scheduler leaves the entry alone.
        let base = sh.next_seq.fetch_add(SEQ_SPAN, Ordering::AcqRel);
        for dev in 0..MAX_DEV {
            let _g = queue::lock(dev);
            p.head[dev].store(0, Ordering::Release);
            p.queue[dev].reset(base, host);
        }
        p.pid.store(host, Ordering::Release);
        st.me
            .store((pid as u64) << 32 | i as u64, Ordering::Release);
        // Host copies of processes that died since are freed now.
        reclaim_dead();
        return p;
    }
    panic!("sim-gpu: more than {MAX_PROC} live processes with a context");
}

/// The claiming lock, for the fork handlers (`local.rs`); None before
/// the state is set up (nothing can hold it then).
pub fn claiming_for_fork() -> Option<MutexGuard<'static, ()>> {
    let st = STATE.get()?;
    Some(st.claiming.lock().unwrap_or_else(PoisonError::into_inner))
}

fn cached(st: &State, pid: i32) -> Option<&Proc> {
    let c = st.me.load(Ordering::Acquire);
    (c >> 32 == pid as u64).then(|| &st.shared().procs[(c & 0xffff_ffff) as usize])
}

/// Where entry `i`'s host copy lies while its process is checkpointed
/// (checkpoint.rs). It goes when the process restores or dies.
pub fn ckpt_path(i: usize) -> std::path::PathBuf {
    let mut p = state().path.clone().into_os_string();
    p.push(format!(".ckpt.{i}"));
    p.into()
}

/// The caller's entry index (claiming one if needed).
pub fn my_entry() -> usize {
    me();
    my_index(state()).expect("claimed by me()")
}

/// Our entry's index, if we have one.
fn my_index(st: &State) -> Option<usize> {
    let c = st.me.load(Ordering::Acquire);
    (c >> 32 == u64::from(std::process::id())).then_some((c & 0xffff_ffff) as usize)
}

/// Whether entry `i`'s process still runs: it is ours, or another process
/// holds its lock (the kernel dropped the lock if its process died).
pub fn alive(i: usize) -> bool {
    let st = state();
    if my_index(st) == Some(i) {
        return true;
    }
    let mut fl = entry_lock(i, libc::F_WRLCK);
    // SAFETY: fcntl on the state file's descriptor, which stays open; it
    // writes the conflicting lock, if any, into `fl`, which we own.
    let rc = unsafe { libc::fcntl(st.file.as_raw_fd(), libc::F_GETLK, &mut fl) };
    rc != 0 || fl.l_type != libc::F_UNLCK as libc::c_short
}

/// Byte `i` past the shared state: entry `i`'s lock. The schedulers' locks
/// (bytes `0..MAX_DEV`, queue.rs) never overlap these, so releasing one
/// never releases the other.
fn lock_offset(i: usize) -> libc::off_t {
    (std::mem::size_of::<Shared>() + i) as libc::off_t
}

/// Takes entry `i`'s lock (true when taken: no other process holds it),
/// or with `take` false releases it.
fn lock_entry(file: &File, i: usize, take: bool) -> bool {
    let fl = entry_lock(i, if take { libc::F_WRLCK } else { libc::F_UNLCK });
    // SAFETY: the fd is open for the process's life; fcntl reads `fl`, a
    // flock we own.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &fl) };
    rc == 0
}

fn entry_lock(i: usize, kind: i32) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: lock_offset(i),
        l_len: 1,
        l_pid: 0,
    }
}

/// Our pid as the host sees it (see lib.rs).
fn host_pid() -> i32 {
    let own = || std::process::id() as i32;
    let link = match std::env::var("SIM_GPU_HOST_PROC_FD")
        .ok()
        .and_then(|v| v.parse::<libc::c_int>().ok())
    {
        Some(fd) => readlink_at(fd, c"self"),
        None => std::fs::read_link("/proc/self")
            .ok()
            .map(|p| p.to_string_lossy().into_owned()),
    };
    link.and_then(|l| l.parse().ok()).unwrap_or_else(own)
}

fn readlink_at(dir: libc::c_int, name: &std::ffi::CStr) -> Option<String> {
    let mut buf = [0u8; 32];
    // SAFETY: `name` is NUL-terminated and `buf` is ours; readlinkat
    // writes at most buf.len() bytes and returns how many.
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let n = usize::try_from(n).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Forgets processes that have died: their memory is free again. A dead
/// entry is cleared under its lock, so no claimer can take it meanwhile.
pub fn reclaim_dead() {
    let st = state();
    let mine = my_index(st);
    for (i, p) in st.shared().procs.iter().enumerate() {
        if Some(i) == mine {
            continue;
        }
        if p.pid.load(Ordering::Acquire) == 0 {
            if ckpt_path(i).exists() && lock_entry(&st.file, i, true) {
                let _ = std::fs::remove_file(ckpt_path(i));
                lock_entry(&st.file, i, false);
            }
            continue;
        }
        if lock_entry(&st.file, i, true) {
            let _ = std::fs::remove_file(ckpt_path(i));
            for u in &p.used {
                u.store(0, Ordering::Release);
            }
            p.pid.store(0, Ordering::Release);
            lock_entry(&st.file, i, false);
        }
    }
}

/// Memory in use on `dev`, over every process that holds any.
pub fn phys_used(dev: usize) -> u64 {
    shared()
        .procs
        .iter()
        .filter(|p| p.pid.load(Ordering::Acquire) != 0)
        .map(|p| p.used[dev].load(Ordering::SeqCst))
        .sum()
}

/// Takes `bytes` of physical memory on `dev` for the caller; false when the
/// device is full even after forgetting dead processes.
pub fn phys_alloc(dev: usize, bytes: u64) -> bool {
    let total = shared().dev[dev].total.load(Ordering::Relaxed);
    let mine = &me().used[dev];
    for attempt in 0..2 {
        mine.fetch_add(bytes, Ordering::SeqCst);
        if phys_used(dev) <= total {
            return true;
        }
        mine.fetch_sub(bytes, Ordering::SeqCst);
        if attempt == 0 {
            reclaim_dead();
        }
    }
    false
}

pub fn phys_free(dev: usize, bytes: u64) {
    let _ = me().used[dev].fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
        Some(v.saturating_sub(bytes))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wandering_clock_stretches_within_its_bound_and_drifts_smoothly() {
        const MS: u64 = 1_000_000;
        assert_eq!(stretched_at(1_600_000, 123 * MS, 0), 1_600_000);
        let at = |t: u64| stretched_at(1_600_000, t, 15);
        let seen: Vec<u64> = (0..2000).map(|i| at(i * 5 * MS)).collect();
        // Never shorter, never over 15 % longer.
        assert!(seen.iter().all(|&ns| (1_600_000..=1_840_000).contains(&ns)));
        // It wanders over most of its range in 10 s ...
        let (lo, hi) = (seen.iter().min().unwrap(), seen.iter().max().unwrap());
        assert!(hi - lo > 180_000, "{lo}..{hi}");
        // ... but 1 ms on, a kernel takes nearly what it did: a clock, not
        // a coin toss per launch.
        for t in (0..200).map(|i| i * 37 * MS) {
            assert!(at(t).abs_diff(at(t + MS)) <= 240_000 / 40 + 1);
        }
    }
}

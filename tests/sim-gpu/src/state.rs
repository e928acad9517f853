//! The state every process of the simulated machine shares: devices, the
//! per-device kernel timeline, and per-process memory and busy intervals.
//! Physical usage is the sum over live processes, so a killed process's
//! memory comes back the way the real driver frees it at exit. Liveness is
//! a POSIX lock each process holds on its entry's byte of the state file:
//! the kernel releases it at exit (or exec), in any pid namespace.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use memmap2::{MmapOptions, MmapRaw};
use parking_lot::Mutex;
use vgpu_shm::procinfo::ProcId;

use crate::config::Config;

pub const MAX_DEV: usize = 2;
/// Processes with a context or memory at once (a process that only calls
/// `cuInit` takes no entry, so thousands of those are cheap).
pub const MAX_PROC: usize = 48;
pub const RING: usize = 16384;
const MAGIC: u64 = u64::from_le_bytes(*b"SIMGPU03");

#[repr(C)]
pub struct Interval {
    pub start: AtomicU64,
    pub end: AtomicU64,
}

#[repr(C)]
pub struct Dev {
    pub total: AtomicU64,
    /// End of the last kernel queued on this device (CLOCK_MONOTONIC ns).
    pub busy_until: AtomicU64,
    pub sms: AtomicU32,
    pub _pad: AtomicU32,
    pub ctx_overhead: AtomicU64,
    pub block_ns: AtomicU64,
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
    pub head: [AtomicU64; MAX_DEV],
    pub ring: [[Interval; RING]; MAX_DEV],
}

#[repr(C)]
pub struct Shared {
    magic: AtomicU64,
    pub ndev: AtomicU32,
    _pad: AtomicU32,
    pub dev: [Dev; MAX_DEV],
    pub procs: [Proc; MAX_PROC],
}

struct State {
    map: MmapRaw,
    /// Holds our entry's lock: never closed (closing any fd of the file
    /// would drop the process's POSIX locks).
    file: File,
    claiming: Mutex<()>,
    pid_offset: u32,
    nvml_delay_us: u64,
    /// (pid, proc index) of the caller, re-claimed after fork.
    me: AtomicU64,
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
        // SAFETY: flock on an fd we own; released when the file closes below.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        let size = std::mem::size_of::<Shared>() as u64;
        if file.metadata().map_or(0, |m| m.len()) < size {
            file.set_len(size).expect("sim-gpu: size state file");
        }
        let map = MmapOptions::new()
            .len(size as usize)
            .map_raw(&file)
            .expect("sim-gpu: map state file");
        let st = State {
            map,
            file: file.try_clone().expect("sim-gpu: dup state fd"),
            claiming: Mutex::new(()),
            pid_offset: cfg.pid_offset,
            nvml_delay_us: cfg.nvml_delay_us,
            me: AtomicU64::new(0),
        };
        let sh = st.shared();
        if sh.magic.load(Ordering::Acquire) != MAGIC {
            sh.ndev.store(cfg.count, Ordering::Relaxed);
            for d in &sh.dev {
                d.total.store(cfg.memory, Ordering::Relaxed);
                d.sms.store(cfg.sms, Ordering::Relaxed);
                d.ctx_overhead.store(cfg.ctx_overhead, Ordering::Relaxed);
                d.block_ns.store(cfg.block_ns, Ordering::Relaxed);
            }
            sh.magic.store(MAGIC, Ordering::Release);
        }
        // SAFETY: as above.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        State { file, ..st }
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

pub fn pid_offset() -> u32 {
    state().pid_offset
}

/// How long an NVML process list takes to come back after it was read.
pub fn nvml_delay() -> std::time::Duration {
    std::time::Duration::from_micros(state().nvml_delay_us)
}

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

pub fn sleep_until(t_ns: u64) {
    loop {
        let now = now_ns();
        if now >= t_ns {
            return;
        }
        std::thread::sleep(std::time::Duration::from_nanos(t_ns - now));
    }
}

/// The calling process's entry, claimed on first use (and again after fork).
pub fn me() -> &'static Proc {
    let st = state();
    let pid = std::process::id() as i32;
    if let Some(p) = cached(st, pid) {
        return p;
    }
    let _one = st.claiming.lock();
    if let Some(p) = cached(st, pid) {
        return p;
    }
    let id = ProcId::current();
    let sh = st.shared();
    for (i, p) in sh.procs.iter().enumerate() {
        // Free, or its owner died: the lock is ours to take.
        if !lock_entry(&st.file, i, true) {
            continue;
        }
        p.local_pid.store(pid, Ordering::Relaxed);
        p.start_time.store(id.start_time, Ordering::Release);
        p.pidns.store(id.pidns, Ordering::Release);
        for u in &p.used {
            u.store(0, Ordering::Release);
        }
        for c in &p.contexts {
            c.store(0, Ordering::Release);
        }
        for h in &p.head {
            h.store(0, Ordering::Release);
        }
        p.pid.store(host_pid(), Ordering::Release);
        st.me
            .store((pid as u64) << 32 | i as u64, Ordering::Release);
        return p;
    }
    panic!("sim-gpu: more than {MAX_PROC} live processes with a context");
}

fn cached(st: &State, pid: i32) -> Option<&Proc> {
    let c = st.me.load(Ordering::Acquire);
    (c >> 32 == pid as u64).then(|| &st.shared().procs[(c & 0xffff_ffff) as usize])
}

/// Our entry's index, if we have one.
fn my_index(st: &State) -> Option<usize> {
    let c = st.me.load(Ordering::Acquire);
    (c >> 32 == u64::from(std::process::id())).then_some((c & 0xffff_ffff) as usize)
}

/// Byte `i` past the shared state: entry `i`'s lock.
fn lock_offset(i: usize) -> libc::off_t {
    (std::mem::size_of::<Shared>() + i) as libc::off_t
}

/// Takes entry `i`'s lock (true when taken: no other process holds it),
/// or with `take` false releases it.
fn lock_entry(file: &File, i: usize, take: bool) -> bool {
    let kind = if take { libc::F_WRLCK } else { libc::F_UNLCK };
    let fl = libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: lock_offset(i),
        l_len: 1,
        l_pid: 0,
    };
    // SAFETY: the fd is open for the process's life; fcntl reads `fl`, a
    // flock we own.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &fl) };
    rc == 0
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
        if p.pid.load(Ordering::Acquire) == 0 || Some(i) == mine {
            continue;
        }
        if lock_entry(&st.file, i, true) {
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

/// Queues `dur` ns of work on `dev`'s timeline for the caller and returns
/// when it ends.
pub fn run_kernel(dev: usize, dur: u64) -> u64 {
    let d = &shared().dev[dev];
    let now = now_ns();
    let mut cur = d.busy_until.load(Ordering::Acquire);
    let (start, end) = loop {
        let start = cur.max(now);
        let end = start + dur;
        match d
            .busy_until
            .compare_exchange_weak(cur, end, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => break (start, end),
            Err(v) => cur = v,
        }
    };
    if dur > 0 {
        let p = me();
        let head = p.head[dev].load(Ordering::Acquire);
        let last = &p.ring[dev][(head.wrapping_sub(1) as usize) % RING];
        if head > 0 && last.end.load(Ordering::Acquire) == start {
            last.end.store(end, Ordering::Release);
        } else {
            let slot = &p.ring[dev][head as usize % RING];
            slot.start.store(start, Ordering::Release);
            slot.end.store(end, Ordering::Release);
            p.head[dev].store(head + 1, Ordering::Release);
        }
    }
    end
}

/// Nanoseconds `p` kept `dev` busy within [t0, t1].
pub fn busy_ns(p: &Proc, dev: usize, t0: u64, t1: u64) -> u64 {
    let head = p.head[dev].load(Ordering::Acquire);
    let mut busy = 0;
    for k in 1..=head.min(RING as u64) {
        let iv = &p.ring[dev][((head - k) % RING as u64) as usize];
        let (s, e) = (
            iv.start.load(Ordering::Acquire),
            iv.end.load(Ordering::Acquire),
        );
        if e <= t0 {
            break;
        }
        busy += e.min(t1).saturating_sub(s.max(t0));
    }
    busy
}

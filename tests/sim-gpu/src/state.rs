//! The state every process of the simulated machine shares: devices, their
//! schedulers, and per process its memory, its work queues and the
//! intervals in which it kept each device busy (sched.rs runs the queues).
//! Physical usage is the sum over live processes, so a killed process's
//! memory comes back the way the real driver frees it at exit.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use memmap2::{MmapOptions, MmapRaw};
use vgpu_shm::procinfo::{Liveness, ProcId, liveness};

use crate::config::Config;
use crate::queue;
use crate::sched::{Queue, Sched};

pub const MAX_DEV: usize = 2;
pub const MAX_PROC: usize = 48;
pub const RING: usize = 16384;
const MAGIC: u64 = u64::from_le_bytes(*b"SIMGPU03");
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
    pub pid: AtomicI32,
    pub _pad: AtomicU32,
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
    /// Kept open: the schedulers' locks are record locks on it.
    file: std::fs::File,
    pid_offset: u32,
    nvml_delay_us: u64,
    /// (pid, proc index) of the caller, re-claimed after fork.
    me: AtomicU64,
    my_ns: u64,
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
            pid_offset: cfg.pid_offset,
            nvml_delay_us: cfg.nvml_delay_us,
            me: AtomicU64::new(0),
            my_ns: ProcId::current().pidns,
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

/// The state file's descriptor, for record locks.
pub fn fd() -> i32 {
    state().file.as_raw_fd()
}

/// This process's pid namespace.
pub fn my_ns() -> u64 {
    state().my_ns
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

/// The calling process's entry, claimed on first use (and again after fork).
pub fn me() -> &'static Proc {
    let st = state();
    let pid = std::process::id() as i32;
    let cached = st.me.load(Ordering::Acquire);
    if cached >> 32 == pid as u64 {
        return &st.shared().procs[(cached & 0xffff_ffff) as usize];
    }
    let id = ProcId::current();
    let sh = st.shared();
    for attempt in 0..2 {
        for (i, p) in sh.procs.iter().enumerate() {
            if p.pid
                .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                p.start_time.store(id.start_time, Ordering::Release);
                p.pidns.store(id.pidns, Ordering::Release);
                for u in &p.used {
                    u.store(0, Ordering::Release);
                }
                for c in &p.contexts {
                    c.store(0, Ordering::Release);
                }
                let base = sh.next_seq.fetch_add(SEQ_SPAN, Ordering::AcqRel);
                for dev in 0..MAX_DEV {
                    let _g = queue::lock(dev);
                    p.head[dev].store(0, Ordering::Release);
                    p.queue[dev].reset(base, pid);
                }
                st.me
                    .store((pid as u64) << 32 | i as u64, Ordering::Release);
                return p;
            }
        }
        if attempt == 0 {
            reclaim_dead();
        }
    }
    panic!("sim-gpu: more than {MAX_PROC} live processes");
}

/// Forgets processes that have died: their memory is free again.
pub fn reclaim_dead() {
    let st = state();
    for p in &st.shared().procs {
        let pid = p.pid.load(Ordering::Acquire);
        if pid == 0 {
            continue;
        }
        let alive = liveness(
            pid,
            p.start_time.load(Ordering::Acquire),
            p.pidns.load(Ordering::Acquire),
            st.my_ns,
        );
        if alive == Liveness::Dead
            && p.pid
                .compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            for u in &p.used {
                u.store(0, Ordering::Release);
            }
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

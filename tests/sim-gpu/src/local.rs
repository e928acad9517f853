//! Per-process handle tables of the simulated driver: contexts, memory,
//! streams, events, modules, graphs. Handles are small integers cast to
//! pointers; device addresses come from a bump allocator. The table's lock
//! is held across `fork`, with the checkpoint gate and the state's
//! claiming lock (so a child never inherits one held by a thread it does
//! not have); the child keeps the tables, as it keeps any memory, under a
//! fresh lock. (A std mutex: its waiters are the kernel's, so the
//! child inherits none of the parent's.)

use std::cell::{RefCell, UnsafeCell};
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::state::MAX_DEV;

pub const CU_STREAM_LEGACY: usize = 1;
pub const CU_STREAM_PER_THREAD: usize = 2;

pub struct Ctx {
    pub dev: usize,
    pub primary: bool,
    pub default_stream: usize,
}

#[derive(Clone, Copy)]
pub struct Alloc {
    pub dev: usize,
    pub bytes: u64,
    /// The context that owns it: destroying the context frees it.
    pub ctx: usize,
}

pub struct Stream {
    pub ctx: usize,
    /// Sequence number of its last item in the process's queue on the
    /// context's device (0: none).
    pub last_seq: u64,
    /// The graph being captured into, while a capture is active.
    pub capture: Option<usize>,
}

#[derive(Clone, Copy, Default)]
pub struct Event {
    /// Where its last record's marker is: (device, sequence number);
    /// None while it was never recorded.
    pub mark: Option<(usize, u64)>,
    /// When the device reached that marker, once known.
    pub ts: Option<u64>,
}

/// A kernel launch as a graph stores it: where it runs and for how long.
#[derive(Clone)]
pub struct KernelNode {
    pub func: usize,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Simulated duration on its device.
    pub dur: u64,
}

#[derive(Default)]
pub struct Local {
    next_id: usize,
    next_addr: u64,
    pub initialized: bool,
    pub visible: Vec<usize>,
    pub ctxs: HashMap<usize, Ctx>,
    /// Primary context and its retain count, per physical device.
    pub primary: [Option<(usize, u32)>; MAX_DEV],
    pub allocs: HashMap<u64, Alloc>,
    /// Contents of allocations that were written (copies, memsets), by
    /// base address; allocations past `DATA_MAX` keep none (data.rs).
    pub data: HashMap<u64, Vec<u8>>,
    pub handles: HashMap<usize, Alloc>,
    /// VMM mappings: address -> (physical handle, bytes). Contents live
    /// with the handle (`hdata`), so a new handle mapped at the same
    /// address reads fresh memory (data.rs).
    pub mapped: HashMap<u64, (usize, u64)>,
    /// Contents of VMM physical memory that was written, by handle; kept
    /// past `cuMemRelease` while the handle is still mapped.
    pub hdata: HashMap<usize, Vec<u8>>,
    /// VMM physical memory that can be shared with other processes: made
    /// with a POSIX file descriptor as its requested handle type.
    pub exportable: std::collections::HashSet<usize>,
    /// Contents of VMM physical memory shared between processes (exported
    /// or imported), in a memfd both map; used instead of `hdata`.
    pub shared: HashMap<usize, (std::fs::File, memmap2::MmapMut)>,
    pub reserved: HashMap<u64, u64>,
    pub streams: HashMap<usize, Stream>,
    pub events: HashMap<usize, Event>,
    /// Markers queued for event records whose time is not yet known:
    /// (device, sequence number) -> event.
    pub marks: HashMap<(usize, u64), usize>,
    pub funcs: HashMap<usize, String>,
    pub modules: HashMap<usize, Vec<usize>>,
    pub pools: HashMap<usize, usize>,
    pub graphs: HashMap<usize, Vec<usize>>,
    pub nodes: HashMap<usize, KernelNode>,
    pub execs: HashMap<usize, (usize, Vec<KernelNode>)>,
}

/// The tables; the cell is written only in a forked child (`child`).
struct Tables(UnsafeCell<Mutex<Option<Local>>>);

// SAFETY: a `Mutex` is Sync; the cell is written only by `child`, on a
// forked child's only thread, with the one guard forgotten.
unsafe impl Sync for Tables {}

static LOCAL: Tables = Tables(UnsafeCell::new(Mutex::new(None)));

fn tables() -> &'static Mutex<Option<Local>> {
    // SAFETY: see `Tables`.
    unsafe { &*LOCAL.0.get() }
}

thread_local! {
    static CTX_STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// The tables, locked.
pub struct LocalGuard(MutexGuard<'static, Option<Local>>);

impl Deref for LocalGuard {
    type Target = Local;
    fn deref(&self) -> &Local {
        self.0.as_ref().expect("filled by local()")
    }
}

impl DerefMut for LocalGuard {
    fn deref_mut(&mut self) -> &mut Local {
        self.0.as_mut().expect("filled by local()")
    }
}

/// The tables, once the process is not locked by the checkpoint API
/// (checkpoint.rs): every entry point goes through here.
pub fn local() -> LocalGuard {
    crate::checkpoint::wait_open();
    local_ungated()
}

/// The tables, whatever the checkpoint state (the checkpoint API itself).
pub fn local_ungated() -> LocalGuard {
    fork_safe();
    let mut g = tables().lock().unwrap_or_else(PoisonError::into_inner);
    g.get_or_insert_with(Local::default);
    LocalGuard(g)
}

/// Registers the fork handlers, once: at the first use of the tables or
/// of the checkpoint gate, whichever comes first.
pub fn fork_safe() {
    static FORK_SAFE: std::sync::Once = std::sync::Once::new();
    FORK_SAFE.call_once(|| {
        // SAFETY: three handlers without arguments that do not unwind.
        unsafe { libc::pthread_atfork(Some(hold), Some(release), Some(child)) };
    });
}

/// What the forking thread holds across `fork`, in the order every other
/// thread takes them: the checkpoint gate, the tables, the claiming lock.
#[derive(Default)]
struct ForkHeld {
    gate: Option<crate::checkpoint::GateHeld>,
    tables: Option<MutexGuard<'static, Option<Local>>>,
    claiming: Option<MutexGuard<'static, ()>>,
}

thread_local! {
    static HELD: RefCell<ForkHeld> = RefCell::new(ForkHeld::default());
}

extern "C" fn hold() {
    let gate = crate::checkpoint::hold_gate_for_fork();
    let tables = tables().lock().unwrap_or_else(PoisonError::into_inner);
    let claiming = crate::state::claiming_for_fork();
    let _ = HELD.try_with(|h| {
        *h.borrow_mut() = ForkHeld {
            gate: Some(gate),
            tables: Some(tables),
            claiming,
        }
    });
}

extern "C" fn release() {
    let _ = HELD.try_with(|h| std::mem::take(&mut *h.borrow_mut()));
}

extern "C" fn child() {
    let _ = HELD.try_with(|h| {
        let held = std::mem::take(&mut *h.borrow_mut());
        // The gate and the claiming lock are std mutexes, unlocked here by
        // the thread that locked them (a fork keeps the calling thread).
        drop(held.claiming);
        drop(held.gate);
        std::mem::forget(held.tables);
    });
    // SAFETY: the forked child's only thread, before anything else runs;
    // the tables' one guard was forgotten. The tables move bitwise into a
    // fresh mutex written over the old one, which is never dropped.
    unsafe {
        let old = &mut *LOCAL.0.get();
        let tables = old.get_mut().unwrap_or_else(PoisonError::into_inner) as *mut Option<Local>;
        LOCAL.0.get().write(Mutex::new(tables.read()));
    }
}

impl Local {
    pub fn new_id(&mut self) -> usize {
        self.next_id += 16;
        0x1000 + self.next_id
    }

    /// A fresh device address range of `bytes`, 512-byte aligned.
    pub fn new_addr(&mut self, dev: usize, bytes: u64) -> u64 {
        if self.next_addr == 0 {
            self.next_addr = 0x7f00_0000_0000;
        }
        let base = self.next_addr + ((dev as u64) << 36);
        self.next_addr += bytes.div_ceil(512).max(1) * 512 + 512;
        base
    }

    /// The stream a launch on `stream` really uses, for context `ctx`.
    pub fn resolve_stream(&self, stream: usize, ctx: usize) -> usize {
        match stream {
            0 | CU_STREAM_LEGACY | CU_STREAM_PER_THREAD => {
                self.ctxs.get(&ctx).map_or(0, |c| c.default_stream)
            }
            s => s,
        }
    }

    /// Keeps the time of a marker whose queue slot is being reused.
    pub fn harvest(&mut self, dev: usize, old: Option<(u64, u64)>) {
        let Some((seq, ts)) = old else { return };
        if let Some(e) = self.marks.remove(&(dev, seq))
            && let Some(ev) = self.events.get_mut(&e)
            && ev.mark == Some((dev, seq))
        {
            ev.ts = Some(ts);
        }
    }

    pub fn new_context(&mut self, dev: usize, primary: bool) -> usize {
        let id = self.new_id();
        let s = self.new_id();
        self.streams.insert(
            s,
            Stream {
                ctx: id,
                last_seq: 0,
                capture: None,
            },
        );
        self.ctxs.insert(
            id,
            Ctx {
                dev,
                primary,
                default_stream: s,
            },
        );
        id
    }
}

pub fn current_ctx() -> Option<usize> {
    CTX_STACK.with(|s| s.borrow().last().copied())
}

pub fn set_current(ctx: Option<usize>) {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        if let Some(c) = ctx {
            s.push(c);
        }
    });
}

pub fn push_current(ctx: usize) {
    CTX_STACK.with(|s| s.borrow_mut().push(ctx));
}

pub fn pop_current() -> Option<usize> {
    CTX_STACK.with(|s| s.borrow_mut().pop())
}

/// Forgets `ctx` in every thread's notion of "current" that this thread can
/// see (its own stack).
pub fn drop_from_stack(ctx: usize) {
    CTX_STACK.with(|s| s.borrow_mut().retain(|&c| c != ctx));
}

//! NVML's free memory on a card as a short-lived child process sees it:
//! the one figure a checkpointed process may restore on. Its own NVML
//! memory queries wait for its restore (run 26 on the H200), and a figure another
//! process publishes on the board is another container's word, which must
//! never drive a restore (a refused restore loses the process, issue 26).
//!
//! The child is a bare `clone` (no fork handlers: vgpu's take its locks,
//! the driver's might wait on the checkpoint lock); it loads NVML afresh
//! in a new link-map namespace (`dlmopen`: its own descriptors, none of
//! this process's state, none of vgpu's hooks), asks, writes its answer
//! into a pipe and `_exit`s. A child may wait for ever on a lock another
//! thread held at the clone, so one that is slow gets a sibling; the
//! parent takes the first answer within a bound and then kills them. A
//! child that cannot even be reaped is reaped at the next ask, and while
//! [`MAX_UNREAPED`] are, none is made. The child has no exit
//! signal: the host program gets no `SIGCHLD` and its `wait()` never sees
//! it (only `__WALL` does), so nobody else can reap it and hand its pid on.
//! No answer is "not known", never "room".

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::time::{Duration, Instant};

use super::sys::{Memory, NvmlDevice};
use crate::lock::{Listed, Lock, Name};

type InitFn = unsafe extern "C" fn() -> c_int;
type ByUuidFn = unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> c_int;
type MemFn = unsafe extern "C" fn(NvmlDevice, *mut Memory) -> c_int;

/// Children killed but not yet reaped (one stuck in the driver). A
/// forked child has none: they are its parent's.
static UNREAPED: Lock<Vec<libc::pid_t>> = Lock::new(Vec::new(), |v| v.clear());
/// Never more than this many stuck: no question is asked that could
/// leave more (each makes up to [`CHILDREN`]).
const MAX_UNREAPED: usize = 6;
/// How long the children may take to answer: a fresh NVML takes
/// seconds on a node of many cards.
pub const ANSWER_WAIT: Duration = Duration::from_secs(5);
/// At most this many children per question, a new one each
/// [`HEDGE_AFTER`] while none has answered.
const CHILDREN: usize = 3;
const HEDGE_AFTER: Duration = Duration::from_millis(500);

/// This module's lock, for the fork handlers (`fork.rs`).
pub fn locks() -> [Listed; 1] {
    [(Name::of("nvml.unreaped"), &UNREAPED)]
}

/// Free bytes on `uuid` as a fresh child process's NVML says, within
/// `wait`, and when the child that answered asked (`CLOCK_MONOTONIC` ns,
/// after NVML's start; when it was made where it says no sensible time);
/// None when none answered (or NVML cannot say).
///
/// A child that has not answered [`HEDGE_AFTER`] after its clone gets a
/// sibling, up to [`CHILDREN`]: a bare clone copies no lock state, so a
/// child made while another thread held the allocator's or the loader's
/// lock waits on it forever (seen once on CI: a child usually answers in
/// 1-6 ms, this one not in 2 s). The first answer counts.
pub fn free_memory(uuid: &[u8; 16], wait: Duration) -> Option<(u64, u64)> {
    if reap_old() + CHILDREN > MAX_UNREAPED {
        return None;
    }
    // Everything a child needs is made before its clone.
    let text = CString::new(vgpu_shm::format_uuid(uuid)).ok()?;
    let t0 = Instant::now();
    let deadline = t0 + wait;
    let mut kids: Vec<Child> = Vec::with_capacity(CHILDREN);
    let mut answer = None;
    // How long the clones took (the parent's share of a child's time).
    let mut cloning = Duration::ZERO;
    for n in 1..=CHILDREN {
        let cloning_from = Instant::now();
        match spawn(&text) {
            Some(kid) => kids.push(kid),
            None if kids.is_empty() => return None,
            None => {}
        }
        cloning += cloning_from.elapsed();
        if let Some(a) = first_answer(&mut kids, hedge_until(n, Instant::now(), deadline)) {
            answer = a;
            break;
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    log::debug!(
        "{} child process(es) for NVML's free memory: {answer:?} in {} ms ({} ms of it cloning; bound {} ms)",
        kids.len(),
        t0.elapsed().as_millis(),
        cloning.as_millis(),
        wait.as_millis()
    );
    for kid in kids {
        // SAFETY: closing a read end we own; the child is ours to kill.
        unsafe {
            libc::close(kid.fd);
            libc::kill(kid.pid, libc::SIGKILL);
        }
        reap(kid.pid);
    }
    answer
}

/// Until when the children made so far are waited for, the `n`th just
/// made (its clone returned at `cloned`): [`HEDGE_AFTER`] more, then a
/// sibling; the last until `deadline`. Counted from the clone's return:
/// cloning a process that holds a checkpoint of tens of GiB takes the
/// parent a second or more, and counted from the question every wait had
/// passed before its child ran. Three children were made each time, and
/// the first's answer, read after the third's clone, was stale on
/// arrival: checkpointed processes on an H100 waited 45-250 s to restore
/// onto an empty card (runs 122-123).
fn hedge_until(n: usize, cloned: Instant, deadline: Instant) -> Instant {
    if n < CHILDREN {
        (cloned + HEDGE_AFTER).min(deadline)
    } else {
        deadline
    }
}

/// One child asking NVML: its pid, the read end of its pipe, when it was
/// made.
struct Child {
    pid: libc::pid_t,
    fd: c_int,
    cloned_ns: u64,
    /// Its pipe is still open (it has neither answered nor died).
    open: bool,
}

/// Clones a child that asks NVML about `uuid`; None when it cannot.
fn spawn(uuid: &CStr) -> Option<Child> {
    let lib = c"libnvidia-ml.so.1";
    let mut fds: [c_int; 2] = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into an array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    let cloned_ns = crate::clock::monotonic_ns();
    // SAFETY: a bare clone as fork (no flags, no exit signal, no new
    // stack): the child runs `child` below and never returns into Rust
    // code.
    let pid = unsafe { libc::syscall(libc::SYS_clone, 0 as libc::c_long, 0, 0, 0, 0) };
    if pid == 0 {
        // SAFETY: in the child; it only loads NVML, asks, writes, exits.
        unsafe { child(fds[1], lib, uuid) }
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(fds[1]) };
    if pid < 0 {
        // SAFETY: closing the read end we own.
        unsafe { libc::close(fds[0]) };
        return None;
    }
    Some(Child {
        pid: pid as libc::pid_t,
        fd: fds[0],
        cloned_ns,
        open: true,
    })
}

/// The first answer of `kids` by `until`: Some((free, when its child was
/// made)), or Some(None) when NVML could not say or every child died
/// without a word; None when none has answered yet.
fn first_answer(kids: &mut [Child], until: Instant) -> Option<Option<(u64, u64)>> {
    loop {
        if kids.iter().all(|k| !k.open) {
            return Some(None);
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        let mut polls: Vec<libc::pollfd> = kids
            .iter()
            .filter(|k| k.open)
            .map(|k| libc::pollfd {
                fd: k.fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: poll on pollfds we own, their count passed with them.
        let rc = unsafe {
            libc::poll(
                polls.as_mut_ptr(),
                polls.len() as libc::nfds_t,
                left.as_millis().max(1) as c_int,
            )
        };
        if rc <= 0 {
            continue;
        }
        for p in polls.iter().filter(|p| p.revents != 0) {
            // A child writes its answer at once (under PIPE_BUF, so it
            // arrives whole) or dies without it.
            let mut buf = [0u8; ANSWER_BYTES];
            // SAFETY: reading into a buffer we own.
            let n = unsafe { libc::read(p.fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if n == buf.len() as isize {
                let free = u64::from_le_bytes(buf[1..9].try_into().ok()?);
                let asked = u64::from_le_bytes(buf[9..].try_into().ok()?);
                let made = kids
                    .iter()
                    .find(|k| k.fd == p.fd)
                    .map_or(0, |k| k.cloned_ns);
                // When it asked, if that is after its clone and not yet
                // to come; else when it was made.
                let now = crate::clock::monotonic_ns();
                let at = if asked >= made && asked <= now {
                    asked
                } else {
                    made
                };
                return Some((buf[0] == 1).then_some((free, at)));
            }
            if let Some(k) = kids.iter_mut().find(|k| k.fd == p.fd) {
                k.open = false;
            }
        }
    }
}

/// Reaps `pid` if it is gone within a moment; else later.
fn reap(pid: libc::pid_t) {
    for _ in 0..50 {
        // SAFETY: waitpid on our own child, no status wanted (__WALL: a
        // child without an exit signal).
        let rc = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG | libc::__WALL) };
        if rc != 0 {
            // Reaped, or gone already (a program that reaps every child).
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    UNREAPED.lock().push(pid);
}

/// Reaps what it can of the children stuck before; how many are left.
fn reap_old() -> usize {
    let mut v = UNREAPED.lock();
    v.retain(|&pid| {
        // SAFETY: as in `reap`.
        let rc = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG | libc::__WALL) };
        rc == 0
    });
    v.len()
}

/// What a child writes: a word saying whether NVML answered, the free
/// bytes, and when it asked (`CLOCK_MONOTONIC` ns: under `PIPE_BUF`, so
/// it arrives whole).
const ANSWER_BYTES: usize = 17;

/// The child: a fresh NVML, one question, [`ANSWER_BYTES`] bytes,
/// `_exit`. The figure is stamped when the question is asked, after
/// NVML's start (which takes seconds on a node of many cards: stamped at
/// the clone, every figure there was stale on arrival, and a
/// checkpointed process on an H200 waited minutes for room it had, run
/// 116).
///
/// # Safety
/// Only in the child of the bare clone above.
unsafe fn child(fd: c_int, lib: &CStr, uuid: &CStr) -> ! {
    let mut out = [0u8; ANSWER_BYTES];
    // SAFETY: dlmopen/dlsym with NUL-terminated names; each symbol is
    // NVML's with the signature named (nvml.h); the pointers passed are
    // ours; write and _exit are plain system calls.
    unsafe {
        let h = libc::dlmopen(
            libc::LM_ID_NEWLM,
            lib.as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        );
        if !h.is_null() {
            let init = crate::interpose::real::dlsym(h, c"nvmlInit_v2");
            let by_uuid = crate::interpose::real::dlsym(h, c"nvmlDeviceGetHandleByUUID");
            let mem = crate::interpose::real::dlsym(h, c"nvmlDeviceGetMemoryInfo");
            if !init.is_null() && !by_uuid.is_null() && !mem.is_null() {
                let init: InitFn = std::mem::transmute::<*mut c_void, InitFn>(init);
                let by_uuid: ByUuidFn = std::mem::transmute::<*mut c_void, ByUuidFn>(by_uuid);
                let mem: MemFn = std::mem::transmute::<*mut c_void, MemFn>(mem);
                let mut dev: NvmlDevice = std::ptr::null_mut();
                let mut m = Memory::default();
                if init() == 0 && by_uuid(uuid.as_ptr(), &mut dev) == 0 {
                    let asked = crate::clock::monotonic_ns();
                    if mem(dev, &mut m) == 0 {
                        out[0] = 1;
                        out[1..9].copy_from_slice(&m.free.to_le_bytes());
                        out[9..].copy_from_slice(&asked.to_le_bytes());
                    }
                }
            }
        }
        libc::write(fd, out.as_ptr().cast(), out.len());
        libc::_exit(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sibling_is_made_only_after_the_last_clone_had_its_time_to_answer() {
        let t0 = Instant::now();
        let deadline = t0 + ANSWER_WAIT;
        // A clone that took 1.4 s (a process holding a 46 GiB checkpoint)
        // still gets its HEDGE_AFTER to answer, not none.
        let cloned = t0 + Duration::from_millis(1400);
        assert_eq!(hedge_until(1, cloned, deadline), cloned + HEDGE_AFTER);
        assert_eq!(hedge_until(2, cloned, deadline), cloned + HEDGE_AFTER);
        // The last child waits out the bound; none waits past it.
        assert_eq!(hedge_until(CHILDREN, cloned, deadline), deadline);
        let late = deadline - Duration::from_millis(100);
        assert_eq!(hedge_until(1, late, deadline), deadline);
    }
}

//! NVML's free memory on a card as a short-lived child process sees it:
//! the one figure a checkpointed process may restore on. Its own NVML
//! memory queries wait for its restore (run 26 on the H200), and a figure another
//! process publishes on the board is another container's word, which must
//! never drive a restore (a refused restore loses the process, issue 26).
//!
//! The child is a bare `clone` (no fork handlers: vgpu's take its locks,
//! the driver's might wait on the checkpoint lock); it keeps none of the
//! process's descriptors but its answer's pipe (`keep_only`), loads NVML afresh
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
/// At most this many children per question, a new one where none has
/// answered [`HEDGE_AFTER`] (or its clone's time) after the last clone.
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
    let asked = ask(|| spawn(&text), t0 + wait);
    log::debug!(
        "{} child process(es) for NVML's free memory: {:?} in {} ms ({} ms of it cloning; bound {} ms)",
        asked.kids.len(),
        asked.answer,
        t0.elapsed().as_millis(),
        asked.cloning.as_millis(),
        wait.as_millis()
    );
    for kid in asked.kids {
        // SAFETY: closing a read end we own; the child is ours to kill.
        unsafe {
            libc::close(kid.fd);
            libc::kill(kid.pid, libc::SIGKILL);
        }
        reap(kid.pid);
    }
    asked.answer
}

/// What the children of one question said.
struct Asked {
    /// Those made (their pipes still open: the caller closes them).
    kids: Vec<Child>,
    /// The freshest answer, if any came in time.
    answer: Option<(u64, u64)>,
    /// How long their clones took (the parent's share of their time).
    cloning: Duration,
}

/// Makes children with `spawn` and waits for an answer by `deadline`:
/// a sibling for each that has not answered in time ([`hedge_until`]),
/// up to [`CHILDREN`], but none whose clone alone (as long as the last)
/// would outlast the deadline.
fn ask(mut spawn: impl FnMut() -> Option<Child>, deadline: Instant) -> Asked {
    let mut asked = Asked {
        kids: Vec::with_capacity(CHILDREN),
        answer: None,
        cloning: Duration::ZERO,
    };
    for n in 1..=CHILDREN {
        let from = Instant::now();
        match spawn() {
            Some(kid) => asked.kids.push(kid),
            None if asked.kids.is_empty() => break,
            None => {}
        }
        let took = from.elapsed();
        asked.cloning += took;
        let mut until = hedge_until(n, Instant::now(), took, deadline);
        if n < CHILDREN && until + took >= deadline {
            until = deadline;
        }
        if let Some(a) = first_answer(&mut asked.kids, until) {
            asked.answer = a;
            break;
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    asked
}

/// Until when the children made so far are waited for, the `n`th just
/// made (its clone returned at `cloned`, after taking `took`): the
/// longer of [`HEDGE_AFTER`] and its clone's time more, then a sibling;
/// the last until `deadline`. Counted from the clone's return: cloning a
/// process that holds a checkpoint of tens of GiB takes the parent up to
/// a second, and counted from the question every wait had passed before
/// its child ran. Three children were made each time, and the first's
/// answer, read after the third's clone, was stale on arrival:
/// checkpointed processes on an H100 waited 45-250 s to restore onto an
/// empty card (runs 122-123).
fn hedge_until(n: usize, cloned: Instant, took: Duration, deadline: Instant) -> Instant {
    if n < CHILDREN {
        (cloned + HEDGE_AFTER.max(took)).min(deadline)
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

/// The freshest answer of `kids` by `until` (looked for once more at
/// `until`): Some((free, when its child asked)), or Some(None) when NVML
/// could not say or every child died without a word; None when none has
/// answered yet.
fn first_answer(kids: &mut [Child], until: Instant) -> Option<Option<(u64, u64)>> {
    loop {
        if kids.iter().all(|k| !k.open) {
            return Some(None);
        }
        let left = until.saturating_duration_since(Instant::now());
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
                c_int::try_from(left.as_millis()).unwrap_or(c_int::MAX),
            )
        };
        if rc <= 0 {
            if left.is_zero() {
                return None;
            }
            continue;
        }
        // Several may have answered while the parent was cloning: the
        // newest figure counts.
        let mut best: Option<(u64, u64)> = None;
        let mut cannot_say = false;
        for p in polls.iter().filter(|p| p.revents != 0) {
            match read_answer(p.fd) {
                Read::Again => {}
                Read::Said(answer, asked) => {
                    let Some(kid) = kids.iter_mut().find(|k| k.fd == p.fd) else {
                        continue;
                    };
                    kid.open = false;
                    match answer {
                        Some(free) => {
                            let at = stamp(asked, kid.cloned_ns, crate::clock::monotonic_ns());
                            if best.is_none_or(|(_, b)| at > b) {
                                best = Some((free, at));
                            }
                        }
                        None => cannot_say = true,
                    }
                }
                Read::Gone => {
                    if let Some(k) = kids.iter_mut().find(|k| k.fd == p.fd) {
                        k.open = false;
                    }
                }
            }
        }
        if best.is_some() || cannot_say {
            return Some(best);
        }
    }
}

/// What a child's pipe gave.
enum Read {
    /// Interrupted: read again.
    Again,
    /// Its answer (free bytes where NVML could say) and when it asked.
    Said(Option<u64>, u64),
    /// Closed (or short) without an answer.
    Gone,
}

fn read_answer(fd: c_int) -> Read {
    // A child writes its answer at once (under PIPE_BUF, so it arrives
    // whole) or dies without it.
    let mut buf = [0u8; ANSWER_BYTES];
    // SAFETY: reading into a buffer we own, its length passed with it.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
        return Read::Again;
    }
    if n != buf.len() as isize {
        return Read::Gone;
    }
    let word = |r: std::ops::Range<usize>| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&buf[r]);
        u64::from_le_bytes(w)
    };
    let asked = word(9..17);
    Read::Said((buf[0] == 1).then(|| word(1..9)), asked)
}

/// When a figure was asked: its child's word, if that is after its clone
/// (`made`) and not yet to come (`now`); else when the child was made.
fn stamp(asked: u64, made: u64, now: u64) -> u64 {
    if asked >= made && asked <= now {
        asked
    } else {
        made
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
    // SAFETY: in the child, plain system calls on its own descriptors.
    unsafe { keep_only(fd) };
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

/// Leaves the child only `fd` (its answer's pipe) and `/dev/null` as its
/// standard streams: a bare clone inherits every descriptor of the
/// process, and one stuck in the driver (it cannot even be killed) would
/// hold the host program's stdout and stderr pipes and sockets open for
/// as long as it lives, so that whatever reads them never sees their
/// end (a test that killed a hung process then waited for ever on its
/// output). Where the pipe is itself 0-2 (the process had closed its
/// standard streams), nothing is changed.
///
/// # Safety
/// Only in the child of the bare clone: it closes descriptors that the
/// parent's threads own in the parent.
unsafe fn keep_only(fd: c_int) {
    if fd <= 2 {
        return;
    }
    // SAFETY: open, dup2 and close_range are plain system calls on this
    // child's own descriptor table. close_range (Linux 5.9) may be
    // missing: then the rest stay open, as before.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            for std in 0..=2 {
                libc::dup2(null, std);
            }
        }
        let all = libc::c_uint::MAX;
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            (fd - 1) as libc::c_uint,
            0,
        );
        libc::syscall(libc::SYS_close_range, (fd + 1) as libc::c_uint, all, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    /// A child whose clone takes `clone`, and which answers `free` after
    /// `answer` (or never, for None), stamped as it writes.
    fn fake(clone: Duration, answer: Option<Duration>, free: u64) -> Option<Child> {
        std::thread::sleep(clone);
        let (r, mut w) = std::io::pipe().ok()?;
        let cloned_ns = crate::clock::monotonic_ns();
        std::thread::spawn(move || {
            let Some(after) = answer else {
                // Never answers while the question lasts.
                std::thread::sleep(Duration::from_secs(30));
                return;
            };
            std::thread::sleep(after);
            let mut out = [0u8; ANSWER_BYTES];
            out[0] = 1;
            out[1..9].copy_from_slice(&free.to_le_bytes());
            out[9..].copy_from_slice(&crate::clock::monotonic_ns().to_le_bytes());
            let _ = std::io::Write::write_all(&mut w, &out);
        });
        Some(Child {
            pid: 0,
            fd: r.into_raw_fd(),
            cloned_ns,
            open: true,
        })
    }

    fn close(asked: Asked) -> Option<(u64, u64)> {
        for k in &asked.kids {
            // SAFETY: the read end made by `fake`, closed once.
            unsafe { libc::close(k.fd) };
        }
        asked.answer
    }

    #[test]
    fn a_slow_clone_gets_its_own_time_and_its_answer_arrives_fresh() {
        // Clones of 0.7 s (a process holding a large checkpoint), NVML
        // answering 50 ms after: counted from the question, three
        // children were made and the first answer was read 1.4 s late.
        let slow = Duration::from_millis(700);
        let mut made = 0;
        let asked = ask(
            || {
                made += 1;
                fake(slow, Some(Duration::from_millis(50)), 42)
            },
            Instant::now() + ANSWER_WAIT,
        );
        let kids = asked.kids.len();
        let read_at = crate::clock::monotonic_ns();
        let (free, at) = close(asked).expect("an answer");
        assert_eq!((made, kids, free), (1, 1, 42));
        // Read soon after its question, not after siblings' clones.
        assert!(
            read_at - at < 500_000_000,
            "read {} ms late",
            (read_at - at) / 1_000_000
        );
    }

    #[test]
    fn silent_children_are_given_siblings_within_the_bound() {
        let t0 = Instant::now();
        let bound = Duration::from_millis(1500);
        let mut made = 0;
        let asked = ask(
            || {
                made += 1;
                fake(Duration::from_millis(100), None, 0)
            },
            t0 + bound,
        );
        assert_eq!(asked.kids.len(), CHILDREN);
        assert!(close(asked).is_none());
        assert_eq!(made, CHILDREN);
        // The bound holds (a loaded machine's late wake-ups aside), not a
        // child's whole ANSWER_WAIT more.
        assert!(t0.elapsed() < bound + Duration::from_secs(1));
    }

    #[test]
    fn no_sibling_is_cloned_that_would_outlast_the_bound() {
        // Clones of 1 s: a second, made after the first's 1 s wait, would
        // end at 3 s, the bound, so the first child has the whole bound,
        // and its late answer (at 2.3 s) counts.
        let mut made = 0;
        let asked = ask(
            || {
                made += 1;
                fake(
                    Duration::from_millis(1000),
                    Some(Duration::from_millis(1300)),
                    7,
                )
            },
            Instant::now() + Duration::from_millis(3000),
        );
        assert_eq!(close(asked).map(|(f, _)| f), Some(7));
        assert_eq!(made, 1);
    }

    #[test]
    fn of_answers_waiting_together_the_newest_counts() {
        let mut kids: Vec<Child> = [(5u64, 1_000u64), (9, 2_000), (3, 1_500)]
            .into_iter()
            .filter_map(|(free, asked)| {
                let (r, mut w) = std::io::pipe().ok()?;
                let mut out = [0u8; ANSWER_BYTES];
                out[0] = 1;
                out[1..9].copy_from_slice(&free.to_le_bytes());
                out[9..].copy_from_slice(&asked.to_le_bytes());
                std::io::Write::write_all(&mut w, &out).ok()?;
                Some(Child {
                    pid: 0,
                    fd: r.into_raw_fd(),
                    cloned_ns: 0,
                    open: true,
                })
            })
            .collect();
        assert_eq!(kids.len(), 3);
        let got = first_answer(&mut kids, Instant::now());
        for k in &kids {
            // SAFETY: the read ends made above, closed once.
            unsafe { libc::close(k.fd) };
        }
        assert_eq!(got, Some(Some((9, 2_000))));
    }

    #[test]
    fn a_figure_is_stamped_when_asked_unless_that_is_impossible() {
        assert_eq!(stamp(150, 100, 200), 150);
        // Before its clone, or from the future: when it was made.
        assert_eq!(stamp(50, 100, 200), 100);
        assert_eq!(stamp(250, 100, 200), 100);
    }
}

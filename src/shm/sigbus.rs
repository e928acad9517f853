//! The last line against a region file that shrinks under its users (see
//! `private.rs`): a SIGBUS raised by a page of a registered mapping is
//! repaired instead of killing the process. The handler maps private zero
//! pages over the whole mapping and returns, so the faulting access
//! completes on them; the library's next check of the file
//! (`Region::check_size`) then swaps in the proper private copy. Until
//! then (one group of accesses) the region reads as zeros: at most one
//! reservation is judged against no limit.
//!
//! A SIGBUS outside every registered mapping goes to the handler the
//! program had (or its default action), exactly as without vgpu. A
//! program that installs its own SIGBUS handler after us replaces this
//! one; the checks before each access still guard all but a thread
//! preempted between its check and its access.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::Once;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Mappings watched at once (a process maps one region, rarely two).
const RANGES: usize = 8;

/// (start, len) of each watched mapping; 0 when free.
static STARTS: [AtomicUsize; RANGES] = [const { AtomicUsize::new(0) }; RANGES];
static LENS: [AtomicUsize; RANGES] = [const { AtomicUsize::new(0) }; RANGES];
/// Faults repaired so far.
static REPAIRED: AtomicUsize = AtomicUsize::new(0);

/// The action SIGBUS had before ours: written once, before ours is
/// installed, and only read afterwards (from the handler).
struct Previous(UnsafeCell<MaybeUninit<libc::sigaction>>);
// SAFETY: written once inside `INSTALL.call_once` before the handler that
// reads it exists; never written again.
unsafe impl Sync for Previous {}
static PREVIOUS: Previous = Previous(UnsafeCell::new(MaybeUninit::zeroed()));
static INSTALL: Once = Once::new();

/// A watched mapping; dropped before the mapping is unmapped, so a later
/// mapping at the same addresses is never touched by the handler.
pub(crate) struct Watch(usize);

impl Watch {
    /// Watches `[start, start + len)`: a SIGBUS there is repaired. None
    /// when every entry is taken (the checks before access still apply).
    pub(crate) fn new(start: *const u8, len: usize) -> Option<Watch> {
        install();
        for (i, (s, l)) in STARTS.iter().zip(&LENS).enumerate() {
            // The length first: the handler reads a start, then its length.
            if s.load(Ordering::Acquire) == 0 {
                l.store(len, Ordering::Release);
                if s.compare_exchange(0, start as usize, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return Some(Watch(i));
                }
            }
        }
        None
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        STARTS[self.0].store(0, Ordering::Release);
    }
}

/// How many faults were repaired in this process.
pub fn repaired() -> usize {
    REPAIRED.load(Ordering::Relaxed)
}

fn install() {
    INSTALL.call_once(|| {
        // SAFETY: `act` is fully initialised below; PREVIOUS is written here
        // only, before our handler is installed.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            let prev = (*PREVIOUS.0.get()).as_mut_ptr();
            // On failure the checks before every access are what is left.
            libc::sigaction(libc::SIGBUS, &act, prev);
        }
    });
}

/// # Safety
/// Called by the kernel only, as an `SA_SIGINFO` handler: `info` and `ctx`
/// are what it passes.
unsafe extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for (s, l) in STARTS.iter().zip(&LENS) {
        let start = s.load(Ordering::Acquire);
        let len = l.load(Ordering::Acquire);
        if start != 0 && addr >= start && addr < start + len {
            // SAFETY: [start, start + len) is a mapping of ours (registered
            // by `watch`); MAP_FIXED replaces its pages with private zero
            // pages, which cannot fault. mmap is a plain system call.
            let p = unsafe {
                libc::mmap(
                    start as *mut c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                REPAIRED.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
    chain(sig, info, ctx);
}

/// Hands a SIGBUS that is not ours to what the program had installed.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: PREVIOUS was written before this handler was installed.
    let prev = unsafe { (*PREVIOUS.0.get()).assume_init_ref() };
    let handler = prev.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // Back to the default action; the faulting access runs again and
        // the kernel delivers it as it would have without us.
        // SAFETY: a zeroed sigaction with SIG_DFL is a valid action.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
        }
        return;
    }
    if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the program installed this function as an SA_SIGINFO
        // handler; it gets what the kernel gave us.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: as above, a plain handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use crate::{OpenMode, Region};

    #[test]
    fn a_truncated_region_reads_as_zeros_instead_of_killing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.cache");
        let r = Region::open(&path, OpenMode::CreateIfMissing).unwrap();
        assert_ne!(
            r.header().magic.load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        let before = super::repaired();
        // Without the handler this read is a SIGBUS.
        let magic = r.header().magic.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(magic, 0);
        assert!(super::repaired() > before);
        r.slot(crate::SlotIndex::new(3).unwrap())
            .pid
            .store(7, std::sync::atomic::Ordering::Relaxed);
    }

    #[test]
    fn a_sigbus_elsewhere_still_kills_as_before() {
        let dir = tempfile::tempdir().unwrap();
        // Our handler is installed (a region is mapped)...
        let _r = Region::open(&dir.path().join("r.cache"), OpenMode::CreateIfMissing).unwrap();
        let other = dir.path().join("other");
        std::fs::File::create(&other)
            .unwrap()
            .write_all(&[1u8; 8192])
            .unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&other)
            .unwrap();
        let map = memmap2::MmapOptions::new().len(8192).map_raw(&f).unwrap();
        f.set_len(0).unwrap();
        // ...but a fault in a mapping that is not a region gets the
        // program's action: here the default, death by SIGBUS.
        // SAFETY: the child only touches memory and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: reading a mapped (now truncated) page; _exit is
            // async-signal-safe.
            unsafe {
                std::ptr::read_volatile(map.as_ptr());
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFSIGNALED(status), "status {status:#x}");
        assert_eq!(libc::WTERMSIG(status), libc::SIGBUS);
    }
}

//! Reentrancy and the `extern "C"` boundary.
//!
//! A thread-local depth marks code of ours that calls out (our NVML client,
//! initialisation): hooks and `dlsym` seen from inside it pass straight
//! through. `ffi_boundary` wraps every hook body: a panic never unwinds
//! into the host program; it is logged once and the call falls back to the
//! real function.
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Guards alive in the whole process: while 0, no thread is internal and
/// the thread-local need not be read (a TLS access in a shared library is
/// a call to `__tls_get_addr`, on every hook).
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// Whether this thread is inside our own code right now.
#[inline]
pub fn is_internal() -> bool {
    ACTIVE.load(Ordering::Acquire) != 0 && this_thread_is_internal()
}

/// Kept out of line: inlined, the compiler computed the thread-local's
/// address (`__tls_get_addr`) before testing `ACTIVE`, on every hook.
#[cold]
#[inline(never)]
fn this_thread_is_internal() -> bool {
    // During thread teardown the TLS may be gone: treat that as internal so
    // nothing of ours runs.
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(true)
}

/// Marks the current thread as running our own code until dropped.
pub struct Guard {
    _not_send: PhantomData<*const ()>,
}

impl Guard {
    pub fn enter() -> Guard {
        ACTIVE.fetch_add(1, Ordering::AcqRel);
        let _ = DEPTH.try_with(|d| d.set(d.get() + 1));
        Guard {
            _not_send: PhantomData,
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
        ACTIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `VGPU_TEST_PANIC=<hook>`: that hook panics, so the tests can show that
/// a panic is caught at the edge (set at start-up, ignored in secure mode).
static TEST_PANIC: OnceLock<Box<str>> = OnceLock::new();

pub fn set_test_panic(hook: &str) {
    let _ = TEST_PANIC.set(hook.into());
    // Launches take the hooks' whole path, which may panic (`duty.rs`).
    crate::duty::set(crate::duty::TEST_PANIC);
}

/// Runs a hook body; on a panic, logs once and runs `fallback` (the real
/// function) instead. Inside our own code, runs `fallback` directly.
pub fn ffi_boundary<R>(
    hook: &'static str,
    body: impl FnOnce() -> R,
    fallback: impl FnOnce() -> R,
) -> R {
    if is_internal() {
        return fallback();
    }
    let body = || {
        if crate::duty::any(crate::duty::TEST_PANIC)
            && TEST_PANIC.get().is_some_and(|h| **h == *hook)
        {
            panic!("VGPU_TEST_PANIC={hook}");
        }
        body()
    };
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(_) => {
            static REPORTED: AtomicBool = AtomicBool::new(false);
            if !REPORTED.swap(true, Ordering::Relaxed) {
                log::error!(
                    "internal error in {hook}; passing this and later failures through to the driver"
                );
            }
            fallback()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_body_falls_back() {
        let r = ffi_boundary("test", || -> i32 { panic!("boom") }, || 7);
        assert_eq!(r, 7);
    }

    #[test]
    fn inside_a_guard_hooks_pass_through() {
        assert!(!is_internal());
        let g = Guard::enter();
        assert!(is_internal());
        assert_eq!(ffi_boundary("test", || 1, || 2), 2);
        drop(g);
        assert_eq!(ffi_boundary("test", || 1, || 2), 1);
    }
}

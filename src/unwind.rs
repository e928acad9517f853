//! The unwinder, loaded only when it can be needed.
//!
//! `std` calls twelve `_Unwind_*` functions of libgcc_s (panics are caught
//! at every `extern "C"` edge, so `panic = "unwind"` stays). Linked
//! normally, that makes libgcc_s.so.1 a `DT_NEEDED` of libvgpu.so: every
//! process that preloads us loads it (about 90 µs per exec, the larger part
//! of what preloading cost, docs/benchmarks.md), and in an image without
//! it *every* process fails to start. (The preloaded file is now the stub
//! and this library, libvgpu_core.so, is loaded by CUDA processes only,
//! but a `DT_NEEDED` libgcc_s would still make that load fail where it is
//! missing.)
//!
//! Instead, the twelve names are defined here, hidden (never exported, so
//! no other object's unwinding comes here), as trampolines that jump
//! through a table filled from libgcc_s.so.1 the first time one runs. The
//! runtime fills it when CUDA is first used ([`load`]), so the loader is
//! never entered from inside a panic in practice. Without libgcc_s, a
//! panic in vgpu aborts the process ("failed to initiate panic"); that is
//! said once, at start-up, as a warning.

#[cfg(all(
    feature = "interpose",
    not(feature = "static-unwinder"),
    not(test),
    target_arch = "x86_64"
))]
mod lazy {
    use std::ffi::{CStr, c_int, c_void};
    use std::ptr;
    use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

    use crate::interpose::real;

    /// `_URC_FATAL_PHASE1_ERROR`: "could not start unwinding".
    const URC_FATAL_PHASE1_ERROR: c_int = 3;
    /// `_URC_END_OF_STACK`.
    const URC_END_OF_STACK: c_int = 5;

    unsafe extern "C" fn fail_raise(_: *mut c_void) -> c_int {
        URC_FATAL_PHASE1_ERROR
    }
    unsafe extern "C" fn fail_backtrace(_: *mut c_void, _: *mut c_void) -> c_int {
        URC_END_OF_STACK
    }
    /// Every other function runs only while an unwind that started is in
    /// progress, which cannot happen without the real unwinder.
    unsafe extern "C" fn fail_abort() -> usize {
        std::process::abort()
    }
    unsafe extern "C" fn fail_delete(_: *mut c_void) {}

    macro_rules! unwinder {
        ($( $slot:ident = $name:literal, $fallback:ident; )*) => {
            $(
                static $slot: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());
                core::arch::global_asm!(
                    concat!(".globl ", $name),
                    concat!(".hidden ", $name),
                    concat!(".type ", $name, ",@function"),
                    concat!($name, ":"),
                    // Arguments are at most three integer registers.
                    "push rdi",
                    "push rsi",
                    "push rdx",
                    "call {resolve}",
                    "pop rdx",
                    "pop rsi",
                    "pop rdi",
                    "jmp qword ptr [rip + {slot}]",
                    concat!(".size ", $name, ", . - ", $name),
                    resolve = sym resolve,
                    slot = sym $slot,
                );
            )*

            fn fill(lib: *mut c_void) {
                $(
                    let name = CStr::from_bytes_with_nul(concat!($name, "\0").as_bytes());
                    let found = match (lib.is_null(), name) {
                        (false, Ok(n)) => real::dlsym(lib, n),
                        _ => ptr::null_mut(),
                    };
                    let f = if found.is_null() { $fallback as *mut c_void } else { found };
                    $slot.store(f, Ordering::Release);
                )*
            }
        };
    }

    unwinder! {
        RAISE = "_Unwind_RaiseException", fail_raise;
        RESUME = "_Unwind_Resume", fail_abort;
        DELETE = "_Unwind_DeleteException", fail_delete;
        BACKTRACE = "_Unwind_Backtrace", fail_backtrace;
        GET_IP = "_Unwind_GetIP", fail_abort;
        GET_IP_INFO = "_Unwind_GetIPInfo", fail_abort;
        GET_LSDA = "_Unwind_GetLanguageSpecificData", fail_abort;
        GET_REGION_START = "_Unwind_GetRegionStart", fail_abort;
        GET_DATA_REL_BASE = "_Unwind_GetDataRelBase", fail_abort;
        GET_TEXT_REL_BASE = "_Unwind_GetTextRelBase", fail_abort;
        SET_GR = "_Unwind_SetGR", fail_abort;
        SET_IP = "_Unwind_SetIP", fail_abort;
    }

    static LOADED: AtomicBool = AtomicBool::new(false);
    static FOUND: AtomicBool = AtomicBool::new(false);

    /// Fills the table once. Never unwinds: it runs inside the trampolines.
    extern "C" fn resolve() {
        if LOADED.load(Ordering::Acquire) {
            return;
        }
        let open = |flags: c_int| {
            // SAFETY: dlopen with a NUL-terminated soname.
            unsafe { libc::dlopen(c"libgcc_s.so.1".as_ptr(), flags) }
        };
        let mut lib = open(libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if lib.is_null() {
            lib = open(libc::RTLD_NOW | libc::RTLD_LOCAL);
        }
        fill(lib);
        FOUND.store(!lib.is_null(), Ordering::Relaxed);
        LOADED.store(true, Ordering::Release);
    }

    pub fn load() -> bool {
        resolve();
        FOUND.load(Ordering::Relaxed)
    }
}

/// Makes the unwinder ready (at runtime start, outside any panic).
/// False when libgcc_s.so.1 is missing: a panic would then abort.
pub fn load() -> bool {
    #[cfg(all(
        feature = "interpose",
        not(feature = "static-unwinder"),
        not(test),
        target_arch = "x86_64"
    ))]
    return lazy::load();
    #[cfg(not(all(
        feature = "interpose",
        not(feature = "static-unwinder"),
        not(test),
        target_arch = "x86_64"
    )))]
    return true;
}

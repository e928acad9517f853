//! Our exported `dlsym` and `dlvsym`.
//!
//! Both are small trampolines: they ask [`decide`] whether the name is one
//! we hook. If not, they *jump* (not call) to libc's function, so libc sees
//! the original caller's return address and `RTLD_NEXT` keeps its meaning
//! for everyone else. If it is, the answer is our wrapper, chosen by the
//! real pointer the library would have returned.
//!
//! - explicit handle: look the name up for real; if it is the driver's
//!   function we track, hand back our wrapper, else the real result;
//! - `RTLD_NEXT`: our wrapper (otherwise `dlsym(RTLD_NEXT, "cuMemAlloc_v2")`
//!   would be a one-line bypass), while the driver library is loaded at
//!   all; NULL in a process without it, as without vgpu;
//! - `RTLD_DEFAULT` (or a handle whose lookup finds our own export): our
//!   export, which is first in the global scope, but only while the
//!   driver's symbol is in the global scope behind it. A process with no
//!   driver gets NULL (and a `dlerror`), as it would without vgpu, and
//!   nothing of vgpu starts.
//!
//! Internal lookups (our NVML client, std) run inside a [`Guard`] and are
//! never handed our hooks.
//!
//! [`Guard`]: crate::guard::Guard

use std::ffi::{CStr, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::{real, table};
use crate::{duty, guard, init};

/// Tells the trampoline to tail-jump to libc (the assembly tests for 1).
#[allow(clippy::manual_dangling_ptr)]
const PASS: *mut c_void = 1 as *mut c_void;

/// Decides for `dlsym`: [`PASS`], or the pointer to return.
///
/// # Safety
/// `symbol` is NULL or a NUL-terminated string (dlsym's contract).
pub(crate) unsafe extern "C" fn decide(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    real::ensure_libc_resolved();
    if symbol.is_null() || guard::is_internal() {
        return PASS;
    }
    // SAFETY: dlsym's contract: `symbol` is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if !(name.starts_with(b"cu") || name.starts_with(b"nvml")) {
        return PASS;
    }
    catch_unwind(AssertUnwindSafe(|| decide_hooked(handle, name))).unwrap_or(PASS)
}

/// Decides for `dlvsym`: for an explicit handle, what glibc finds for that
/// version (our wrapper if it is the driver function we track), so a
/// version that does not exist still finds nothing; for `RTLD_NEXT`, our
/// wrapper.
///
/// # Safety
/// `symbol` and `version` are each NULL or a NUL-terminated string
/// (dlvsym's contract).
pub(crate) unsafe extern "C" fn decide_versioned(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    if handle == libc::RTLD_NEXT || handle == libc::RTLD_DEFAULT || version.is_null() {
        // SAFETY: our caller's contract is decide's.
        return unsafe { decide(handle, symbol) };
    }
    real::ensure_libc_resolved();
    if symbol.is_null() || guard::is_internal() {
        return PASS;
    }
    // SAFETY: dlvsym's contract: `symbol` and (checked above, not NULL)
    // `version` are NUL-terminated strings.
    let (name, version) = unsafe { (CStr::from_ptr(symbol), CStr::from_ptr(version)) };
    let Some(hook) = table::by_name(name.to_bytes()) else {
        return PASS;
    };
    catch_unwind(AssertUnwindSafe(|| {
        let found = real::dlvsym(handle, name, version);
        match hook.real.get() {
            Some(ours) if !found.is_null() && ours.as_ptr() == found => hook.exported(),
            _ => found,
        }
    }))
    .unwrap_or(PASS)
}

/// Whether the driver's definition of `hook` is in the global scope after
/// this library. When it is not, a failed lookup has set `dlerror`.
fn driver_behind_us(hook: &table::Hook) -> bool {
    // Asked from libvgpu.so's frame, RTLD_NEXT means "after libvgpu.so".
    !super::stub::next(hook.real.name()).is_null()
}

fn decide_hooked(handle: *mut c_void, name: &[u8]) -> *mut c_void {
    let Some(hook) = table::by_name(name) else {
        return unhooked(handle, name);
    };
    let ours = hook.exported();
    if handle == libc::RTLD_DEFAULT {
        return if driver_behind_us(hook) {
            PASS
        } else {
            std::ptr::null_mut()
        };
    }
    if handle == libc::RTLD_NEXT {
        if !real::loaded(hook.real.lib()) {
            // Fails the lookup glibc's way, dlerror included.
            return super::stub::next(hook.real.name());
        }
        return if init::control_disabled() { PASS } else { ours };
    }
    let found = real::dlsym(handle, hook.real.name());
    if found.is_null() {
        return found;
    }
    if found == ours || found == hook.wrapper as *mut c_void || super::stub::owns(found) {
        // The handle's scope finds our export first (the program itself,
        // or libvgpu.so, whose exports jump to ours): the same rule as
        // RTLD_DEFAULT.
        return if driver_behind_us(hook) {
            ours
        } else {
            std::ptr::null_mut()
        };
    }
    if init::control_disabled() {
        return found;
    }
    match hook.real.get() {
        Some(ours) if ours.as_ptr() == found => hook.exported(),
        _ => {
            crate::warn_once!(
                "dlsym({}) came from a driver library instance vgpu does not track: not interposed",
                String::from_utf8_lossy(name)
            );
            found
        }
    }
}

/// The stub's `dlsym` asks this for cu* and nvml* names: 1 to pass on to
/// glibc, else the answer ([`decide`]).
#[cfg(all(feature = "interpose", not(test)))]
///
/// # Safety
/// `symbol` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vgpu_core_decide(
    handle: *mut c_void,
    symbol: *const c_char,
) -> *mut c_void {
    // SAFETY: the contract passes on unchanged.
    unsafe { decide(handle, symbol) }
}

/// The same for the stub's `dlvsym`.
///
/// # Safety
/// `symbol` and `version` are each NULL or a NUL-terminated string.
#[cfg(all(feature = "interpose", not(test)))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vgpu_core_decide_versioned(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    // SAFETY: the contract passes on unchanged.
    unsafe { decide_versioned(handle, symbol, version) }
}

#[cfg(all(feature = "interpose", not(test), target_arch = "x86_64"))]
mod exports {
    use std::ffi::{c_char, c_void};

    /// `void *dlsym(void *handle, const char *symbol)`
    ///
    /// # Safety
    /// As glibc's: `handle` is a handle `dlopen` gave or a pseudo-handle,
    /// `symbol` a NUL-terminated string.
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _symbol: *const c_char) -> *mut c_void {
        core::arch::naked_asm!(
            "push rdi",
            "push rsi",
            "sub rsp, 8",
            "call {decide}",
            "add rsp, 8",
            "pop rsi",
            "pop rdi",
            "cmp rax, 1",
            "je 2f",
            "ret",
            "2:",
            "jmp qword ptr [rip + {real}]",
            decide = sym super::decide,
            real = sym super::real::REAL_DLSYM,
        )
    }

    /// `void *dlvsym(void *handle, const char *symbol, const char *version)`
    ///
    /// # Safety
    /// As glibc's: `handle` as for `dlsym`, `symbol` and `version`
    /// NUL-terminated strings.
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn dlvsym(
        _handle: *mut c_void,
        _symbol: *const c_char,
        _version: *const c_char,
    ) -> *mut c_void {
        core::arch::naked_asm!(
            "push rdi",
            "push rsi",
            "push rdx",
            "call {decide}",
            "pop rdx",
            "pop rsi",
            "pop rdi",
            "cmp rax, 1",
            "je 2f",
            "ret",
            "2:",
            "jmp qword ptr [rip + {real}]",
            decide = sym super::decide_versioned,
            real = sym super::real::REAL_DLVSYM,
        )
    }
}

/// Elsewhere the hook calls libc's function from our own frame: names we
/// don't hook then resolve `RTLD_NEXT` relative to this library.
#[cfg(all(feature = "interpose", not(test), not(target_arch = "x86_64")))]
mod exports {
    use std::ffi::{c_char, c_void};
    use std::sync::atomic::Ordering;

    /// `void *dlsym(void *handle, const char *symbol)`
    ///
    /// # Safety
    /// As glibc's: `handle` is a handle `dlopen` gave or a pseudo-handle,
    /// `symbol` a NUL-terminated string.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
        // SAFETY: dlsym's contract is decide's.
        let r = unsafe { super::decide(handle, symbol) };
        if r != super::PASS {
            return r;
        }
        let f = super::real::REAL_DLSYM.load(Ordering::Acquire);
        // SAFETY: decide() resolved REAL_DLSYM to libc's dlsym (or a stub).
        let f: super::real::DlsymFn = unsafe { std::mem::transmute(f) };
        // SAFETY: arguments pass through unchanged.
        unsafe { f(handle, symbol) }
    }

    /// `void *dlvsym(void *handle, const char *symbol, const char *version)`
    ///
    /// # Safety
    /// As glibc's: `handle` as for `dlsym`, `symbol` and `version`
    /// NUL-terminated strings.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn dlvsym(
        handle: *mut c_void,
        symbol: *const c_char,
        version: *const c_char,
    ) -> *mut c_void {
        // SAFETY: dlvsym's contract is decide_versioned's.
        let r = unsafe { super::decide_versioned(handle, symbol, version) };
        if r != super::PASS {
            return r;
        }
        let f = super::real::REAL_DLVSYM.load(Ordering::Acquire);
        // SAFETY: decide() resolved REAL_DLVSYM to libc's dlvsym (or a stub).
        let f: super::real::DlvsymFn = unsafe { std::mem::transmute(f) };
        // SAFETY: arguments pass through unchanged.
        unsafe { f(handle, symbol, version) }
    }
}

/// A driver function without a hook, looked up in a handle (as XLA's
/// driver stubs do): with oversubscription (its bit in `duty.rs`, set
/// once the trampolines' gate is in), a trampoline that restores a
/// suspended process first (`trampoline.rs`); otherwise the plain answer.
fn unhooked(handle: *mut c_void, name: &[u8]) -> *mut c_void {
    // Driver API functions only (`cu` and a capital: not `cudbg*` data,
    // not cuBLAS or cudart through their own handles, not `curl_*`).
    let driver_api = name.len() > 2 && name[2].is_ascii_uppercase();
    if handle == libc::RTLD_DEFAULT
        || handle == libc::RTLD_NEXT
        || !driver_api
        || !duty::any_acquire(duty::OVERSUB)
        || real::handle(super::real::Lib::Cuda).map(|h| h.as_ptr()) != Some(handle)
    {
        return PASS;
    }
    let Ok(cname) = std::ffi::CString::new(name) else {
        return PASS;
    };
    let found = real::dlsym(handle, &cname);
    super::trampoline::wrap(found).unwrap_or(found)
}

//! The core's side of the preloaded stub (`preload/stub.c`).
//!
//! `libvgpu.so` is a small C stub; this library (`libvgpu_core.so`) is
//! loaded by it, `RTLD_LOCAL`, the first time CUDA or NVML is used. The
//! stub hands us a [`Stub`]: its own path (the directory where a region
//! file may wait, `init.rs`), a `dlsym(RTLD_NEXT, ...)` made from its own
//! frame (from ours, `RTLD_NEXT` would mean "after libvgpu_core.so", which
//! is in no global scope), and a test for its exports (what the global
//! scope finds first for a hooked name). Loaded any other way (a test's
//! `LD_PRELOAD` of the core itself), none of it is set and the core stands
//! for itself, as before the split.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

/// Must equal `VGPU_STUB_ABI` in stub.c.
const ABI: u32 = 1;

/// `struct vgpu_stub` of stub.c.
#[repr(C)]
pub struct Stub {
    abi: u32,
    path: *const c_char,
    next: unsafe extern "C" fn(*const c_char) -> *mut c_void,
    owns: unsafe extern "C" fn(*const c_void) -> c_int,
    export_of: unsafe extern "C" fn(*const c_char) -> *mut c_void,
}

/// What the stub handed us, copied.
struct Attached {
    path: &'static CStr,
    next: unsafe extern "C" fn(*const c_char) -> *mut c_void,
    owns: unsafe extern "C" fn(*const c_void) -> c_int,
    export_of: unsafe extern "C" fn(*const c_char) -> *mut c_void,
}

// SAFETY: three plain function pointers and a path the stub keeps in a
// static for the life of the process.
unsafe impl Send for Attached {}
// SAFETY: as above; nothing is mutated after the copy.
unsafe impl Sync for Attached {}

static STUB: OnceLock<Attached> = OnceLock::new();

/// The stub's path, if the stub loaded us.
pub fn path() -> Option<&'static CStr> {
    STUB.get().map(|s| s.path)
}

/// `dlsym(RTLD_NEXT, name)` as seen from libvgpu.so: the driver's
/// definition behind our exports in the global scope.
pub fn next(name: &CStr) -> *mut c_void {
    match STUB.get() {
        // SAFETY: the stub's `next` takes a NUL-terminated name.
        Some(s) => unsafe { (s.next)(name.as_ptr()) },
        None => super::real::dlsym(libc::RTLD_NEXT, name),
    }
}

/// Whether `p` is one of libvgpu.so's exports (the stub's, which jump to
/// ours).
pub fn owns(p: *const c_void) -> bool {
    // SAFETY: the stub's `owns` only compares addresses.
    STUB.get().is_some_and(|s| unsafe { (s.owns)(p) } != 0)
}

/// libvgpu.so's export of `name`: what `dlsym` and `cuGetProcAddress`
/// hand out for a hook, so a program sees one address per hook whichever
/// way it asks (the address a `-lcuda` program binds to), as when the
/// exports were ours. None when the stub did not load us. (Our own
/// `cuMemAlloc_v2 as *const ()` already reaches the stub's export today:
/// the name is preemptible, so its address comes through the GOT from the
/// global scope; this does not rely on how the core is linked.)
pub fn export_of(name: &CStr) -> Option<*mut c_void> {
    let s = STUB.get()?;
    // SAFETY: the stub's `export_of` takes a NUL-terminated name.
    let p = unsafe { (s.export_of)(name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// Called once by the stub after it loaded us; answers our ABI version,
/// which the stub checks before it uses anything else of ours.
///
/// # Safety
/// `stub` must point to a `struct vgpu_stub` that lives for the process.
#[cfg(all(feature = "interpose", not(test)))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vgpu_core_attach(stub: *const Stub) -> u32 {
    // SAFETY: the caller passes a valid, static struct (or NULL).
    let Some(stub) = (unsafe { stub.as_ref() }) else {
        return ABI;
    };
    if stub.abi != ABI || stub.path.is_null() {
        return ABI;
    }
    let _ = STUB.set(Attached {
        // SAFETY: a NUL-terminated path in a static buffer of the stub.
        path: unsafe { CStr::from_ptr(stub.path) },
        next: stub.next,
        owns: stub.owns,
        export_of: stub.export_of,
    });
    ABI
}

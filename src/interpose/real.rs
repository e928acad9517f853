//! The real functions behind our hooks: libc's `dlsym`/`dlvsym`, the
//! driver libraries, and one lazily resolved slot per hooked symbol.
//!
//! A slot resolves on first use with the real `dlsym` on the driver
//! library's handle (never through our exported `dlsym`). A missing symbol
//! is `None`, never a panic.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

use super::elf;

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// libc's `dlsym`, where our trampoline jumps for every name we don't hook.
/// Read by the assembly in `dlsym.rs`, so it is a plain pointer-sized cell.
pub(super) static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());
pub(super) static REAL_DLVSYM: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());

/// Stand-in when libc's tables cannot be read (never seen with glibc): the
/// lookup fails cleanly instead of jumping to NULL.
unsafe extern "C" fn no_dlsym(_: *mut c_void, _: *const c_char) -> *mut c_void {
    ptr::null_mut()
}

unsafe extern "C" fn no_dlvsym(_: *mut c_void, _: *const c_char, _: *const c_char) -> *mut c_void {
    ptr::null_mut()
}

fn resolve_libc(cell: &AtomicPtr<c_void>, name: &CStr, fallback: *mut c_void) -> *mut c_void {
    let p = cell.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    let found = elf::libc_symbol(name).unwrap_or(fallback);
    cell.store(found, Ordering::Release);
    found
}

/// Makes sure both trampolines have somewhere to jump.
pub fn ensure_libc_resolved() {
    resolve_libc(&REAL_DLSYM, c"dlsym", no_dlsym as *mut c_void);
    resolve_libc(&REAL_DLVSYM, c"dlvsym", no_dlvsym as *mut c_void);
}

pub fn dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    let p = resolve_libc(&REAL_DLSYM, c"dlsym", no_dlsym as *mut c_void);
    // SAFETY: `p` is libc's dlsym (or no_dlsym), which has this signature.
    let f: DlsymFn = unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) };
    // SAFETY: dlsym accepts any handle value and a NUL-terminated name.
    unsafe { f(handle, name.as_ptr()) }
}

pub fn dlvsym(handle: *mut c_void, name: &CStr, version: &CStr) -> *mut c_void {
    let p = resolve_libc(&REAL_DLVSYM, c"dlvsym", no_dlvsym as *mut c_void);
    // SAFETY: `p` is libc's dlvsym (or no_dlvsym), which has this signature.
    let f: DlvsymFn = unsafe { std::mem::transmute::<*mut c_void, DlvsymFn>(p) };
    // SAFETY: dlvsym accepts any handle value and NUL-terminated strings.
    unsafe { f(handle, name.as_ptr(), version.as_ptr()) }
}

/// The code a hook returns when its driver library cannot be loaded at
/// all: what NVIDIA's stub libraries answer where no driver is installed.
pub trait NoLibrary {
    const NO_LIBRARY: Self;
}

/// The driver libraries we call into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lib {
    Cuda = 0,
    Nvml = 1,
}

impl Lib {
    /// Containers usually get only the versioned file names.
    fn soname(self) -> &'static CStr {
        match self {
            Lib::Cuda => c"libcuda.so.1",
            Lib::Nvml => c"libnvidia-ml.so.1",
        }
    }
}

static HANDLES: [AtomicPtr<c_void>; 2] = [const { AtomicPtr::new(ptr::null_mut()) }; 2];

/// Whether `lib` is loaded in this process already (never loads it).
pub fn loaded(lib: Lib) -> bool {
    if !HANDLES[lib as usize].load(Ordering::Acquire).is_null() {
        return true;
    }
    // SAFETY: dlopen with a NUL-terminated soname; RTLD_NOLOAD only looks.
    let h = unsafe { libc::dlopen(lib.soname().as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return false;
    }
    // Keep the reference as `handle` would, unless another thread did.
    if HANDLES[lib as usize]
        .compare_exchange(ptr::null_mut(), h, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // SAFETY: `h` came from dlopen above.
        unsafe { libc::dlclose(h) };
    }
    true
}

/// Our handle on `lib`: the instance already loaded if there is one (found
/// by soname, whatever path the program used), else a fresh load.
pub fn handle(lib: Lib) -> Option<NonNull<c_void>> {
    let cell = &HANDLES[lib as usize];
    if let Some(h) = NonNull::new(cell.load(Ordering::Acquire)) {
        return Some(h);
    }
    let open = |flags: c_int| {
        // SAFETY: dlopen with a NUL-terminated soname; we are not inside
        // a loader callback (hooks run from program code).
        unsafe { libc::dlopen(lib.soname().as_ptr(), flags) }
    };
    let mut h = open(libc::RTLD_LAZY | libc::RTLD_NOLOAD);
    if h.is_null() {
        h = open(libc::RTLD_LAZY | libc::RTLD_LOCAL);
    }
    let h = NonNull::new(h)?;
    match cell.compare_exchange(
        ptr::null_mut(),
        h.as_ptr(),
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => Some(h),
        Err(winner) => {
            // Another thread got there first; drop our extra reference.
            // SAFETY: `h` came from dlopen above.
            unsafe { libc::dlclose(h.as_ptr()) };
            NonNull::new(winner)
        }
    }
}

const UNRESOLVED: u8 = 0;
const RESOLVED: u8 = 1;

/// One real symbol, resolved on first use.
pub struct Real {
    name: &'static CStr,
    lib: Lib,
    ptr: AtomicPtr<c_void>,
    state: AtomicU8,
}

impl Real {
    pub const fn new(name: &'static CStr, lib: Lib) -> Real {
        Real {
            name,
            lib,
            ptr: AtomicPtr::new(ptr::null_mut()),
            state: AtomicU8::new(UNRESOLVED),
        }
    }

    pub fn name(&self) -> &'static CStr {
        self.name
    }

    pub fn lib(&self) -> Lib {
        self.lib
    }

    /// The real function, or None if the driver lacks it (or is absent).
    #[inline]
    pub fn get(&self) -> Option<NonNull<c_void>> {
        if self.state.load(Ordering::Acquire) == RESOLVED {
            return NonNull::new(self.ptr.load(Ordering::Relaxed));
        }
        self.resolve()
    }

    /// The first use: looks the symbol up in its library.
    #[cold]
    #[inline(never)]
    fn resolve(&self) -> Option<NonNull<c_void>> {
        let h = handle(self.lib)?;
        let p = dlsym(h.as_ptr(), self.name);
        self.ptr.store(p, Ordering::Relaxed);
        self.state.store(RESOLVED, Ordering::Release);
        NonNull::new(p)
    }

    /// The real function as its typed pointer, if it was resolved already
    /// and exists: one relaxed load (None: ask [`Real::typed`]). The
    /// pointer is written once, before the state that publishes it, and
    /// is the driver's code, which nothing else need be seen with.
    ///
    /// # Safety
    /// `F` must be the C signature of the symbol this slot names.
    #[inline(always)]
    pub unsafe fn resolved<F: Copy>(&self) -> Option<F> {
        const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
        let p = self.ptr.load(Ordering::Relaxed);
        if p.is_null() {
            return None;
        }
        // SAFETY: as in `typed`: the caller guarantees F, sizes match.
        Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }

    /// The real function as its typed pointer.
    ///
    /// # Safety
    /// `F` must be the C signature of the symbol this slot names.
    pub unsafe fn typed<F: Copy>(&self) -> Option<F> {
        const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
        let p = self.get()?;
        // SAFETY: the caller guarantees F is this symbol's fn-pointer type,
        // and the sizes match (checked above).
        Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p.as_ptr()) })
    }
}

//! The only place the simulator touches caller memory. Every C entry point
//! goes through these helpers, so each raw access has one SAFETY argument.

use std::ffi::{CStr, c_char};

pub type CUresult = i32;
pub const SUCCESS: CUresult = 0;
pub const INVALID_VALUE: CUresult = 1;
pub const OUT_OF_MEMORY: CUresult = 2;
pub const NOT_INITIALIZED: CUresult = 3;
pub const INVALID_DEVICE: CUresult = 101;
pub const INVALID_CONTEXT: CUresult = 201;
pub const INVALID_HANDLE: CUresult = 400;
pub const NOT_READY: CUresult = 600;
pub const NOT_SUPPORTED: CUresult = 801;

/// Writes `v` through the out-parameter `p`; false when `p` is NULL.
pub fn put<T>(p: *mut T, v: T) -> bool {
    if p.is_null() {
        return false;
    }
    // SAFETY: `p` is an out-parameter of a C API call; the API contract is
    // that a non-NULL out-parameter points to writable memory for one T.
    unsafe { p.write_unaligned(v) };
    true
}

/// Reads an in-parameter; None when `p` is NULL.
pub fn get<T: Copy>(p: *const T) -> Option<T> {
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is an in-parameter of a C API call; the API contract is
    // that a non-NULL in-parameter points to one readable T.
    Some(unsafe { p.read_unaligned() })
}

/// Reads element `i` of a C array; None when `p` is NULL.
pub fn get_at<T: Copy>(p: *const T, i: usize) -> Option<T> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes an array it declared to hold more than `i`
    // elements (the C API's count argument bounds `i`).
    Some(unsafe { p.add(i).read_unaligned() })
}

/// Writes element `i` of a caller's array.
pub fn put_at<T>(p: *mut T, i: usize, v: T) -> bool {
    if p.is_null() {
        return false;
    }
    // SAFETY: as get_at: the caller's count argument bounds `i`.
    unsafe { p.add(i).write_unaligned(v) };
    true
}

/// A NUL-terminated C string argument.
pub fn c_str(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the API takes a NUL-terminated string; it is read only here.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Copies `s` into a caller's buffer of `len` bytes, NUL-terminated.
pub fn put_str(buf: *mut c_char, len: usize, s: &str) -> bool {
    if buf.is_null() || len == 0 {
        return false;
    }
    let n = s.len().min(len - 1);
    for (i, b) in s.bytes().take(n).enumerate() {
        put_at(buf, i, b as c_char);
    }
    put_at(buf, n, 0)
}

/// Writes `len` zero bytes at `p` (a host buffer the caller owns).
pub fn zero(p: *mut u8, len: usize) {
    if !p.is_null() {
        // SAFETY: `p` is a host buffer of at least `len` bytes by the API
        // contract of the copy that targets it.
        unsafe { std::ptr::write_bytes(p, 0, len) };
    }
}

/// Reads the u64 a kernel parameter array entry points to.
pub fn kernel_arg_u64(params: *mut *mut std::ffi::c_void, i: usize) -> Option<u64> {
    let p = get_at(params as *const *const u64, i)?;
    get(p)
}

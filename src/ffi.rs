//! Reading and writing caller memory at the C edge. Every out-parameter of
//! every hook goes through these two functions; NULL is allowed wherever
//! the driver allows it, and never dereferenced.

/// Writes `v` through out-parameter `p`; false when `p` is NULL.
pub fn put<T>(p: *mut T, v: T) -> bool {
    if p.is_null() {
        return false;
    }
    // SAFETY: `p` is an out-parameter of a driver call the program made;
    // the API contract is that a non-NULL out-parameter is writable for T.
    unsafe { p.write_unaligned(v) };
    true
}

/// Runs `f` when the process exits normally (`exit`, or a return from
/// `main`); false when it cannot be registered.
pub fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: `f` is a plain function that takes nothing and never unwinds
    // (its callers wrap their bodies in catch_unwind).
    unsafe { libc::atexit(f) == 0 }
}

/// Reads in-parameter `p`; None when NULL.
pub fn get<T: Copy>(p: *const T) -> Option<T> {
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is an in-parameter of a driver call the program made; the
    // API contract is that a non-NULL in-parameter points to a readable T.
    Some(unsafe { p.read_unaligned() })
}

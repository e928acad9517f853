//! `cuGetProcAddress` and `cuGetProcAddress_v2`, the way cudart (and so
//! PyTorch) reaches every driver entry point: call the real one, then swap
//! the pointer it returned for our wrapper of exactly that symbol. The
//! driver chooses the ABI version and the `_ptsz`/`_ptds` variant; we never
//! hand back another version than it would.
#![forbid(unsafe_code)]

use std::ffi::{c_char, c_int, c_void};

use super::sys::*;
use crate::ffi::Out;
use crate::interpose::real::Lib;
use crate::interpose::{table, trampoline};

/// Replaces the driver's pointer in `*pfn` by our wrapper, if we hook it;
/// with oversubscription, any other by a trampoline that restores a
/// suspended process before the call (the driver would block it).
fn substitute(pfn: Out<*mut c_void>, rc: CUresult) -> CUresult {
    if rc.is_ok()
        && !crate::init::control_disabled()
        && let Some(found) = pfn.get()
        && let Some(wrapper) = table::wrapper_for(Lib::Cuda, found).or_else(|| {
            crate::oversub::active()
                .then(|| trampoline::wrap(found))
                .flatten()
        })
    {
        pfn.put(wrapper);
    }
    rc
}

pub fn get_proc_address(
    call: &impl Fn() -> CUresult,
    _symbol: *const c_char,
    pfn: Out<*mut c_void>,
    _version: c_int,
    _flags: u64,
) -> CUresult {
    substitute(pfn, call())
}

pub fn get_proc_address_v2(
    call: &impl Fn() -> CUresult,
    _symbol: *const c_char,
    pfn: Out<*mut c_void>,
    _version: c_int,
    _flags: u64,
    _status: *mut c_int,
) -> CUresult {
    substitute(pfn, call())
}

//! Calls that only wake a suspended process: synchronisation, copies,
//! memsets and the current context. Their hooks restore the process first
//! (`oversub::enter`, in every CUDA hook), so that a process whose next
//! call after an idle spell is one of these is not left blocked inside a
//! locked driver; the handlers then pass the call through, counted as in
//! flight (a process waiting in a synchronisation is not idle). A
//! synchronisation that returns also tells the turns' probes that the
//! thread waited for the GPU, which ran its work until then
//! (`synced::synchronise`).
#![forbid(unsafe_code)]

use std::ffi::{c_uchar, c_uint, c_void};

use super::real;
use super::sys::*;
use crate::ffi::Out;
use crate::limiter::synced::{self, Waits};
use crate::oversub::in_call;

/// [`synced::synchronise`], then the limiter's word on its return
/// (`limiter::sync_returned`: the wait counted for the pacing beside other
/// containers, and a paced step's wait for the bucket).
fn synchronise(waits: Waits, call: impl FnOnce() -> CUresult) -> CUresult {
    synced::synchronise(waits, call, |waited| {
        if let Some(attach) = crate::init::attach() {
            crate::limiter::sync_returned(attach, waited);
        }
    })
}

pub fn ctx_synchronize() -> CUresult {
    synchronise(Waits::All(None), || in_call(real::cuCtxSynchronize))
}

/// CUDA 13's (what its runtime's `cudaDeviceSynchronize` calls).
pub fn ctx_synchronize_v2(ctx: CUcontext) -> CUresult {
    synchronise(Waits::All(Some(ctx)), || {
        in_call(|| real::cuCtxSynchronize_v2(ctx))
    })
}

pub fn ctx_get_current(ctx: Out<CUcontext>) -> CUresult {
    in_call(|| real::cuCtxGetCurrent(ctx))
}

pub fn ctx_set_current(ctx: CUcontext) -> CUresult {
    in_call(|| real::cuCtxSetCurrent(ctx))
}

pub fn stream_synchronize(stream: CUstream) -> CUresult {
    synchronise(Waits::Stream(stream), || {
        in_call(|| real::cuStreamSynchronize(stream))
    })
}

pub fn stream_synchronize_ptsz(stream: CUstream) -> CUresult {
    // (The null stream here is the per-thread default stream, as the
    // probes know a `_ptsz` launch's.)
    let waits = if stream.is_null() {
        STREAM_PER_THREAD
    } else {
        stream
    };
    synchronise(Waits::Stream(waits), || {
        in_call(|| real::cuStreamSynchronize_ptsz(stream))
    })
}

pub fn event_synchronize(event: CUevent) -> CUresult {
    synchronise(Waits::Event, || in_call(|| real::cuEventSynchronize(event)))
}

pub fn memcpy(
    call: &impl Fn() -> CUresult,
    _dst: CUdeviceptr,
    _src: CUdeviceptr,
    _n: usize,
) -> CUresult {
    in_call(call)
}

pub fn memcpy_async(
    call: &impl Fn() -> CUresult,
    _dst: CUdeviceptr,
    _src: CUdeviceptr,
    _n: usize,
    _stream: CUstream,
) -> CUresult {
    in_call(call)
}

pub fn memcpy_async_ptsz(
    call: &impl Fn() -> CUresult,
    _dst: CUdeviceptr,
    _src: CUdeviceptr,
    _n: usize,
    _stream: CUstream,
) -> CUresult {
    in_call(call)
}

pub fn memcpy_htod(
    call: &impl Fn() -> CUresult,
    _dst: CUdeviceptr,
    _src: *const c_void,
    _n: usize,
) -> CUresult {
    in_call(call)
}

pub fn memcpy_dtoh(
    call: &impl Fn() -> CUresult,
    _dst: *mut c_void,
    _src: CUdeviceptr,
    _n: usize,
) -> CUresult {
    in_call(call)
}

pub fn memcpy_dtod(
    call: &impl Fn() -> CUresult,
    _dst: CUdeviceptr,
    _src: CUdeviceptr,
    _n: usize,
) -> CUresult {
    in_call(call)
}

pub fn memcpy_htod_async(
    call: &impl Fn() -> CUresult,
    _dst: CUdeviceptr,
    _src: *const c_void,
    _n: usize,
    _stream: CUstream,
) -> CUresult {
    in_call(call)
}

pub fn memcpy_dtoh_async(
    call: &impl Fn() -> CUresult,
    _dst: *mut c_void,
    _src: CUdeviceptr,
    _n: usize,
    _stream: CUstream,
) -> CUresult {
    in_call(call)
}

pub fn memset_d8(
    call: &impl Fn() -> CUresult,
    _dst: CUdeviceptr,
    _v: c_uchar,
    _n: usize,
) -> CUresult {
    in_call(call)
}

pub fn memset_d32(
    call: &impl Fn() -> CUresult,
    _dst: CUdeviceptr,
    _v: c_uint,
    _n: usize,
) -> CUresult {
    in_call(call)
}

pub fn memset_d8_async(
    call: &impl Fn() -> CUresult,
    _dst: CUdeviceptr,
    _v: c_uchar,
    _n: usize,
    _stream: CUstream,
) -> CUresult {
    in_call(call)
}

pub fn memset_d32_async(
    call: &impl Fn() -> CUresult,
    _dst: CUdeviceptr,
    _v: c_uint,
    _n: usize,
    _stream: CUstream,
) -> CUresult {
    in_call(call)
}

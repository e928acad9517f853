//! The simulated CUDA driver API: streams and events.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::c_uint;

use crate::cuda::*;
use crate::ffi::*;
use crate::local::*;
use crate::state::{now_ns, sleep_until};

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(ps: *mut Handle, _flags: c_uint) -> CUresult {
    let mut l = local();
    let (ctx, _) = tri!(current(&l));
    let id = l.new_id();
    l.streams.insert(
        id,
        Stream {
            ctx,
            last_end: 0,
            capture: None,
        },
    );
    if put(ps, h(id)) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy_v2(s: Handle) -> CUresult {
    if local().streams.remove(&(s as usize)).is_some() {
        SUCCESS
    } else {
        INVALID_HANDLE
    }
}

fn stream_end(s: Handle) -> Result<u64, CUresult> {
    let l = local();
    let (ctx, _) = current(&l)?;
    let s = l.resolve_stream(s as usize, ctx);
    l.streams
        .get(&s)
        .map(|st| st.last_end)
        .ok_or(INVALID_HANDLE)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize(s: Handle) -> CUresult {
    sleep_until(tri!(stream_end(s)));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(s: Handle) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuStreamSynchronize(s) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamQuery(s: Handle) -> CUresult {
    if tri!(stream_end(s)) <= now_ns() {
        SUCCESS
    } else {
        NOT_READY
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamQuery_ptsz(s: Handle) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuStreamQuery(s) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx(s: Handle, pctx: *mut Handle) -> CUresult {
    let l = local();
    let (ctx, _) = tri!(current(&l));
    let sid = l.resolve_stream(s as usize, ctx);
    let Some(st) = l.streams.get(&sid) else {
        return INVALID_HANDLE;
    };
    if put(pctx, h(st.ctx)) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(pe: *mut Handle, _flags: c_uint) -> CUresult {
    let mut l = local();
    tri!(current(&l));
    let id = l.new_id();
    l.events.insert(id, Default::default());
    if put(pe, h(id)) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventDestroy_v2(e: Handle) -> CUresult {
    if local().events.remove(&(e as usize)).is_some() {
        SUCCESS
    } else {
        INVALID_HANDLE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord(e: Handle, s: Handle) -> CUresult {
    let mut l = local();
    let (ctx, _) = tri!(current(&l));
    let sid = l.resolve_stream(s as usize, ctx);
    let Some(st) = l.streams.get(&sid) else {
        return INVALID_HANDLE;
    };
    if st.capture.is_some() {
        return SUCCESS;
    }
    let ts = st.last_end.max(now_ns());
    match l.events.get_mut(&(e as usize)) {
        Some(ev) => {
            ev.ts = Some(ts);
            SUCCESS
        }
        None => INVALID_HANDLE,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord_ptsz(e: Handle, s: Handle) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuEventRecord(e, s) }
}

fn event_ts(e: Handle) -> Result<Option<u64>, CUresult> {
    local()
        .events
        .get(&(e as usize))
        .map(|ev| ev.ts)
        .ok_or(INVALID_HANDLE)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventQuery(e: Handle) -> CUresult {
    match tri!(event_ts(e)) {
        Some(ts) if ts > now_ns() => NOT_READY,
        _ => SUCCESS,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventSynchronize(e: Handle) -> CUresult {
    if let Some(ts) = tri!(event_ts(e)) {
        sleep_until(ts);
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, a: Handle, b: Handle) -> CUresult {
    let (Some(ta), Some(tb)) = (tri!(event_ts(a)), tri!(event_ts(b))) else {
        return INVALID_HANDLE;
    };
    if tb > now_ns() {
        return NOT_READY;
    }
    if put(ms, (tb as f64 - ta as f64) as f32 / 1e6) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(ms: *mut f32, a: Handle, b: Handle) -> CUresult {
    // SAFETY: same contract as the v1 entry point.
    unsafe { cuEventElapsedTime(ms, a, b) }
}

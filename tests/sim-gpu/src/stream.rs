//! The simulated CUDA driver API: streams and events.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::c_uint;

use crate::cuda::*;
use crate::ffi::*;
use crate::local::*;
use crate::queue;
use crate::sched::MARKER;
use crate::state;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(ps: *mut Handle, _flags: c_uint) -> CUresult {
    let mut l = local();
    let (ctx, _) = tri!(current(&l));
    let id = l.new_id();
    l.streams.insert(
        id,
        Stream {
            ctx,
            last_seq: 0,
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

/// Where the last item of stream `s` is: (device, sequence number).
fn stream_last(s: Handle) -> Result<Option<(usize, u64)>, CUresult> {
    let l = local();
    let (ctx, _) = current(&l)?;
    let st = l
        .streams
        .get(&l.resolve_stream(s as usize, ctx))
        .ok_or(INVALID_HANDLE)?;
    let dev = l.ctxs.get(&st.ctx).ok_or(INVALID_HANDLE)?.dev;
    Ok((st.last_seq != 0).then_some((dev, st.last_seq)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize(s: Handle) -> CUresult {
    if let Some((dev, seq)) = tri!(stream_last(s)) {
        queue::wait(dev, seq);
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(s: Handle) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuStreamSynchronize(s) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamQuery(s: Handle) -> CUresult {
    match tri!(stream_last(s)) {
        Some((dev, seq)) if !queue::done(dev, seq) => NOT_READY,
        _ => SUCCESS,
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

/// Not CUDA: how many events this process holds, for tests that look for
/// a leak (`cuclient threads`).
#[unsafe(no_mangle)]
pub extern "C" fn simLiveEvents() -> u64 {
    local().events.len() as u64
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
    let Some(dev) = l.ctxs.get(&st.ctx).map(|c| c.dev) else {
        return INVALID_HANDLE;
    };
    if !l.events.contains_key(&(e as usize)) {
        return INVALID_HANDLE;
    }
    // The device takes the time when it reaches this point of the stream.
    let (seq, old) = queue::push(dev, MARKER);
    l.harvest(dev, old);
    if let Some(st) = l.streams.get_mut(&sid) {
        st.last_seq = seq;
    }
    if let Some(ev) = l.events.get_mut(&(e as usize)) {
        ev.mark = Some((dev, seq));
        ev.ts = None;
    }
    l.marks.insert((dev, seq), e as usize);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord_ptsz(e: Handle, s: Handle) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuEventRecord(e, s) }
}

/// Where an event stands.
enum Mark {
    Never,
    /// Its marker is queued: (device, sequence number).
    Pending(usize, u64),
    At(u64),
    /// Done, but its time was not kept (an event of the parent, in a
    /// forked child).
    Lost,
}

fn event_mark(e: Handle) -> Result<Mark, CUresult> {
    let mut l = local();
    let ev = *l.events.get(&(e as usize)).ok_or(INVALID_HANDLE)?;
    let (dev, seq) = match (ev.ts, ev.mark) {
        (Some(ts), _) => return Ok(Mark::At(ts)),
        (None, None) => return Ok(Mark::Never),
        (None, Some(m)) => m,
    };
    if !state::me().queue[dev].done(seq) {
        return Ok(Mark::Pending(dev, seq));
    }
    let Some(ts) = queue::marker_ts(dev, seq) else {
        return Ok(Mark::Lost);
    };
    l.marks.remove(&(dev, seq));
    if let Some(ev) = l.events.get_mut(&(e as usize)) {
        ev.ts = Some(ts);
    }
    Ok(Mark::At(ts))
}

/// An event's state after bringing the schedule up to now (`wait`: after
/// its marker is reached).
fn event_now(e: Handle, wait: bool) -> Result<Mark, CUresult> {
    match event_mark(e)? {
        Mark::Pending(dev, seq) => {
            if wait {
                queue::wait(dev, seq);
            } else {
                queue::done(dev, seq);
            }
            event_mark(e)
        }
        m => Ok(m),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventQuery(e: Handle) -> CUresult {
    match tri!(event_now(e, false)) {
        Mark::Pending(..) => NOT_READY,
        _ => SUCCESS,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventSynchronize(e: Handle) -> CUresult {
    tri!(event_now(e, true));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, a: Handle, b: Handle) -> CUresult {
    let (ta, tb) = match (tri!(event_now(a, false)), tri!(event_now(b, false))) {
        (Mark::At(ta), Mark::At(tb)) => (ta, tb),
        (Mark::Pending(..), _) | (_, Mark::Pending(..)) => return NOT_READY,
        _ => return INVALID_HANDLE,
    };
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

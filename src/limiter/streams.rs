//! Which stream a probe timed (`turns::StreamKey`), as the driver tells
//! streams apart: its context, its handle (the legacy default stream,
//! NULL or `CU_STREAM_LEGACY`, as one) and, for the per-thread default
//! stream, the thread that launched on it.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use super::turns::StreamKey;
use crate::cuda::sys::*;

/// Numbers the threads that open probes, for [`StreamKey::thread`].
static NEXT_THREAD: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    static THREAD: usize = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// Which stream `stream` of `ctx` is, for the window's judging.
pub(super) fn stream_key(ctx: usize, stream: CUstream) -> StreamKey {
    let handle = stream as usize;
    // CU_STREAM_LEGACY (1) is NULL's stream.
    let handle = if handle == 1 { 0 } else { handle };
    let thread = if stream == STREAM_PER_THREAD {
        THREAD.try_with(|t| *t).unwrap_or(0)
    } else {
        0
    };
    StreamKey {
        ctx,
        handle,
        thread,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_told_apart_as_the_driver_tells_them() {
        let (ctx, other) = (0x1000, 0x2000);
        let null = std::ptr::null_mut();
        // NULL and CU_STREAM_LEGACY are one stream, but one per context.
        assert_eq!(stream_key(ctx, null), stream_key(ctx, 1 as CUstream));
        assert_ne!(stream_key(ctx, null), stream_key(other, null));
        // Each thread's per-thread default stream is its own.
        let here = stream_key(ctx, STREAM_PER_THREAD);
        assert_eq!(here, stream_key(ctx, STREAM_PER_THREAD));
        let there = std::thread::spawn(move || stream_key(ctx, STREAM_PER_THREAD))
            .join()
            .unwrap();
        assert_ne!(here, there);
        // A created stream is one, whichever thread launches on it.
        let made = 0x7f00_0000usize;
        let made_there = std::thread::spawn(move || stream_key(ctx, made as CUstream))
            .join()
            .unwrap();
        assert_eq!(stream_key(ctx, made as CUstream), made_there);
    }
}

//! One limited launch, from the hook's description to the driver call:
//! the bucket's admission (`mod.rs`), its timing sample (`events.rs`)
//! and the probe of the turns that takes it in (`probes.rs`). The hooks
//! in `cuda/launch.rs` describe the launch and call [`run`].
#![forbid(unsafe_code)]

use std::ffi::c_int;

use vgpu_shm::EntryIndex;

use super::{events, probes};
use crate::attach::Attach;
use crate::cuda::real;
use crate::cuda::sys::*;
use crate::ffi::Out;

/// What a launch is, for the bucket and for timing.
#[derive(Clone, Copy)]
pub struct Launch {
    /// Its shape: the kernel and its grid, or the executable graph
    /// (`estimate::kernel_key`, `estimate::graph_key`).
    pub key: u64,
    /// The stream as the event API names it (`CU_STREAM_PER_THREAD` for a
    /// `_ptsz` launch on the default stream).
    pub stream: CUstream,
}

/// Runs launch `l` (`go`) under the SM limit of its device, which
/// `device` finds (None: the launch goes unlimited).
pub fn run(
    l: Launch,
    device: impl FnOnce() -> Option<(&'static Attach, EntryIndex)>,
    go: impl FnOnce() -> CUresult,
) -> CUresult {
    let capture = super::capturing();
    if capture && capturing(l.stream) {
        // Recorded into a graph, not run: the graph's launches pay.
        return go();
    }
    let Some((attach, dev)) = device() else {
        return go();
    };
    if !super::enforced(dev) {
        return go();
    }
    let shape = super::shape(l.key);
    if shape.cost_ns() == 0 && !capture {
        // The second launch of a new shape does not run on a guess.
        events::wait_for(shape);
    }
    super::admit(attach, dev, shape);
    let (sample, probe) = if capture {
        (None, None)
    } else {
        // Finished probes are collected before the timing sample begins
        // (`probes::poll_if_due`); the sample asks whether the stream is
        // idle before the probe records its start event there.
        let in_turns = probes::poll_if_due(attach, dev);
        (
            events::begin(shape, l.stream, crate::clock::coarse_ns()),
            in_turns.and_then(|t| probes::before(t, dev, l.stream, super::cost_ns(shape))),
        )
    };
    let rc = go();
    if let Some(s) = sample {
        events::end(s, rc);
    }
    if let Some(p) = probe {
        probes::after(p, rc);
    }
    rc
}

fn capturing(stream: CUstream) -> bool {
    let mut status: c_int = 0;
    real::cuStreamIsCapturing(stream, Out::from(&mut status)).is_ok() && status != 0
}

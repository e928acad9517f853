//! Whether an allocation is granted: the one place that decides.
//!
//! A request is reserved against the device's limit in this process's slot
//! (reserve-then-check over the region's atomics, `vgpu_shm::quota`: no
//! lock, never an overcommit). Near the limit a grant re-measures this
//! process's context overhead first (the driver's page tables grow with
//! every allocation). A refusal is tried once more after making room:
//! dead processes' slots are reclaimed and the overhead re-measured, and
//! while some owner looks gone but cannot be judged yet (a restarted
//! container's predecessor), for up to 4 s until it is. A final refusal
//! is `CUDA_ERROR_OUT_OF_MEMORY`, with one log line a second.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vgpu_shm::{EntryIndex, Kind, Owners, ProcView, Reservation, SlotIndex, format_uuid};

use super::overhead;
use crate::attach::Attach;
use crate::cuda::sys::CUresult;
use crate::log::fmt_bytes;

/// Within this fraction of the limit, a grant re-measures the overhead.
const NEAR_LIMIT_DIV: u64 = 32;

/// Reserves `bytes` of `kind` on device `dev` in slot `slot`; Err is the
/// code the driver call returns instead (the bytes are not counted then),
/// counted in the device entry's `oom_denials` for monitors.
pub fn reserve(
    attach: &Attach,
    slot: SlotIndex,
    dev: EntryIndex,
    kind: Kind,
    bytes: u64,
) -> Result<(), CUresult> {
    let granted = try_reserve(attach, slot, dev, kind, bytes);
    if granted.is_err() {
        count_denial(attach, dev);
    }
    granted
}

/// Counts a request on device `dev` refused with `CUDA_ERROR_OUT_OF_MEMORY`.
pub fn count_denial(attach: &Attach, dev: EntryIndex) {
    attach.region.device(dev).count_oom_denial();
}

/// [`reserve`] without counting a refusal: for a caller that tries again.
pub fn try_reserve(
    attach: &Attach,
    slot: SlotIndex,
    dev: EntryIndex,
    kind: Kind,
    bytes: u64,
) -> Result<(), CUresult> {
    let region = &attach.region;
    // The region file is checked right before the accesses, and again
    // after each slow step (NVML, the lock): tamper.rs.
    let intact = || {
        attach
            .intact()
            .then_some(())
            .ok_or(CUresult::ERROR_OUT_OF_MEMORY)
    };
    intact()?;
    if region.reserve(slot, dev, kind, bytes) == Reservation::Granted {
        if !near_limit(attach, dev) || !overhead::reconcile_now(attach, slot, dev) {
            return intact();
        }
        intact()?;
        // Close to the limit, the overhead was just re-measured: still within?
        if region.device_usage(dev, Owners::All) <= region.device(dev).mem_limit() {
            return Ok(());
        }
        region.unreserve(slot, dev, kind, bytes);
    }
    attach.reclaim_dead();
    overhead::reconcile_now(attach, slot, dev);
    intact()?;
    let start = Instant::now();
    let deadline = start + FADING_WAIT;
    loop {
        match region.reserve(slot, dev, kind, bytes) {
            Reservation::Granted => return Ok(()),
            Reservation::Denied { limit, used, asked } => {
                // A predecessor that just exited or died still holds the
                // quota until it can be judged: wait for the verdict.
                let waited = start.elapsed().as_millis() as u64;
                if Instant::now() < deadline && region.owners_fading(&ProcView::current(), waited) {
                    std::thread::sleep(FADING_POLL);
                    attach.reclaim_dead();
                    intact()?;
                    continue;
                }
                report_denial(attach, dev, limit, used, asked);
                return Err(CUresult::ERROR_OUT_OF_MEMORY);
            }
        }
    }
}

/// How long a refused allocation waits for owners that look gone to be
/// judged (`vgpu_shm::slots::STALE_MS` and a margin), and how often it
/// looks.
const FADING_WAIT: Duration =
    Duration::from_millis(vgpu_shm::slots::STALE_MS + vgpu_shm::slots::VERDICT_MARGIN_MS);
const FADING_POLL: Duration = Duration::from_millis(100);

fn near_limit(attach: &Attach, dev: EntryIndex) -> bool {
    let limit = attach.region.device(dev).mem_limit();
    limit != 0 && attach.region.device_usage(dev, Owners::All) + limit / NEAR_LIMIT_DIV > limit
}

/// One line per denial, at most one a second.
fn report_denial(attach: &Attach, dev: EntryIndex, limit: u64, used: u64, asked: u64) {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = crate::clock::monotonic_ns() / 1_000_000_000;
    if LAST.swap(now, Ordering::Relaxed) == now {
        return;
    }
    log::warn!(
        "out of memory on {}: asked {}, the container uses {} of its {} limit; returning CUDA_ERROR_OUT_OF_MEMORY",
        format_uuid(&attach.region.device(dev).uuid()),
        fmt_bytes(asked),
        fmt_bytes(used),
        fmt_bytes(limit)
    );
}

/// This process's slot; without one it is not counted, so it gets no
/// memory (fail closed, one line why).
pub fn counted_slot(attach: &Attach) -> Result<SlotIndex, CUresult> {
    // (A claim checks the region file itself; `reserve` checks it before
    // it counts.)
    attach.slot().ok_or_else(|| {
        crate::warn_once!(
            "{}: this process cannot be counted, so it gets no device memory (CUDA_ERROR_OUT_OF_MEMORY)",
            attach
                .claim_error()
                .unwrap_or_else(|| "no process slot".into())
        );
        CUresult::ERROR_OUT_OF_MEMORY
    })
}

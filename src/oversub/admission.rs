//! Admission: an allocation that the quota allows but the card cannot
//! hold. Without oversubscription the driver's `CUDA_ERROR_OUT_OF_MEMORY`
//! is the answer at once, as always. With it, the allocation waits: it
//! publishes on the board what it needs on which card, so that idle
//! processes there suspend themselves, and tries again every 20 ms, up to
//! `VGPU_OVERSUBSCRIBE_WAIT_MS`. Then it fails, with a line saying the card
//! is full, not the quota. The bytes stay reserved in the quota meanwhile.
//! Where the processes holding the card take turns (`turns.rs`), it waits
//! for its turn in line instead, a few turns longer at most (`line.rs`);
//! one the card could never hold fails at once.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::handover::WAITING;
use super::state::{ACTIVE, here, settings};
use crate::attach::Attach;
use crate::cuda::sys::CUresult;
use crate::log::fmt_bytes;

const RETRY: Duration = Duration::from_millis(20);
/// How long turns must be seen on, look after look, before a wait counts
/// on them: longer than a watcher tick (100 ms), which publishes what a
/// refused allocation gave back.
const TURNS_CONFIRM: Duration = Duration::from_millis(250);

/// Lets a restore that is moving memory onto `card` finish first (until
/// `deadline`, the allocation's own `VGPU_OVERSUBSCRIBE_WAIT_MS`): it
/// judged the room before this allocation took any, and a restore the
/// driver refuses loses its process.
fn wait_for_moves(h: &super::state::Here, card: &[u8; 16], deadline: std::time::Instant) {
    while super::restore::restore_moving_on(h, card) && std::time::Instant::now() < deadline {
        std::thread::sleep(RETRY);
    }
}

/// Runs `alloc`, on `card`, counted in `attach`'s slot (None: not
/// counted, nothing to wait for).
pub fn admit(
    on: Option<(&Attach, [u8; 16])>,
    bytes: u64,
    mut alloc: impl FnMut() -> CUresult,
) -> CUresult {
    if !ACTIVE.load(Ordering::Relaxed) {
        // Without oversubscription: the driver's answer, nothing more.
        return alloc();
    }
    let card = on.map(|(_, card)| card);
    let wait = Duration::from_millis(settings().wait_ms);
    let start = std::time::Instant::now();
    let moves_done = || {
        if let (Some(card), Some(h)) = (card, here()) {
            wait_for_moves(h, &card, start + wait);
        }
    };
    moves_done();
    let rc = alloc();
    if rc != CUresult::ERROR_OUT_OF_MEMORY {
        return rc;
    }
    let Some((attach, card)) = on else { return rc };
    let uuid = vgpu_shm::format_uuid(&card);
    log::info!(
        "{uuid} is full: {} waits up to {} ms for room (CUDA_OVERSUBSCRIBE)",
        fmt_bytes(bytes),
        wait.as_millis()
    );
    // What this process would hold on the card (the request reserved
    // already): more than the card has never fits, turns or not.
    let holding = match here() {
        Some(h) => {
            // The bytes (reserved by the quota already) on the board
            // first, then the want: a suspension's estimate takes bytes
            // less wants as what is on the card, and must not count the
            // reservation as held (run 26).
            super::suspend::publish_card(attach, h, &card);
            h.entry().bytes_on(&card).max(bytes)
        }
        None => bytes,
    };
    if let Some((_, total)) = crate::nvml::client::memory(&card)
        && holding > total
    {
        log::warn!(
            "out of memory on {uuid}: the card can never hold this: {} asked, {} held by this process with it, on a card of {}; returning CUDA_ERROR_OUT_OF_MEMORY at once",
            fmt_bytes(bytes),
            fmt_bytes(holding),
            fmt_bytes(total)
        );
        return rc;
    }
    WAITING.fetch_add(1, Ordering::AcqRel);
    if let Some(h) = here() {
        h.entry().add_want(&card, bytes);
    }
    // Where it waits for a turn, its turn will end in a suspension: the
    // host copy of its VMM-backed blocks, this one's too, is pinned
    // meanwhile (mover.rs), in its context.
    let vmm_ctx = super::backing::serving_now()
        .then(crate::cuda::driver::current_context)
        .flatten();
    let mut _pinning = None;
    // Its own bound, longer by the turns ahead of it where the card's
    // holders take turns (never shorter once longer).
    let mut bound = wait;
    let mut turns = false;
    // Since when turns have been seen on, look after look: a bound grows
    // only once they held for [`TURNS_CONFIRM`] (another waiter's
    // reservation shows as held until its want is published, and a
    // refused one's until the quota gives it back and a tick publishes
    // that).
    let mut turns_since: Option<std::time::Instant> = None;
    let mut line = super::line::Defer::default();
    let rc = loop {
        // Outside the hook while it sleeps: its process may give its turn
        // meanwhile (suspended, it is restored before it tries again).
        if let Err(rc) = super::inside::outside(
            || {
                let left = bound.saturating_sub(start.elapsed());
                // (Past the bound only while turns are being confirmed.)
                std::thread::sleep(if left.is_zero() {
                    RETRY
                } else {
                    RETRY.min(left)
                });
                moves_done();
            },
            super::restore::resume,
        ) {
            break rc;
        }
        let mut ahead = false;
        if let Some(h) = here() {
            let on =
                super::line::turns_on(h, &card, bytes, || crate::nvml::client::free_memory(&card));
            turns_since = if on {
                Some(turns_since.unwrap_or_else(std::time::Instant::now))
            } else {
                None
            };
            if turns_since.is_some_and(|t| t.elapsed() >= TURNS_CONFIRM) {
                turns = true;
                bound = bound.max(wait.saturating_add(super::line::turn_wait(h, &card)));
                if _pinning.is_none() {
                    let cap = super::mover::arena_cap(h);
                    _pinning = vmm_ctx.map(|ctx| super::mover::waiting(bytes, ctx as usize, cap));
                }
            }
            // Room it could take goes to those ahead of it in line first.
            ahead = line.let_first(h, &card, || {
                crate::nvml::client::memory(&card).is_some_and(|(free, _)| free >= bytes)
            });
            if !ahead {
                line.pause();
            }
        }
        let rc = if ahead {
            CUresult::ERROR_OUT_OF_MEMORY
        } else {
            alloc()
        };
        if rc != CUresult::ERROR_OUT_OF_MEMORY {
            log::info!(
                "{uuid}: {} granted after {} ms",
                fmt_bytes(bytes),
                start.elapsed().as_millis()
            );
            if let Some(h) = here() {
                if turns {
                    super::line::took_turn(h);
                } else {
                    super::line::turn_began(h);
                }
            }
            break rc;
        }
        // (Turns seen but not yet confirmed: a few more looks, so that a
        // wait shorter than the confirmation can still find its turn.)
        if start.elapsed() >= bound && (turns || turns_since.is_none()) {
            log::warn!(
                "out of memory on {uuid}: the card is full (not the quota): {} did not fit after waiting {} ms for idle processes to be suspended{} (VGPU_OVERSUBSCRIBE_WAIT_MS{}); returning CUDA_ERROR_OUT_OF_MEMORY",
                fmt_bytes(bytes),
                start.elapsed().as_millis(),
                if turns { " and for its turn" } else { "" },
                if turns {
                    ", plus the turns ahead of it"
                } else {
                    ""
                }
            );
            break rc;
        }
    };
    // Granted, the reservation already on the board is held for real;
    // refused, the quota gives it back after this returns: its bytes leave
    // the board first, with the want, so that no waiter takes them for
    // memory held (the next tick publishes the slot's total again).
    if let Some(h) = here() {
        let e = h.entry();
        if rc == CUresult::ERROR_OUT_OF_MEMORY {
            e.set_bytes_on(&card, e.bytes_on(&card).saturating_sub(bytes));
        }
        e.take_want(bytes);
    }
    WAITING.fetch_sub(1, Ordering::AcqRel);
    rc
}

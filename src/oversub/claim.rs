//! A restore's room: whether its cards have it now (`short_of_room`, on
//! this process's own figures, restore_room.rs), and its claim on the
//! board under the node's restore lock (`claim_room`), for restore.rs.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::restore_room;
use super::state::Here;
use crate::clock;
use crate::log::fmt_bytes;
use crate::nvml::fresh::ANSWER_WAIT;

/// What a restore leaves free beyond the bytes it moves: the driver's own
/// needs around them, and memory that moves meanwhile. A restore the
/// driver refuses loses the process, so it is never tried on a guess.
pub(super) fn margin(bytes: u64) -> u64 {
    (512 << 20) + bytes / 50
}

/// A card without room for what this process saved there.
pub(super) struct Short {
    pub(super) card: [u8; 16],
    /// The room judged there; None without a fresh figure of its own.
    room: Option<u64>,
    needed: u64,
}

impl Short {
    /// Where it holds a restore, and why (for [`Gate`]).
    pub(super) fn gate(&self) -> (&'static str, String) {
        let card = vgpu_shm::format_uuid(&self.card);
        match self.room {
            Some(room) => (
                "no room",
                format!(
                    "{} judged free on {card}, {} needed",
                    fmt_bytes(room),
                    fmt_bytes(self.needed)
                ),
            ),
            None => (
                "no fresh NVML figure",
                format!(
                    "on {card}; the last one took {} ms",
                    super::free_probe::last_took().as_millis()
                ),
            ),
        }
    }
}

/// The least room judged on the cards this process saved memory on
/// (room.rs: its own figure only, asked at or after `after`; cards it held
/// nothing on need none), or the first card without room. `waited`: how
/// long this restore has waited so far.
pub(super) fn short_of_room(
    h: &Here,
    saved: &[([u8; 16], u64)],
    wait: Duration,
    waited: Duration,
    after: u64,
) -> Result<u64, Short> {
    let mut least = u64::MAX;
    let cards = saved.iter().filter(|&&(_, b)| b > 0).count();
    for &(card, bytes) in saved.iter().filter(|&&(_, b)| b > 0) {
        // A child process asks only where this process's NVML waits for
        // its restore (checkpointed): one cloned beside a live context and
        // a pinned arena of 15 GiB never answered on an H100 (run 103),
        // and both busy jobs then waited for good.
        let checkpointed = super::mover::CHECKPOINTED.load(Ordering::Acquire);
        let room = restore_room::room_on(h, (&card, cards), (wait, waited), after, checkpointed);
        let needed = bytes.saturating_add(margin(bytes));
        match room {
            Some(r) if r >= needed => least = least.min(r),
            _ => return Err(Short { card, room, needed }),
        }
    }
    Ok(least)
}

/// Claims the room on the board, under the node's restore lock (waited
/// for within `room::LOCK_BOUND`). The bytes go on the board first, with
/// the process restoring: allocations on the card wait for it from then
/// on (admission.rs), and every other restore counts them as moving. Then,
/// after [`CLAIM_SETTLE`] for an allocation that passed its check just
/// before to land, room is judged on a figure asked since: a figure from
/// before the claim may miss an allocation that took the room meanwhile
/// (its want already gone from the board), and a restore the driver
/// refuses loses the process. Without room the claim is taken back. One
/// claim at a time on the node, so two restores never count on the same
/// room. The room judged, or why no claim was made.
pub(super) fn claim_room(
    h: &Here,
    saved: &[([u8; 16], u64)],
    waited: Duration,
) -> Result<u64, &'static str> {
    let _node = restore_room::restore_lock(h).map_err(|()| "the node's restore lock is held")?;
    let e = h.entry();
    for &(card, bytes) in saved {
        e.set_bytes_on(&card, bytes);
    }
    std::thread::sleep(CLAIM_SETTLE);
    let after = clock::monotonic_ns();
    let cards = saved.iter().filter(|&&(_, b)| b > 0).count();
    match short_of_room(h, saved, claim_nvml_wait(cards), waited, after) {
        Ok(judged) => {
            e.set_want(&[0; 16], 0);
            Ok(judged)
        }
        Err(short) => {
            for &(card, _) in saved {
                e.set_bytes_on(&card, 0);
            }
            Err(match short.room {
                Some(_) => "the claim's own figure shows no room",
                None => "no NVML figure came within the claim's wait",
            })
        }
    }
}

/// Where a waiting restore is held, said at debug level as it changes
/// (with the log's timestamps: which gate holds a slow restore).
#[derive(Default)]
pub(super) struct Gate(Option<&'static str>);

impl Gate {
    pub(super) fn at(&mut self, gate: &'static str, detail: impl FnOnce() -> String) {
        if self.0 != Some(gate) {
            self.0 = Some(gate);
            log::debug!("CUDA_OVERSUBSCRIBE: restore held: {gate} ({})", detail());
        }
    }
}

/// How long a claim lets an allocation that passed its check before the
/// claim reach the driver, before room is judged anew.
const CLAIM_SETTLE: Duration = Duration::from_millis(50);
/// How long a claim waits for each of its `cards`' new figures (a child
/// process's NVML): twice what the last figure took, at least
/// [`CLAIM_NVML_WAIT`] and at most what a child may take
/// ([`ANSWER_WAIT`]), and all of them within [`CLAIM_FIGURES_MOST`]: a
/// child's figure for a process holding a 46 GiB checkpoint took 0.4-0.9
/// s on an H100 (run 125; its clone most of it), more on a node whose
/// NVML starts slowly, and a claim that times out waits its turn at the
/// lock again.
fn claim_nvml_wait(cards: usize) -> Duration {
    let each = (2 * super::free_probe::last_took()).clamp(CLAIM_NVML_WAIT, ANSWER_WAIT);
    let cards = u32::try_from(cards.max(1)).unwrap_or(u32::MAX);
    each.min(CLAIM_FIGURES_MOST / cards)
}

/// The most a claim waits for its figures, all its cards together.
const CLAIM_FIGURES_MOST: Duration = Duration::from_secs(10);

/// The least a claim waits for its new figure.
const CLAIM_NVML_WAIT: Duration = Duration::from_secs(2);

// A claim holds the node's restore lock for less than others wait for it
// (a settle and its figures, one card after another), so none claims
// beside it.
const _: () = assert!(
    CLAIM_SETTLE.as_nanos() + CLAIM_FIGURES_MOST.as_nanos() < super::room::LOCK_BOUND.as_nanos()
);

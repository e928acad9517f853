//! Beside other containers: pace or take turns (issue 29).
//!
//! Turns (`turns.rs`) make shares exact even where the limits on a GPU sum
//! to all of it, but a step that meets the end of a window waits out the
//! rest of the period: 1 ms steps at 30 % beside a busy 60 % container had
//! a p99 of about 70 ms. Paced evenly side by side, as a container alone
//! is, the contexts time-slice instead: on an H200 30 and 60 % then got
//! 0.303 and 0.600, and those steps a p99 of 3.6 ms (2x the ideal: 6.7),
//! but limits that fill the GPU lose what the switches cost (two 50 %
//! containers of memory-bound kernels 0.455 each; 10, 20, 30 and 40 %
//! left the 40 % one 0.30).
//!
//! So a container paces beside others while the busy containers' limits
//! on the GPU sum to at most [`ROOM_PERCENT`], and takes turns otherwise.
//! Containers share nothing but the node, so each device's leader
//! publishes the container's limit while it is busy on the node's SM board
//! (`vgpu_shm::sm_board`, in a directory HAMi mounts into every container)
//! and reads the others' every control period ([`Pacing::tick`]); the
//! region's `paced_ns` tells the container's other processes
//! ([`paces_beside_others`]). Containers without limits take no turns
//! either way and publish nothing.
//!
//! Without a board (no directory every container sees, or no slot in it)
//! a container takes turns, as before. What a hostile writer of the board
//! can do: claim a limit it does not have, which sends its neighbours to
//! turns (the behaviour without a board), or hide theirs for a period,
//! which paces them beside it, which is what any neighbour that takes no
//! turns already causes (an unlimited one); no quota or limit moves.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use vgpu_shm::layout::DeviceEntry;
use vgpu_shm::sm_board::{self, SmBoard};

pub use crate::config::Turns;

/// Limits that sum to at most this (percent) leave room to pace side by
/// side: the switches between two busy contexts cost 5-10 % of the GPU
/// (0.303 + 0.600 at 30 + 60 on an H200, 0.455 each at 50 + 50).
pub const ROOM_PERCENT: u32 = 90;

static MODE: AtomicU8 = AtomicU8::new(0);
/// The board's directory, as configured (None: the default).
static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Sets the mode and the board's directory, once, from the configuration.
pub fn configure(turns: Turns, dir: Option<PathBuf>) {
    MODE.store(turns as u8, Ordering::Relaxed);
    let _ = DIR.set(dir);
}

fn mode() -> Turns {
    match MODE.load(Ordering::Relaxed) {
        1 => Turns::Always,
        2 => Turns::Never,
        _ => Turns::Auto,
    }
}

/// Whether a container that is not alone on device `entry` paces its
/// share there at `now` instead of taking turns.
pub fn paces_beside_others(entry: &DeviceEntry, now: u64) -> bool {
    match mode() {
        Turns::Auto => entry.paced(now),
        Turns::Always => false,
        Turns::Never => true,
    }
}

/// The board's directory: the one configured, else the default where it
/// is a mount point (one a container made itself would show it no one).
fn board_dir() -> Option<PathBuf> {
    match DIR.get() {
        Some(Some(dir)) => Some(dir.clone()),
        _ => {
            let dir = Path::new(sm_board::DEFAULT_DIR);
            sm_board::is_mount_point(dir).then(|| dir.to_path_buf())
        }
    }
}

/// How long after its last admitted launch a container still counts as
/// busy on the board: a few control periods.
const BUSY_HOLD_NS: u64 = 2_000_000_000;

/// One device's pacing state, kept by its leader.
#[derive(Default)]
pub struct Pacing {
    board: Option<SmBoard>,
    /// Opening the board failed (said once; not retried).
    unusable: bool,
    /// Publishing failed at the last try (said once).
    full: bool,
    last_admitted_ns: u64,
    busy_until_ns: u64,
    /// The last decision, for the log.
    paced: Option<bool>,
}

impl Pacing {
    /// One control period of the leader of device `entry` (limit
    /// `percent`, GPU `uuid`): publishes the limit while the container is
    /// busy, reads the others', and notes in the region whether it paces.
    pub fn tick(&mut self, entry: &DeviceEntry, uuid: &[u8; 16], percent: u32, now: u64) {
        let paced = mode() == Turns::Auto && self.room(entry, uuid, percent, now);
        entry.note_paced(paced, now);
    }

    /// Whether the busy containers' limits on the GPU leave room to pace.
    fn room(&mut self, entry: &DeviceEntry, uuid: &[u8; 16], percent: u32, now: u64) -> bool {
        let admitted = entry.admitted_ns();
        if admitted != self.last_admitted_ns {
            self.last_admitted_ns = admitted;
            self.busy_until_ns = now + BUSY_HOLD_NS;
        }
        let busy = now < self.busy_until_ns;
        let Some(board) = self.board(uuid) else {
            return false;
        };
        let published = if busy {
            board.publish(percent, now)
        } else {
            Ok(())
        };
        let others = board.others(now);
        if let Err(e) = published {
            if !std::mem::replace(&mut self.full, true) {
                log::warn!("SM board: {e}: turns beside other containers");
            }
            self.say(None, "SM board: no slot: turns");
            return false;
        }
        self.full = false;
        let sum = percent + others.percent;
        let paced = sum <= ROOM_PERCENT;
        self.say(
            Some(paced),
            &format!(
                "SM limits on the device: ours {percent} % + {} % of {} other busy container(s) = {sum} %: {}",
                others.percent,
                others.count,
                if paced {
                    "paced beside them"
                } else {
                    "turns"
                }
            ),
        );
        paced
    }

    fn board(&mut self, uuid: &[u8; 16]) -> Option<&mut SmBoard> {
        if self.board.as_ref().is_some_and(|b| !b.intact()) {
            // Renamed or replaced: its users no longer see each other.
            log::debug!("SM board replaced under this process: opened again");
            self.board = None;
        }
        if self.board.is_none() && !self.unusable {
            let dir = board_dir()?;
            match SmBoard::open(&dir, uuid) {
                Ok(b) => self.board = Some(b),
                Err(e) => {
                    self.unusable = true;
                    log::warn!(
                        "SM board in {}: {e}: a limited container takes turns beside others",
                        dir.display()
                    );
                }
            }
        }
        self.board.as_mut()
    }

    /// Logs `line` at debug level when the decision changes.
    fn say(&mut self, paced: Option<bool>, line: &str) {
        if self.paced != Some(paced.unwrap_or(false)) {
            self.paced = Some(paced.unwrap_or(false));
            log::debug!("{line}");
        }
    }
}

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
//! and reads the others' every watcher tick ([`Pacing::tick`]); the
//! region's `paced_ns` tells the container's other processes
//! ([`paces_beside_others`]). A container without a limit publishes
//! nothing while it runs free, and the rest it takes beside limited ones
//! (`rest.rs`) while it does.
//!
//! Side by side, loops that synchronise often hand the GPU over at every
//! synchronisation, and each hand-over costs a switch: a container that
//! waits for the GPU most of the time yet gets under its limit, over the
//! time it had work (`shortfall.rs`: a server between requests has none),
//! asks for turns for a while ([`Pacing::tick`]): its claim then counts
//! as 100 %. Beside a container that takes the rest, one whose windows
//! in turns would hold too few of its steps asks that one for room for
//! its switches instead, and one in turns asks for the span of its
//! windows (`room.rs`).
//!
//! Without a board (no directory every container sees, or no slot in it)
//! a container takes turns, as before. What a hostile writer of the board
//! can do: claim a limit it does not have, which sends its neighbours to
//! turns (the behaviour without a board), or hide theirs for a period,
//! which paces them beside it, which is what any neighbour that takes no
//! turns already causes (an unlimited one); or claim a rest, which makes
//! a short loop beside it ask for room rather than turns (and, where
//! every other claim is a rest, its windows move as beside one) until a
//! second after the room fails it; or publish shares that move where
//! the windows of three or more in turns are placed (`tiling.rs`). No
//! quota or limit moves.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use vgpu_shm::layout::DeviceEntry;
use vgpu_shm::sm_board::{self, Claim, Others, SmBoard};

use super::following;
use super::period;
use super::room::{self, ROOM_PERCENT};
use super::shortfall::{asks_now, short_of_the_gpu, while_busy};
use super::tiling;

pub use crate::config::Turns;

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

/// How long a container that went short of the GPU side by side asks for
/// turns (publishing 100 %) before it tries pacing again; twice as long
/// each time it goes short again, up to [`MAX_TURNS_HOLD_NS`] (each try
/// costs the turns a second or two to settle).
const TURNS_HOLD_NS: u64 = 30_000_000_000;
/// See [`TURNS_HOLD_NS`].
const MAX_TURNS_HOLD_NS: u64 = 480_000_000_000;

/// How long the board must show room before the container paces: a
/// container shows there from its leader's first tick after it became
/// busy (a watcher tick: 100 ms), later on a loaded host.
const ROOM_HOLD_NS: u64 = 600_000_000;

/// How often a container without a board looks for one again.
const RETRY_NS: u64 = 30_000_000_000;

/// How long a room asked for must stand before a shortfall sends the
/// container to turns: the rest moves a watcher tick or two later.
const ROOM_GRACE_NS: u64 = 1_000_000_000;

/// A shortfall side by side is judged over this much paced time, from
/// the tick pacing began. Judged over whole control periods (0.5 s), a
/// loop of 0.1 ms steps beside a 60 % container asked for turns 1.4 s
/// after the board first showed room (0.6 s of it [`ROOM_HOLD_NS`]), and
/// a run of 4 s after 1.5 s of warming up then counted its windows
/// settling: p99 1.4 ms, against 0.13 ms where it asked sooner (H100,
/// runs 139 and 132).
const JUDGE_NS: u64 = 300_000_000;

/// One device's pacing state, kept by its leader.
#[derive(Default)]
pub struct Pacing {
    board: Option<SmBoard>,
    /// Opening the board failed (said once; tried again every
    /// [`RETRY_NS`]).
    unusable: bool,
    /// When to look for the board again.
    retry_at_ns: u64,
    /// Since when the board has shown room (0: it does not).
    room_since_ns: u64,
    /// Publishing failed at the last try (said once).
    full: bool,
    /// What the container had admitted at the last tick (busy while it
    /// grows).
    last_admitted_ns: u64,
    busy_until_ns: u64,
    /// When the span being judged began ([`JUDGE_NS`]), and what the
    /// container had admitted and waited in synchronisations and for its
    /// bucket then.
    last_tick_ns: u64,
    judged_admitted_ns: u64,
    last_sync_wait_ns: u64,
    last_bucket_wait_ns: u64,
    last_syncs: u64,
    last_host_gap_ns: u64,
    /// Since when the container has been paced side by side (0: it is
    /// not): a span judged for a shortfall must be paced whole.
    paced_since_ns: u64,
    /// Until when the container asks for turns (short side by side).
    turns_until_ns: u64,
    /// The last span judged was short of the GPU ([`asks_now`]).
    short_before: bool,
    /// How long it asked the last time (0: never).
    hold_ns: u64,
    /// Until when the container asks a container without a limit for
    /// room (paced and short beside it, [`steps_room`]), since when, and
    /// how much (percent).
    room_until_ns: u64,
    room_asked_ns: u64,
    asked_room: u32,
    /// Whether the last board read showed a container that takes the
    /// rest.
    beside_rest: bool,
    /// The others on the board at the last tick it published there.
    seen: Option<Others>,
    /// The windows' place on the board (three or more in turns).
    placer: tiling::Placer,
    /// The period the container's steps ask for, and the one its turns
    /// follow (`period.rs`).
    asking: period::Asking,
    following: following::Following,
    /// The last decision, for the log.
    paced: Option<bool>,
}

impl Pacing {
    /// A new leader's state: the container counts as busy once its bucket
    /// admits more than `admitted` (what it had admitted so far).
    pub fn since(admitted: u64) -> Pacing {
        Pacing {
            last_admitted_ns: admitted,
            ..Pacing::default()
        }
    }

    /// A new leader's state that keeps the board `self` opened (and its
    /// slot): a container without a limit watches the board before it
    /// leads a bucket (`rest.rs`).
    pub fn restart(self, admitted: u64) -> Pacing {
        Pacing {
            board: self.board,
            unusable: self.unusable,
            retry_at_ns: self.retry_at_ns,
            ..Pacing::since(admitted)
        }
    }

    /// What the others on GPU `uuid`'s board publish at `now`; None
    /// without a board.
    pub fn others(&mut self, uuid: &[u8; 16], now: u64) -> Option<Others> {
        Some(self.board(uuid, now)?.others(now))
    }

    /// Gives the container's slot on the board back (it no longer takes
    /// a rest), and forgets what it decided.
    pub fn withdraw(&mut self) {
        if let Some(b) = self.board.as_mut() {
            b.withdraw();
        }
        self.paced = None;
    }

    /// One watcher tick of the leader of device `entry` (share `percent`,
    /// a limit or, where `rest`, the rest a container without one takes;
    /// GPU `uuid`): publishes the share while the container is busy,
    /// reads the others', notes in the region whether it paces, and
    /// judges whether it went short of the GPU side by side, and places
    /// its windows where three or more take turns (`tiling.rs`). (Every tick,
    /// not every control period: a container that has just become busy
    /// shows on the board a tick later, so the room a newcomer must see
    /// before it paces holds for less.) `host_gap_ns`: the container's
    /// host gaps there so far (`Region::host_gap_ns`).
    pub fn tick(
        &mut self,
        entry: &DeviceEntry,
        uuid: &[u8; 16],
        (percent, rest): (u32, bool),
        host_gap_ns: u64,
        now: u64,
    ) {
        // A rest was never promised: a container that takes one never
        // asks the limited ones for turns.
        if !rest {
            self.judge_shortfall(entry, percent, host_gap_ns, now);
        }
        let asks_turns = now < self.turns_until_ns;
        // A container that takes turns asks for them, and counts as the
        // whole GPU, so that the others keep out of its windows; one
        // paced whatever the others do publishes its share alone.
        let claim = Claim {
            percent,
            asks_turns: !rest && (asks_turns || mode() == Turns::Always),
            rest,
            room: 0,
            period_ms: self.asking.asked_ms(),
            keeps_period: super::turns::period_is_explicit(),
        };
        // What a container without a limit beside it must leave it.
        let claim = match (rest, now < self.room_until_ns) {
            (true, _) => claim,
            (false, true) => claim.with_room(self.asked_room),
            (false, false) if self.beside_rest && !paces_beside_others(entry, now) => {
                claim.with_room(room::span_room(percent, entry.turn_fill_milli()))
            }
            (false, false) => claim,
        };
        let room = self.room(entry, uuid, claim, now);
        // A neighbour that has just become busy shows on the board a tick
        // or two later: room must hold that long first.
        self.room_since_ns = match (room, self.room_since_ns) {
            (false, _) => 0,
            (true, 0) => now,
            (true, since) => since,
        };
        let settled = room && now.saturating_sub(self.room_since_ns) >= ROOM_HOLD_NS;
        let paced = mode() == Turns::Auto && settled && !asks_turns;
        self.paced_since_ns = match (paced, self.paced_since_ns) {
            (false, _) => 0,
            (true, 0) => now,
            (true, since) => since,
        };
        entry.note_paced(paced, now);
        let in_turns = !paced && mode() != Turns::Never;
        self.asking.tick(entry, percent, in_turns, !rest, now);
        if now < self.busy_until_ns {
            // (Idle, it keeps the period: its windows hold nothing.)
            let asked = following::asked_on_the_board(self.asking.asked_ms(), self.seen.as_ref());
            self.following.tick(entry, asked, now);
        }
        self.placer
            .tick(entry, self.seen, claim.percent, in_turns, now);
    }

    /// Over the span that ends at `now`, once it holds [`JUDGE_NS`] of
    /// paced time: whether the container, paced side by side, was short
    /// of the GPU; if so it asks for turns for a while.
    fn judge_shortfall(&mut self, entry: &DeviceEntry, percent: u32, host_gap: u64, now: u64) {
        let paced_whole = self.paced_since_ns != 0 && self.paced_since_ns <= self.last_tick_ns;
        if paced_whole && now.saturating_sub(self.last_tick_ns) < JUDGE_NS {
            return; // the span goes on
        }
        let admitted = entry.admitted_ns();
        let synced = entry.sync_wait_ns();
        let held = entry.wait_ns();
        let syncs = entry.syncs();
        let last = (
            self.judged_admitted_ns,
            self.last_sync_wait_ns,
            self.last_bucket_wait_ns,
            self.last_syncs,
            self.last_host_gap_ns,
        );
        (
            self.judged_admitted_ns,
            self.last_sync_wait_ns,
            self.last_bucket_wait_ns,
            self.last_syncs,
            self.last_host_gap_ns,
        ) = (admitted, synced, held, syncs, host_gap);
        let last_tick = std::mem::replace(&mut self.last_tick_ns, now);
        let period = now.saturating_sub(last_tick);
        let paused = entry.turn_flag(vgpu_shm::layout::TURNS_PAUSED);
        // (The first span's counters run from the region's making; a span
        // that began in turns is not the pacing's to judge.)
        if last_tick == 0 || period == 0 || !paced_whole || entry.alone(now) || paused {
            self.short_before = false;
            return;
        }
        let share = |ns: u64, since: u64| ns.saturating_sub(since) as f64 / period as f64;
        let got = share(admitted, last.0);
        let waited = share(synced, last.1);
        let bucket = share(held, last.2);
        let idle = share(host_gap, last.4);
        log::debug!(
            "paced side by side: got {got:.3} of the GPU at {percent} %, {waited:.2} of the time in synchronisations, {bucket:.2} for the bucket, {idle:.2} between a return and a launch"
        );
        let per_s = syncs.saturating_sub(last.3) as f64 * 1e9 / period as f64;
        // (At the configured period: turns lengthened for another's steps
        // should not send short steps that need room into turns.)
        let room = room::steps_room(percent, got, per_s, super::turns::period_ns());
        let asking_room = now < self.room_until_ns;
        let limit = f64::from(percent) / 100.0;
        // (Judged over the time it had work: a server between requests is
        // short of work, not of the GPU.)
        let busy_got = while_busy(got, idle, waited + bucket);
        let short = short_of_the_gpu(busy_got, waited, bucket, limit);
        let short_before = std::mem::replace(&mut self.short_before, short);
        if short && !asks_now(busy_got, limit, short_before) {
            log::debug!("side by side a little short of the GPU: judged again over the next span");
            return;
        }
        if short {
            if asking_room && now < self.room_asked_ns + ROOM_GRACE_NS {
                return; // the rest has yet to make the room
            }
            if !asking_room {
                self.hold_ns = (self.hold_ns * 2).clamp(TURNS_HOLD_NS, MAX_TURNS_HOLD_NS);
            }
            if let Some(room) = room.filter(|&r| self.beside_rest && !asking_room && r > percent) {
                // Beside a container that takes the rest, short steps are
                // better served paced, in room it leaves, than in turns.
                (self.room_until_ns, self.room_asked_ns) = (now + self.hold_ns, now);
                self.asked_room = room;
                log::debug!(
                    "side by side the container got {got:.3} of the GPU at {percent} %, {waited:.2} of the time waiting for it, {per_s:.0} steps a second: asks the rest for room, {room} %, for {} s",
                    self.hold_ns / 1_000_000_000
                );
                return;
            }
            // (Short in the room asked, too: turns, for as long as the
            // room was asked.)
            self.room_until_ns = 0;
            self.turns_until_ns = now + self.hold_ns;
            log::debug!(
                "side by side the container got {got:.3} of the GPU at {percent} %, {waited:.2} of the time waiting for it: turns for {} s",
                self.hold_ns / 1_000_000_000
            );
        } else if let Some(room) = room.filter(|&r| asking_room && self.beside_rest && r > percent)
        {
            // The room serves: asked on, for what the steps need now (a
            // lapse would send the loop short for a span every hold).
            self.room_until_ns = now + self.hold_ns.max(TURNS_HOLD_NS);
            self.asked_room = room;
        } else if now
            > self
                .turns_until_ns
                .max(self.room_until_ns)
                .saturating_add(self.hold_ns)
        {
            // Paced for longer than it last asked turns for: a later
            // shortfall starts from the shortest hold again.
            self.hold_ns = 0;
        }
    }

    /// Whether the busy containers' shares on the GPU leave room to pace.
    fn room(&mut self, entry: &DeviceEntry, uuid: &[u8; 16], claim: Claim, now: u64) -> bool {
        let admitted = entry.admitted_ns();
        if admitted != self.last_admitted_ns {
            self.last_admitted_ns = admitted;
            self.busy_until_ns = now + BUSY_HOLD_NS;
        }
        let busy = now < self.busy_until_ns;
        let Some(board) = self.board(uuid, now) else {
            // No board, no neighbour known: neither word stands.
            self.seen = None;
            self.beside_rest = false;
            entry.note_rest_beside(false, now);
            entry.note_limited_beside(false, now);
            return false;
        };
        let published = if busy {
            board.publish(claim, now)
        } else {
            Ok(())
        };
        let others = board.others(now);
        self.seen = (busy && published.is_ok()).then_some(others);
        self.beside_rest = others.resting > 0;
        // (Beside a limited one the windows judge by `limited_beside`.)
        entry.note_rest_beside(self.beside_rest && others.count == others.resting, now);
        // (A rest yields to the limited ones: it looks for nothing more.)
        entry.note_limited_beside(!claim.rest && others.count > others.resting, now);
        if let Err(e) = published {
            if !std::mem::replace(&mut self.full, true) {
                log::warn!("SM board: {e}: turns beside other containers");
            }
            self.say(None, "SM board: no slot: turns");
            return false;
        }
        self.full = false;
        let ours = if claim.asks_turns { 100 } else { claim.percent };
        let sum = ours + others.percent;
        let paced = sum <= ROOM_PERCENT;
        self.say(
            Some(paced),
            &format!(
                "SM shares on the device: ours {ours} % + {} % of {} other busy container(s) = {sum} %: {}",
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

    fn board(&mut self, uuid: &[u8; 16], now: u64) -> Option<&mut SmBoard> {
        if self.board.as_ref().is_some_and(|b| !b.intact()) {
            // Renamed or replaced: its users no longer see each other.
            log::debug!("SM board replaced under this process: opened again");
            self.board = None;
        }
        if self.board.is_none() && now >= self.retry_at_ns {
            // (Not found, or not opened: looked for again in a while,
            // not every period.)
            self.retry_at_ns = now + RETRY_NS;
            let dir = board_dir()?;
            match SmBoard::open(&dir, uuid) {
                Ok(b) => self.board = Some(b),
                Err(e) if !std::mem::replace(&mut self.unusable, true) => log::warn!(
                    "SM board in {}: {e}: a limited container takes turns beside others",
                    dir.display()
                ),
                Err(_) => {}
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

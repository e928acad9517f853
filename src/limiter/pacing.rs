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
//! waits for the GPU most of the time yet gets under its limit
//! asks for turns for a while ([`Pacing::tick`]): its claim then counts
//! as 100 %. Beside a container that takes the rest, one whose windows
//! in turns would hold too few of its steps asks that one for room for
//! its switches instead ([`steps_room`]), and one in turns asks for the
//! span of its windows ([`span_room`]).
//!
//! Without a board (no directory every container sees, or no slot in it)
//! a container takes turns, as before. What a hostile writer of the board
//! can do: claim a limit it does not have, which sends its neighbours to
//! turns (the behaviour without a board), or hide theirs for a period,
//! which paces them beside it, which is what any neighbour that takes no
//! turns already causes (an unlimited one); or claim a rest, which makes
//! a short loop beside it ask for room rather than turns (and, where
//! every other claim is a rest, its windows move as beside one) until a
//! second after the room fails it; no quota or limit moves.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use vgpu_shm::layout::DeviceEntry;
use vgpu_shm::sm_board::{self, Claim, Others, SmBoard};

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

/// Side by side, the contexts' hand-overs cost what the limits leave
/// free, and more where the loops hand over often: 30 + 60 of 0.05 ms
/// kernels synchronised every 0.5 ms got 0.341 + 0.508 on an H100 (run
/// 128; the 60 % one waited in synchronisations 0.65 of the time). A
/// container that waited there over this part of the time,
/// hardly for its bucket, and got under [`SHORT_OF`] of its limit is
/// short of the GPU, not of work: a host-bound loop waits in
/// synchronisations little, and a paced inference loop waits for its
/// bucket (1 ms steps at 30 %: about 0.7 of the time).
const SYNC_BOUND: f64 = 0.5;
/// See [`SYNC_BOUND`].
const BUCKET_BOUND: f64 = 0.1;
/// See [`SYNC_BOUND`].
const SHORT_OF: f64 = 0.93;

/// A paced container short of the GPU beside a container without a limit
/// asks it for room rather than for turns where a window in turns would
/// hold fewer of its steps than this: one step in each window waits out
/// the rest of the period, so 0.1 ms steps at 10 % (86 to a 10 ms window)
/// had a p99 of 90 ms in turns beside the rest (H200, run 149), where
/// paced beside a 60 % container they had 1.7 ms. A step is told by a
/// synchronisation (`cuCtxSynchronize`, a stream's or an event's): a loop
/// that synchronises several times a step counts more steps than it
/// makes (and asks more room, at most the room there is), and one that
/// only waits in a synchronous copy counts none, and takes turns.
const WINDOW_STEPS: f64 = 120.0;
/// What each step of a paced loop costs beside a busy neighbour in
/// switches: two hand-overs between contexts, about 0.15 ms each on an
/// H100 (gpu-tests/switchcost.cu). A loop short of the GPU asks the rest
/// for room for them, at the steps a second it makes at its limit.
const SWITCHES_PER_STEP_NS: f64 = 300_000.0;
/// How long a room asked for must stand before a shortfall sends the
/// container to turns: the rest moves a watcher tick or two later.
const ROOM_GRACE_NS: u64 = 1_000_000_000;

/// The room (percent of the GPU's time) a container at `percent`, paced
/// side by side and short of the GPU (it got `got` of it, making
/// `syncs_per_s` synchronisations a second), needs a container without a
/// limit to leave it, if it should stay paced: its limit, and what its
/// steps' switches cost at its limit. None where a window of a `period_ns`
/// would hold enough of its steps ([`WINDOW_STEPS`]): turns serve it.
fn steps_room(percent: u32, got: f64, syncs_per_s: f64, period_ns: u64) -> Option<u32> {
    let limit = f64::from(percent) / 100.0;
    if got <= 0.0 || syncs_per_s <= 0.0 {
        return None;
    }
    let steps_at_limit = syncs_per_s * limit / got;
    let in_window = steps_at_limit * period_ns as f64 / 1e9;
    let switches = steps_at_limit * SWITCHES_PER_STEP_NS / 1e9;
    // (The rest keeps its least whatever is asked: `rest.rs`.)
    (in_window < WINDOW_STEPS).then(|| {
        // (`percent` is the region's, which any process of the container
        // may write: clamped, and added without overflow.)
        let percent = percent.min(100);
        percent
            .saturating_add((switches * 100.0).ceil() as u32)
            .min(ROOM_PERCENT.max(percent))
    })
}

/// The room (percent of the period) the windows of a container at
/// `percent` span in turns: its share over its fill (`fill_milli`, 0:
/// not known). 0.1 ms steps with a fill of 0.81 at 50 % span 62 ms of
/// each 100, and beside them the rest's 40 % left no room between the
/// windows: they ran into each other by a probe's noise each period
/// (p99 2.5 ms, H200, run 151).
fn span_room(percent: u32, fill_milli: u64) -> u32 {
    match fill_milli {
        1..1000 => (u64::from(percent) * 1000).div_ceil(fill_milli).min(100) as u32,
        _ => percent,
    }
}

/// A shortfall side by side is judged over this much paced time, from
/// the tick pacing began. Judged over whole control periods (0.5 s), a
/// loop of 0.1 ms steps beside a 60 % container asked for turns 1.4 s
/// after the board first showed room (0.6 s of it [`ROOM_HOLD_NS`]), and
/// a run of 4 s after 1.5 s of warming up then counted its windows
/// settling: p99 1.4 ms, against 0.13 ms where it asked sooner (H100,
/// runs 139 and 132).
const JUDGE_NS: u64 = 300_000_000;

/// Whether a container side by side, over a span, was short of
/// the GPU: it got `admitted` of the device (fraction) at limit `limit`
/// (fraction), waiting `synced` of the time in synchronisations and
/// `held` for its bucket.
fn short_of_the_gpu(admitted: f64, synced: f64, held: f64, limit: f64) -> bool {
    synced > SYNC_BOUND && held < BUCKET_BOUND && admitted < SHORT_OF * limit
}

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
    /// Since when the container has been paced side by side (0: it is
    /// not): a span judged for a shortfall must be paced whole.
    paced_since_ns: u64,
    /// Until when the container asks for turns (short side by side).
    turns_until_ns: u64,
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
    /// judges whether it went short of the GPU side by side. (Every tick,
    /// not every control period: a container that has just become busy
    /// shows on the board a tick later, so the room a newcomer must see
    /// before it paces holds for less.)
    pub fn tick(
        &mut self,
        entry: &DeviceEntry,
        uuid: &[u8; 16],
        percent: u32,
        rest: bool,
        now: u64,
    ) {
        // A rest was never promised: a container that takes one never
        // asks the limited ones for turns.
        if !rest {
            self.judge_shortfall(entry, percent, now);
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
        };
        // What a container without a limit beside it must leave it.
        let claim = match (rest, now < self.room_until_ns) {
            (true, _) => claim,
            (false, true) => claim.with_room(self.asked_room),
            (false, false) if self.beside_rest && !paces_beside_others(entry, now) => {
                claim.with_room(span_room(percent, entry.turn_fill_milli()))
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
    }

    /// Over the span that ends at `now`, once it holds [`JUDGE_NS`] of
    /// paced time: whether the container, paced side by side, was short
    /// of the GPU; if so it asks for turns for a while.
    fn judge_shortfall(&mut self, entry: &DeviceEntry, percent: u32, now: u64) {
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
        );
        (
            self.judged_admitted_ns,
            self.last_sync_wait_ns,
            self.last_bucket_wait_ns,
            self.last_syncs,
        ) = (admitted, synced, held, syncs);
        let last_tick = std::mem::replace(&mut self.last_tick_ns, now);
        let period = now.saturating_sub(last_tick);
        let paused = entry.turn_flag(vgpu_shm::layout::TURNS_PAUSED);
        // (The first span's counters run from the region's making; a span
        // that began in turns is not the pacing's to judge.)
        if last_tick == 0 || period == 0 || !paced_whole || entry.alone(now) || paused {
            return;
        }
        let share = |ns: u64, since: u64| ns.saturating_sub(since) as f64 / period as f64;
        let got = share(admitted, last.0);
        let waited = share(synced, last.1);
        let bucket = share(held, last.2);
        log::debug!(
            "paced side by side: got {got:.3} of the GPU at {percent} %, {waited:.2} of the time in synchronisations, {bucket:.2} for the bucket"
        );
        let per_s = syncs.saturating_sub(last.3) as f64 * 1e9 / period as f64;
        let room = steps_room(percent, got, per_s, super::turns::period_ns());
        let asking_room = now < self.room_until_ns;
        if short_of_the_gpu(got, waited, bucket, f64::from(percent) / 100.0) {
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
            self.beside_rest = false;
            return false;
        };
        let published = if busy {
            board.publish(claim, now)
        } else {
            Ok(())
        };
        let others = board.others(now);
        self.beside_rest = others.resting > 0;
        // (Beside a limited one too, the windows judge as they did.)
        entry.note_rest_beside(self.beside_rest && others.count == others.resting, now);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_of_the_gpu_is_waiting_for_it_and_getting_less_than_the_limit() {
        // 0.05 ms kernels synchronised every 0.5 ms at 60 %: 0.425.
        assert!(short_of_the_gpu(0.425, 0.65, 0.0, 0.6));
        // Its share: not short, however long it waits.
        assert!(!short_of_the_gpu(0.60, 0.9, 0.0, 0.6));
        // A host-bound loop under its limit waits for the GPU little.
        assert!(!short_of_the_gpu(0.20, 0.3, 0.0, 0.3));
        // A paced inference loop on a loaded host, a little under its
        // limit, waits for its bucket most of the time.
        assert!(!short_of_the_gpu(0.273, 0.55, 0.5, 0.3));
    }

    #[test]
    fn short_steps_ask_the_rest_for_room_and_long_windows_take_turns() {
        const P: u64 = 100_000_000;
        // 0.1 ms steps at 10 % beside a rest of 80 (run 147): 0.053 of
        // the GPU, about 500 steps a second; at 10 %, 94 to a window.
        // Room for their switches: 29 % more.
        assert_eq!(steps_room(10, 0.053, 500.0, P), Some(10 + 29));
        // The same steps at 30 % make 300 to a window: turns serve them.
        assert_eq!(steps_room(30, 0.16, 1600.0, P), None);
        // 1 ms steps at 30 %, short: 30 to a window; 9 % of switches.
        assert_eq!(steps_room(30, 0.2, 200.0, P), Some(39));
        // Never more than the room there is, nor less than the limit;
        // nothing known, nothing asked.
        assert_eq!(steps_room(60, 0.3, 550.0, P), Some(ROOM_PERCENT));
        assert_eq!(steps_room(89, 0.5, 100.0, P), Some(ROOM_PERCENT));
        assert_eq!(steps_room(70, 0.5, 10.0, P), Some(71));
        assert_eq!(steps_room(90, 0.1, 1.0, P), Some(90));
        assert_eq!(steps_room(10, 0.0, 500.0, P), None);
        assert_eq!(steps_room(10, 0.05, 0.0, P), None);
        // A longer period holds more steps to a window.
        assert_eq!(steps_room(10, 0.053, 500.0, 2 * P), None);
    }

    #[test]
    fn windows_in_turns_span_their_share_over_their_fill() {
        assert_eq!(span_room(50, 810), 62);
        assert_eq!(span_room(30, 1000), 30);
        assert_eq!(span_room(30, 0), 30);
        assert_eq!(span_room(90, 500), 100);
        assert_eq!(span_room(10, 999), 11);
    }
}

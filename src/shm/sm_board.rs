//! The node's SM board: one small file per GPU
//! (`vgpu-sm-<uuid>.board` in a directory every container sees, HAMi's
//! `/tmp/vgpulock` by default) where each limited container publishes its
//! SM limit on that GPU while it is busy, so that containers which share
//! nothing else can tell whether their limits leave part of the GPU free.
//! They then pace their shares evenly side by side instead of taking
//! turns (issue 29; `limiter/pacing.rs` decides).
//!
//! Each slot is 16 bytes at `16 * i`: a magic word, the percent (1-100),
//! and the CLOCK_MONOTONIC time it was last written, as every library
//! since the board's first reads it; a claim that asks for turns writes
//! 100 there. Its detail, the claim's own percent and two flags
//! ([`ASKS_TURNS`], [`REST`]), is a second slot of the same shape at
//! [`DETAIL_BASE`] `+ 16 * i`, written first with the same time: a reader
//! that knows it uses it, an older one never reads it. The room a limited
//! container needs ([`Claim::room`]) is a third, at [`ROOM_BASE`] `+ 16 *
//! i`, written before the other two with the same time: a reader of the
//! detail from before it never reads it either. The period a container's
//! short steps ask the turns on the GPU to take ([`Claim::period_ms`]) is
//! a fourth, at [`PERIOD_BASE`] `+ 16 * i`, written first of all, with
//! [`KEEPS_PERIOD`] where the writer's turns keep a period of their own;
//! only libraries that know it read it, and a slot without one (an older
//! writer's) reads as keeping its period. A container without
//! an SM limit publishes the rest it takes beside limited ones (`REST`,
//! `limiter/rest.rs`), which an older reader counts as a limit. A slot is
//! owned by whoever
//! holds an OFD write lock on byte `LOCK_BASE + i` (past the data, so a
//! lock never covers it); the kernel drops it with its holder. A slot
//! counts only while it is locked by someone else and was written within
//! [`FRESH_NS`] (a forked child that kept the descriptor keeps the lock,
//! not the heartbeat).
//!
//! Everything here is read with `pread` and written with `pwrite`: no
//! mapping, so a file cut short reads as empty slots, never a SIGBUS.
//! Whoever can write the directory can write any slot; a reader clamps
//! what it reads (at most [`SLOTS`] slots, each 1-100), and a slot that
//! reads wrong counts as nothing. What a hostile writer can do with that
//! is bounded in `limiter/pacing.rs`, `limiter/rest.rs` and
//! `limiter/tiling.rs`.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// (The directory's checks: `board_dir.rs`.)
pub use crate::board_dir::is_mount_point;

/// `"VGSM"` read as a little-endian `u32`.
const MAGIC: u32 = u32::from_le_bytes(*b"VGSM");
/// `"VGSD"`: a slot's detail.
const DETAIL_MAGIC: u32 = u32::from_le_bytes(*b"VGSD");
/// `"VGSR"`: a slot's room.
const ROOM_MAGIC: u32 = u32::from_le_bytes(*b"VGSR");
/// `"VGSP"`: the period a slot's owner asks for.
const PERIOD_MAGIC: u32 = u32::from_le_bytes(*b"VGSP");
/// The longest period a claim may ask for (ms): a longer word reads as
/// none.
pub const MAX_PERIOD_MS: u32 = 1000;
/// An asked period's flag: the writer's turns keep their own period
/// (`VGPU_SM_PERIOD_MS` set): it follows no one's ask.
pub const KEEPS_PERIOD: u32 = 1 << 31;
/// Containers one GPU's board holds at once.
pub const SLOTS: usize = 32;
const SLOT_BYTES: u64 = 16;
/// Where the slots' details begin: past the slots.
pub const DETAIL_BASE: u64 = SLOTS as u64 * SLOT_BYTES;
/// Where the slots' rooms begin: past the details.
pub const ROOM_BASE: u64 = 2 * SLOTS as u64 * SLOT_BYTES;
/// Where the slots' asked periods begin: past the rooms.
pub const PERIOD_BASE: u64 = 3 * SLOTS as u64 * SLOT_BYTES;
/// Where the slots' lock bytes begin (past any data).
const LOCK_BASE: i64 = 1 << 20;
/// How recently a slot must have been written to count: many of its
/// owner's writes (one every watcher tick, 100 ms, while it is busy).
pub const FRESH_NS: u64 = 2_000_000_000;
/// A slot written later than this past the reader's clock is not
/// believed (another boot's clock, or a hand edit).
const AHEAD_NS: u64 = 1_000_000_000;

/// The board's default directory: HAMi's device plugin (and Koordinator's,
/// and KAI's) mounts the node's `/tmp/vgpulock` into every container it
/// gives a share of a GPU.
pub const DEFAULT_DIR: &str = "/tmp/vgpulock";

/// The board's file name for the GPU of `uuid`.
pub fn file_name(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!("vgpu-sm-{hex}.board")
}

/// A claim's flag: the container asks its neighbours for turns (it went
/// short of the GPU side by side, or always takes turns): it counts as
/// the whole GPU in [`Others::percent`].
pub const ASKS_TURNS: u32 = 1 << 8;
/// A claim's flag: the percent is the rest a container without an SM
/// limit takes, not a limit.
pub const REST: u32 = 1 << 9;
const PERCENT_BITS: u32 = 0xff;

/// What one container publishes: its share (percent, 1-100) and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The share, 1-100.
    pub percent: u32,
    /// It asks for turns ([`ASKS_TURNS`]).
    pub asks_turns: bool,
    /// The percent is a rest, not a limit ([`REST`]).
    pub rest: bool,
    /// The part of the GPU's time (percent) a limited container needs
    /// the containers that take the rest to leave it, where that is more
    /// than its limit (0: its limit): its windows in turns span more than
    /// their share, or its steps' hand-overs cost time of their own
    /// (`limiter/pacing.rs`). Only the rest reads it (`limiter/rest.rs`).
    pub room: u32,
    /// The period (ms) its steps ask the turns on the GPU to take, where
    /// they would fare badly at the configured one (0: none;
    /// `limiter/period.rs`).
    pub period_ms: u32,
    /// Its turns keep a period of their own and follow no one's ask
    /// ([`KEEPS_PERIOD`]; as read, also a writer from before asks).
    pub keeps_period: bool,
}

impl Claim {
    /// A limited container's claim.
    pub fn limit(percent: u32, asks_turns: bool) -> Claim {
        Claim {
            percent,
            asks_turns,
            rest: false,
            room: 0,
            period_ms: 0,
            keeps_period: false,
        }
    }

    /// A rest a container without a limit takes.
    pub fn rest(percent: u32) -> Claim {
        Claim {
            rest: true,
            ..Claim::limit(percent, false)
        }
    }

    /// This claim, needing `room` percent of the GPU's time.
    pub fn with_room(self, room: u32) -> Claim {
        Claim { room, ..self }
    }

    /// This claim, asking for turns of `period_ms` (0: none), its turns
    /// keeping their own period or not.
    pub fn with_period(self, period_ms: u32, keeps_period: bool) -> Claim {
        Claim {
            period_ms,
            keeps_period,
            ..self
        }
    }

    /// The part of the GPU's time it needs: its room, at least its share.
    pub fn needs(self) -> u32 {
        self.room.clamp(self.percent, 100)
    }

    /// The word a slot's detail holds.
    fn word(self) -> u32 {
        let flag = |on: bool, bit: u32| if on { bit } else { 0 };
        self.percent.clamp(1, 100) | flag(self.asks_turns, ASKS_TURNS) | flag(self.rest, REST)
    }

    /// A detail's word, if it is one: 1-100 and known flags only (as
    /// every reader of details since they came reads it).
    fn from_word(w: u32) -> Option<Claim> {
        let percent = w & PERCENT_BITS;
        let known = w & !(PERCENT_BITS | ASKS_TURNS | REST) == 0;
        (known && (1..=100).contains(&percent)).then_some(Claim {
            percent,
            asks_turns: w & ASKS_TURNS != 0,
            rest: w & REST != 0,
            room: 0,
            period_ms: 0,
            keeps_period: false,
        })
    }
}

/// What the other containers on one GPU's board publish.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Others {
    /// Their shares, summed (percent), one that asks for turns counting
    /// as 100.
    pub percent: u32,
    /// How many publish.
    pub count: u32,
    /// The limits of those that publish one (not a rest), summed as they
    /// are (percent).
    pub limits: u32,
    /// How many ask for turns.
    pub asking: u32,
    /// How many publish a rest (containers without a limit).
    pub resting: u32,
    /// What those that publish a limit need of the GPU's time, summed
    /// (percent): each one's room, at least its limit ([`Claim::needs`]).
    pub rooms: u32,
    /// Their own shares, summed (percent), one that asks for turns at
    /// its own, not 100: what their windows in turns take of a period.
    pub shares: u32,
    /// Of those, how many hold slots below the reader's own (none where
    /// the reader holds no slot).
    pub below: u32,
    /// The shares of those below, summed (percent).
    pub shares_below: u32,
    /// The longest period any of them asks for (ms; 0: none).
    pub period_ms: u32,
    /// How many of them keep a period of their own (and would not follow
    /// a longer one).
    pub keeping_period: u32,
}

impl Others {
    fn add(&mut self, c: Claim, below: bool) {
        self.percent += if c.asks_turns { 100 } else { c.percent };
        self.count += 1;
        self.shares += c.percent;
        if below {
            self.below += 1;
            self.shares_below += c.percent;
        }
        if c.rest {
            self.resting += 1;
        } else {
            self.limits += c.percent;
            self.rooms += c.needs();
        }
        self.asking += u32::from(c.asks_turns);
        self.period_ms = self.period_ms.max(c.period_ms);
        self.keeping_period += u32::from(c.keeps_period);
    }
}

/// One GPU's board, opened by a container's leader for that GPU.
pub struct SmBoard {
    /// The one descriptor: its open file description holds the slot's
    /// lock, so it is never duplicated.
    file: File,
    path: PathBuf,
    /// The slot this process owns, once claimed.
    mine: Option<usize>,
}

impl SmBoard {
    /// Opens (creating it, mode 0666) the board of the GPU `uuid` in
    /// `dir`, after the directory's checks (no symbolic link, owned by
    /// root or this user).
    pub fn open(dir: &Path, uuid: &[u8; 16]) -> io::Result<SmBoard> {
        let name = file_name(uuid);
        let dir_fd = crate::board_dir::open_shared(dir)?;
        let file = crate::board_dir::open_in(&dir_fd, &name)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a plain file", dir.join(&name).display()),
            ));
        }
        // Made by this user under a umask: containers of other users
        // must write it too.
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // SAFETY: geteuid cannot fail and touches no memory of ours.
        let me = unsafe { libc::geteuid() };
        if meta.uid() == me && meta.mode() & 0o777 != 0o666 {
            let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
        }
        Ok(SmBoard {
            file,
            path: dir.join(name),
            mine: None,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file at the path is still the one this process opened
    /// (in a directory anybody may write, it can be renamed or replaced:
    /// its users would no longer see each other).
    pub fn intact(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let (Ok(ours), Ok(named)) = (self.file.metadata(), std::fs::symlink_metadata(&self.path))
        else {
            return false;
        };
        (ours.dev(), ours.ino()) == (named.dev(), named.ino())
    }

    /// Publishes `claim` at time `now`, claiming a slot first if this
    /// process has none (`Err`: every slot is held by someone else).
    pub fn publish(&mut self, claim: Claim, now: u64) -> io::Result<()> {
        let slot = match self.mine {
            Some(i) => i,
            None => {
                let i = (0..SLOTS)
                    .find(|&i| self.lock(i, libc::F_OFD_SETLK))
                    .ok_or_else(|| {
                        io::Error::new(
                            io::ErrorKind::WouldBlock,
                            format!("all {SLOTS} slots of {} are held", self.path.display()),
                        )
                    })?;
                self.mine = Some(i);
                i
            }
        };
        // The period, the room and the detail first: a reader that finds
        // the slot with this time finds them too.
        let at = slot as u64 * SLOT_BYTES;
        let keeps = if claim.keeps_period { KEEPS_PERIOD } else { 0 };
        let period = claim.period_ms.min(MAX_PERIOD_MS) | keeps;
        self.file
            .write_all_at(&slot_bytes(PERIOD_MAGIC, period, now), PERIOD_BASE + at)?;
        let room = if claim.room > claim.percent {
            claim.room.min(100)
        } else {
            0
        };
        self.file
            .write_all_at(&slot_bytes(ROOM_MAGIC, room, now), ROOM_BASE + at)?;
        self.file.write_all_at(
            &slot_bytes(DETAIL_MAGIC, claim.word(), now),
            DETAIL_BASE + at,
        )?;
        let plain = if claim.asks_turns { 100 } else { claim.percent };
        self.file
            .write_all_at(&slot_bytes(MAGIC, plain.clamp(1, 100), now), at)
    }

    /// Gives this process's slot back, if it holds one: cleared, then
    /// unlocked (a container that stops taking the rest shows no more).
    pub fn withdraw(&mut self) {
        let Some(i) = self.mine.take() else {
            return;
        };
        let at = i as u64 * SLOT_BYTES;
        let _ = self.file.write_all_at(&[0u8; SLOT_BYTES as usize], at);
        for base in [DETAIL_BASE, ROOM_BASE, PERIOD_BASE] {
            let _ = self
                .file
                .write_all_at(&[0u8; SLOT_BYTES as usize], base + at);
        }
        let mut fl = lock_of(i);
        fl.l_type = libc::F_UNLCK as libc::c_short;
        // SAFETY: fcntl on our open descriptor with a flock we own (l_pid
        // 0, as an OFD lock needs).
        unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
    }

    /// What the other live, fresh slots publish at time `now`.
    pub fn others(&self, now: u64) -> Others {
        let mut all = [0u8; 4 * SLOTS * SLOT_BYTES as usize];
        // A file cut short reads short: the rest stay zeros (no slot).
        let got = read_up_to(&self.file, &mut all);
        let mut o = Others::default();
        for i in (0..SLOTS).filter(|&i| Some(i) != self.mine) {
            let at = i * SLOT_BYTES as usize;
            if at + SLOT_BYTES as usize > got {
                break;
            }
            // (Not read: a file cut short, or an older writer's.)
            let part = |base: u64| {
                let from = base as usize + at;
                all.get(from..from + SLOT_BYTES as usize)
                    .filter(|_| from + SLOT_BYTES as usize <= got)
            };
            let slot = &all[at..at + SLOT_BYTES as usize];
            let Some(claim) = slot_claim(slot, part(DETAIL_BASE), part(ROOM_BASE), now) else {
                continue;
            };
            let claim = match asked_period(part(PERIOD_BASE), slot) {
                Some((ms, keeps)) => claim.with_period(ms, keeps),
                None => claim.with_period(0, true),
            };
            if self.held_by_other(i) {
                o.add(claim, self.mine.is_some_and(|m| i < m));
            }
        }
        o
    }

    /// Takes (`F_OFD_SETLK`) or tests (`F_OFD_GETLK`) the lock of slot `i`.
    fn lock(&self, i: usize, cmd: libc::c_int) -> bool {
        let mut fl = lock_of(i);
        // SAFETY: fcntl on our open descriptor with a flock we own; an OFD
        // lock needs l_pid 0 (as lock_of sets it).
        let rc = unsafe { libc::fcntl(self.file.as_raw_fd(), cmd, &mut fl) };
        rc == 0
    }

    /// Whether slot `i` is locked by another open file description.
    fn held_by_other(&self, i: usize) -> bool {
        let mut fl = lock_of(i);
        // SAFETY: as in `lock`; F_OFD_GETLK writes the conflicting lock,
        // if any, into `fl`.
        let rc = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
        rc == 0 && fl.l_type != libc::F_UNLCK as libc::c_short
    }
}

/// A slot's (or a detail's) 16 bytes.
fn slot_bytes(magic: u32, word: u32, now: u64) -> [u8; SLOT_BYTES as usize] {
    let mut b = [0u8; SLOT_BYTES as usize];
    b[..4].copy_from_slice(&magic.to_le_bytes());
    b[4..8].copy_from_slice(&word.to_le_bytes());
    b[8..].copy_from_slice(&now.to_le_bytes());
    b
}

/// A slot's (magic, word, time).
fn fields(b: &[u8]) -> Option<(u32, u32, u64)> {
    Some((
        u32::from_le_bytes(b.get(0..4)?.try_into().ok()?),
        u32::from_le_bytes(b.get(4..8)?.try_into().ok()?),
        u64::from_le_bytes(b.get(8..16)?.try_into().ok()?),
    ))
}

/// Slot bytes `b` (and its `detail`, where read) as a claim that counts
/// at `now`: the magic, a percent of 1-100, written within [`FRESH_NS`]
/// (and not from the future). Its detail counts where it is one, written
/// at the same time or, read between its owner's writes, a tick later
/// ([`Claim::from_word`]); otherwise (an older writer, or a detail left
/// by an earlier owner, older than the slot) the slot is a plain limit.
/// Its room counts likewise, where it is at most 100: read torn, the
/// room of a 10 % loop once went for a tick, and the rest took its 80 %
/// back for that long (a shortfall of 0.3 s).
fn slot_claim(b: &[u8], detail: Option<&[u8]>, room: Option<&[u8]>, now: u64) -> Option<Claim> {
    let (magic, percent, at) = fields(b)?;
    let fresh = at <= now.saturating_add(AHEAD_NS) && now.saturating_sub(at) <= FRESH_NS;
    if magic != MAGIC || !fresh || !(1..=100).contains(&percent) {
        return None;
    }
    // (Its owner writes them just before the slot: one read between the
    // writes finds them a tick newer than the slot. An earlier owner's
    // are older.)
    let same_tick = |t: u64| t >= at && t - at <= FRESH_NS;
    let claim = match detail.and_then(fields) {
        Some((DETAIL_MAGIC, word, t)) if same_tick(t) => Claim::from_word(word)?,
        _ => Claim::limit(percent, false),
    };
    Some(match room.and_then(fields) {
        Some((ROOM_MAGIC, r, t)) if same_tick(t) && r <= 100 => claim.with_room(r),
        _ => claim,
    })
}

/// The period (ms) a slot's owner asks for, and whether its turns keep
/// their own ([`KEEPS_PERIOD`]): its word where it was written at the
/// slot's time or later, read between its owner's writes (as a room is),
/// and asks at most [`MAX_PERIOD_MS`]; None otherwise (an older writer,
/// an earlier owner's word, a forged one), which the reader takes as a
/// container that keeps its period.
fn asked_period(period: Option<&[u8]>, slot: &[u8]) -> Option<(u32, bool)> {
    let (Some((_, _, at)), Some((PERIOD_MAGIC, word, t))) = (fields(slot), period.and_then(fields))
    else {
        return None;
    };
    let ms = word & !KEEPS_PERIOD;
    let same_tick = t >= at && t - at <= FRESH_NS;
    (same_tick && ms <= MAX_PERIOD_MS).then_some((ms, word & KEEPS_PERIOD != 0))
}

fn read_up_to(file: &File, buf: &mut [u8]) -> usize {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    got
}

fn lock_of(i: usize) -> libc::flock {
    libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: LOCK_BASE + i as i64,
        l_len: 1,
        // (An OFD lock needs 0 here.)
        l_pid: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: [u8; 16] = [7; 16];
    const NOW: u64 = 50_000_000_000;

    /// Three containers' boards of one GPU in `dir`: a publishes 30 %, b
    /// 60 %, c nothing.
    fn three(dir: &Path) -> (SmBoard, SmBoard, SmBoard) {
        let mut a = SmBoard::open(dir, &GPU).unwrap();
        let mut b = SmBoard::open(dir, &GPU).unwrap();
        let c = SmBoard::open(dir, &GPU).unwrap();
        a.publish(lim(30), NOW).unwrap();
        b.publish(lim(60), NOW).unwrap();
        (a, b, c)
    }

    fn lim(percent: u32) -> Claim {
        Claim::limit(percent, false)
    }

    /// Limits only: their sum, and how many.
    fn seen(percent: u32, count: u32) -> Others {
        Others {
            percent,
            count,
            limits: percent,
            rooms: percent,
            shares: percent,
            ..Others::default()
        }
    }

    #[test]
    fn each_container_sees_the_others_live_and_fresh_limits_only() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = three(dir.path());
        assert_eq!(a.others(NOW), seen(60, 1));
        // (a holds the slot below b's.)
        let below = Others {
            below: 1,
            shares_below: 30,
            ..seen(30, 1)
        };
        assert_eq!(b.others(NOW), below);
        assert_eq!(c.others(NOW), seen(90, 2));
        // Stale: not written for longer than FRESH_NS.
        assert_eq!(c.others(NOW + FRESH_NS + 1), Others::default());
        // Gone: its descriptor closed (its process died), its lock with it.
        drop(b);
        assert_eq!(c.others(NOW), seen(30, 1));
        // Another GPU's board is another file.
        let other = SmBoard::open(dir.path(), &[8; 16]).unwrap();
        assert_eq!(other.others(NOW), Others::default());
        // Made 0666 whatever the umask, for containers of other users.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(c.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o666);
        // Swapped under its users (its directory may be 0777): they see it.
        assert!(c.intact());
        std::fs::rename(c.path(), dir.path().join("moved")).unwrap();
        assert!(!c.intact());
    }

    #[test]
    fn written_wrong_cut_short_or_full_counts_as_nothing_and_never_fails_the_reader() {
        let dir = tempfile::tempdir().unwrap();
        let (a, mut b, c) = three(dir.path());
        let raw = std::fs::OpenOptions::new()
            .write(true)
            .open(a.path())
            .unwrap();
        // b's slot (1): a percent over 100, then a time from the future.
        let bad = |percent: u32, at: u64| {
            let mut s = [0u8; 16];
            s[..4].copy_from_slice(b"VGSM");
            s[4..8].copy_from_slice(&percent.to_le_bytes());
            s[8..].copy_from_slice(&at.to_le_bytes());
            s
        };
        raw.write_all_at(&bad(250, NOW), 16).unwrap();
        assert_eq!(c.others(NOW), seen(30, 1));
        raw.write_all_at(&bad(60, NOW + 10 * AHEAD_NS), 16).unwrap();
        assert_eq!(c.others(NOW), seen(30, 1));
        raw.write_all_at(&[0xff; 16], 16).unwrap();
        assert_eq!(c.others(NOW), seen(30, 1));
        // Its owner writes it again at its next period.
        b.publish(lim(60), NOW).unwrap();
        assert_eq!(c.others(NOW), seen(90, 2));
        // Cut short: nothing counts, nothing fails; republished, it counts.
        raw.set_len(0).unwrap();
        assert_eq!(c.others(NOW), Others::default());
        b.publish(lim(60), NOW).unwrap();
        assert_eq!(c.others(NOW).count, 1);
        // Every slot held by others: this one cannot publish, and says so.
        let mut held = Vec::new();
        for _ in 0..SLOTS {
            let mut h = SmBoard::open(dir.path(), &GPU).unwrap();
            if h.publish(lim(10), NOW).is_ok() {
                held.push(h);
            }
        }
        let mut late = SmBoard::open(dir.path(), &GPU).unwrap();
        let e = late.publish(lim(10), NOW).unwrap_err();
        assert!(e.to_string().contains("slots"), "{e}");
    }

    #[test]
    fn turns_asked_and_rests_are_told_apart_from_limits() {
        let dir = tempfile::tempdir().unwrap();
        let (mut a, b, mut c) = three(dir.path());
        // a asks for turns at 30 %: it counts as the whole GPU, its limit
        // as 30.
        a.publish(Claim::limit(30, true), NOW).unwrap();
        let rest = Claim::rest(60);
        c.publish(rest, NOW).unwrap();
        let want = Others {
            percent: 100 + 60,
            count: 2,
            limits: 30,
            asking: 1,
            resting: 1,
            rooms: 30,
            shares: 90,
            below: 1,
            shares_below: 30,
            period_ms: 0,
            keeping_period: 0,
        };
        assert_eq!(b.others(NOW), want);
        // A rest withdrawn is gone at once, not when it goes stale.
        c.withdraw();
        assert_eq!(b.others(NOW).resting, 0);
        c.publish(rest, NOW).unwrap();
        assert_eq!(b.others(NOW).resting, 1);
        // An unknown flag makes the slot nothing.
        let raw = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(a.path())
            .unwrap();
        raw.write_all_at(&(30u32 | 1 << 12).to_le_bytes(), DETAIL_BASE + 4)
            .unwrap();
        assert_eq!(b.others(NOW).count, 1);
        // What a reader from before the details reads of a claim that
        // asks for turns: 100, in the slot itself.
        a.publish(Claim::limit(30, true), NOW).unwrap();
        let mut plain = [0u8; 16];
        raw.read_exact_at(&mut plain, 0).unwrap();
        assert_eq!(plain[4..8], 100u32.to_le_bytes());
        assert_eq!(b.others(NOW).limits, 30);
        // A detail of another time (an earlier owner's) is not believed:
        // the slot reads as the plain 100.
        raw.write_all_at(&(NOW - 1).to_le_bytes(), DETAIL_BASE + 8)
            .unwrap();
        assert_eq!(b.others(NOW).limits, 100);
        assert_eq!(b.others(NOW).asking, 0);
        // Withdrawn twice: the second has nothing to give back.
        c.withdraw();
        c.withdraw();
        assert_eq!(b.others(NOW).count, 1);
    }

    #[test]
    fn each_reader_sees_the_shares_of_the_slots_below_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let (mut a, mut b, mut c) = three(dir.path());
        c.publish(Claim::rest(10), NOW).unwrap();
        // Slots 0, 1 and 2; a's at its own share though it asks turns.
        a.publish(Claim::limit(30, true), NOW).unwrap();
        let at = |o: Others| (o.shares, o.below, o.shares_below);
        assert_eq!(at(a.others(NOW)), (70, 0, 0));
        assert_eq!(at(b.others(NOW)), (40, 1, 30));
        assert_eq!(at(c.others(NOW)), (90, 2, 90));
        // A slot gone stale counts below no one.
        b.publish(lim(60), NOW + FRESH_NS).unwrap();
        c.publish(Claim::rest(10), NOW + FRESH_NS).unwrap();
        assert_eq!(at(c.others(NOW + FRESH_NS + 1)), (60, 1, 60));
        // One without a slot has nothing below it.
        let d = SmBoard::open(dir.path(), &GPU).unwrap();
        assert_eq!(at(d.others(NOW)).1, 0);
    }

    #[test]
    fn a_limited_claim_tells_the_room_it_needs_in_its_detail_only() {
        let dir = tempfile::tempdir().unwrap();
        let (mut a, b, mut c) = three(dir.path());
        // a: 50 %, its windows spanning 62 % of the period; c: 10 %,
        // needing 36 while paced.
        a.publish(lim(50).with_room(62), NOW).unwrap();
        c.publish(lim(10).with_room(36), NOW).unwrap();
        let o = b.others(NOW);
        assert_eq!((o.limits, o.rooms, o.percent), (60, 98, 60));
        // An older reader sees the limit alone, in the slot itself.
        let raw = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(a.path())
            .unwrap();
        let mut plain = [0u8; 16];
        raw.read_exact_at(&mut plain, 0).unwrap();
        assert_eq!(plain[4..8], 50u32.to_le_bytes());
        // What a reader of details from before rooms reads of the
        // detail: a word of its percent and known flags only (the room is
        // in its own slot, which it never reads).
        let mut detail = [0u8; 16];
        raw.read_exact_at(&mut detail, DETAIL_BASE).unwrap();
        let word = u32::from_le_bytes(detail[4..8].try_into().unwrap());
        assert_eq!(word & !(PERCENT_BITS | ASKS_TURNS | REST), 0);
        assert_eq!(word & PERCENT_BITS, 50);
        // A room under the limit is the limit; over 100 in the file, or
        // of another time, it is not believed, and the claim still
        // counts.
        a.publish(lim(50).with_room(20), NOW).unwrap();
        assert_eq!(b.others(NOW).rooms, 50 + 36);
        a.publish(lim(50).with_room(62), NOW).unwrap();
        raw.write_all_at(&200u32.to_le_bytes(), ROOM_BASE + 4)
            .unwrap();
        assert_eq!((b.others(NOW).count, b.others(NOW).rooms), (2, 50 + 36));
        raw.write_all_at(&62u32.to_le_bytes(), ROOM_BASE + 4)
            .unwrap();
        assert_eq!(b.others(NOW).rooms, 62 + 36);
        raw.write_all_at(&(NOW - 1).to_le_bytes(), ROOM_BASE + 8)
            .unwrap();
        assert_eq!(b.others(NOW).rooms, 50 + 36);
        // Read between its owner's writes, a tick newer than the slot:
        // believed.
        raw.write_all_at(&(NOW + 100_000_000).to_le_bytes(), ROOM_BASE + 8)
            .unwrap();
        assert_eq!(b.others(NOW).rooms, 62 + 36);
        // A rest's room counts for nothing.
        c.publish(Claim::rest(40).with_room(90), NOW).unwrap();
        a.publish(lim(50), NOW).unwrap();
        assert_eq!(b.others(NOW).rooms, 50);
    }

    #[test]
    fn the_longest_period_asked_counts_and_a_forged_or_stale_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let (mut a, b, mut c) = three(dir.path());
        a.publish(lim(90).with_period(140, false), NOW).unwrap();
        c.publish(Claim::rest(10), NOW).unwrap();
        assert_eq!(b.others(NOW).period_ms, 140);
        c.publish(lim(10).with_period(120, false), NOW).unwrap();
        assert_eq!(b.others(NOW).period_ms, 140);
        assert_eq!(b.others(NOW).keeping_period, 0);
        // One whose period is set keeps it, and says so.
        c.publish(lim(10).with_period(0, true), NOW).unwrap();
        assert_eq!(b.others(NOW).keeping_period, 1);
        c.publish(lim(10).with_period(120, false), NOW).unwrap();
        // An older reader reads three slots' worth of the file: the
        // asked periods lie past them.
        assert!(PERIOD_BASE >= 3 * SLOTS as u64 * SLOT_BYTES);
        let raw = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(a.path())
            .unwrap();
        // Over the most, or older than the slot (an earlier owner's): no
        // ask, and a container taken to keep its period (as one from
        // before asks, which writes no word).
        raw.write_all_at(&5000u32.to_le_bytes(), PERIOD_BASE + 4)
            .unwrap();
        let o = b.others(NOW);
        assert_eq!((o.count, o.period_ms, o.keeping_period), (2, 120, 1));
        raw.write_all_at(&140u32.to_le_bytes(), PERIOD_BASE + 4)
            .unwrap();
        raw.write_all_at(&(NOW - 1).to_le_bytes(), PERIOD_BASE + 8)
            .unwrap();
        let o = b.others(NOW);
        assert_eq!((o.period_ms, o.keeping_period), (120, 1));
        raw.write_all_at(&[0u8; 16], PERIOD_BASE).unwrap();
        assert_eq!(b.others(NOW).keeping_period, 1);
        // Withdrawn, a slot's period goes with it.
        c.withdraw();
        a.publish(lim(90), NOW).unwrap();
        assert_eq!(b.others(NOW).period_ms, 0);
    }

    #[test]
    fn a_symlinked_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        let link = dir.path().join("vgpulock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(SmBoard::open(&link, &GPU).is_err());
        assert!(!target.join(file_name(&GPU)).exists());
    }
}

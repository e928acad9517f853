//! A board entry: its fields, private to this module, read and written
//! through its methods only (the cards it holds, its state and the time
//! spent in each, what it waits for, its host memory and counters), so
//! that every access to the shared file goes through one place.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::procinfo::monotonic_ns;

/// Cards one process is tracked on.
pub const BOARD_CARDS: usize = 4;

/// What a process is doing, as the board shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ProcState {
    /// Not claimed.
    Free = 0,
    /// Its memory is on the card.
    Running = 1,
    /// Its memory is moving to the host.
    Suspending = 2,
    /// Its memory is on the host.
    Suspended = 3,
    /// Its memory is moving back (or waiting for room to).
    Restoring = 4,
    /// A checkpoint or restore failed for good: its CUDA calls fail.
    Failed = 5,
}

impl ProcState {
    fn from_u32(v: u32) -> ProcState {
        match v {
            1 => ProcState::Running,
            2 => ProcState::Suspending,
            3 => ProcState::Suspended,
            4 => ProcState::Restoring,
            5 => ProcState::Failed,
            _ => ProcState::Free,
        }
    }

    /// The word `vgpuctl` prints.
    pub fn name(self) -> &'static str {
        match self {
            ProcState::Free => "free",
            ProcState::Running => "running",
            ProcState::Suspending => "suspending",
            ProcState::Suspended => "suspended",
            ProcState::Restoring => "restoring",
            ProcState::Failed => "failed",
        }
    }
}

/// One process's entry. Times are `CLOCK_MONOTONIC` nanoseconds (one
/// clock for the whole node).
#[repr(C)]
pub struct BoardEntry {
    /// The owner's pid in its own namespace (for people to read).
    pid: AtomicU32,
    /// [`ProcState`].
    state: AtomicU32,
    /// UUIDs of the cards it uses (two words each; zero: none).
    cards: [[AtomicU64; 2]; BOARD_CARDS],
    /// Bytes it holds on each of those cards while running.
    device_bytes: [AtomicU64; BOARD_CARDS],
    /// Bytes of its device state on the host (reserved while suspending).
    host_bytes: AtomicU64,
    /// Bytes it waits for (an allocation or its own restore); 0: none.
    want_bytes: AtomicU64,
    /// The card it waits on.
    want_card: [AtomicU64; 2],
    /// Its last CUDA activity (launch, allocation, copy, synchronisation).
    last_active_ns: AtomicU64,
    /// When the current state began.
    since_ns: AtomicU64,
    /// Time spent suspended and restoring, over its life.
    suspended_total_ns: AtomicU64,
    /// Time spent restoring (waiting for room included).
    restoring_total_ns: AtomicU64,
    /// Suspensions and restores so far.
    suspensions: AtomicU64,
    /// Restores so far.
    restores: AtomicU64,
    /// When its current wait began (its place in the line for turns,
    /// first come first served); 0 while it waits for nothing. Kept by
    /// the want's setters.
    want_since_ns: AtomicU64,
    /// Its `CUDA_TASK_PRIORITY` (0 high, 1 normal; read as at most 1).
    priority: AtomicU32,
    /// Its `VGPU_OVERSUBSCRIBE_QUANTUM_MS` while it can give a turn; 0
    /// while it cannot (none set, or the host memory bound would refuse
    /// its suspension).
    quantum_ms: AtomicU32,
    /// When its current turn on the card began (start, restore, or an
    /// allocation granted after waiting).
    turn_since_ns: AtomicU64,
    /// Turns it was given: the card back after waiting for its turn.
    turns_taken: AtomicU64,
    /// Once `free_seen_ns`: kept zero, so that a reader of layout 2 from
    /// before issue 26, which took a free-memory figure in the four words
    /// above when its time here was set, finds none.
    zero: [AtomicU64; BOARD_CARDS],
    /// Turns it gave: suspended while busy, at a quantum's end.
    turns_given: AtomicU64,
}

// Where layout 2 had `free_seen_ns`, before issue 26 read: zero.
const _: () = assert!(std::mem::offset_of!(BoardEntry, zero) == 216);

fn uuid_words(uuid: &[u8; 16]) -> [u64; 2] {
    let (a, b) = uuid.split_at(8);
    [
        u64::from_le_bytes(a.try_into().expect("8 bytes")),
        u64::from_le_bytes(b.try_into().expect("8 bytes")),
    ]
}

fn words_uuid(w: [u64; 2]) -> [u8; 16] {
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&w[0].to_le_bytes());
    u[8..].copy_from_slice(&w[1].to_le_bytes());
    u
}

impl BoardEntry {
    /// The owner's pid in its own namespace (for people to read).
    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::Acquire)
    }

    /// Bytes of its device state on the host.
    pub fn host_bytes(&self) -> u64 {
        self.host_bytes.load(Ordering::SeqCst)
    }

    /// Adds `bytes` to its host memory (a reservation for a suspension).
    pub fn add_host_bytes(&self, bytes: u64) {
        self.host_bytes.fetch_add(bytes, Ordering::SeqCst);
    }

    /// Takes `bytes` off its host memory (a restore, or a suspension
    /// undone).
    pub fn release_host_bytes(&self, bytes: u64) {
        self.host_bytes.fetch_sub(bytes, Ordering::SeqCst);
    }

    /// Its last CUDA activity.
    pub fn last_active_ns(&self) -> u64 {
        self.last_active_ns.load(Ordering::Acquire)
    }

    /// Records CUDA activity at `now`.
    pub fn set_last_active_ns(&self, now: u64) {
        self.last_active_ns.store(now, Ordering::Release);
    }

    /// Suspensions so far.
    pub fn suspensions(&self) -> u64 {
        self.suspensions.load(Ordering::Relaxed)
    }

    /// Counts a suspension.
    pub fn count_suspension(&self) {
        self.suspensions.fetch_add(1, Ordering::Relaxed);
    }

    /// Restores so far.
    pub fn restores(&self) -> u64 {
        self.restores.load(Ordering::Relaxed)
    }

    /// Counts a restore.
    pub fn count_restore(&self) {
        self.restores.fetch_add(1, Ordering::Relaxed);
    }

    /// The cards it uses and its bytes on each.
    pub fn cards(&self) -> Vec<([u8; 16], u64)> {
        (0..BOARD_CARDS)
            .filter_map(|i| {
                let w = [
                    self.cards[i][0].load(Ordering::Acquire),
                    self.cards[i][1].load(Ordering::Acquire),
                ];
                (w != [0, 0]).then(|| (words_uuid(w), self.device_bytes[i].load(Ordering::Acquire)))
            })
            .collect()
    }

    /// Its bytes on `card` (0 if it does not use it).
    pub fn bytes_on(&self, card: &[u8; 16]) -> u64 {
        self.cards()
            .into_iter()
            .find(|(u, _)| u == card)
            .map_or(0, |(_, b)| b)
    }

    /// What it holds on `card`: its bytes there less what it still waits
    /// for there (a waiting allocation's bytes are published before they
    /// are granted). The want names one card, the first waiter's: a
    /// process waiting on two cards at once reads as holding less on the
    /// first (the strict side: a waiter counts less on its turns). Its
    /// context is not in its bytes either.
    pub fn held_on(&self, card: &[u8; 16]) -> u64 {
        let waiting = self
            .wants()
            .filter(|(c, _)| c == card)
            .map_or(0, |(_, b)| b);
        self.bytes_on(card).saturating_sub(waiting)
    }

    /// Records `bytes` on `card` (taking a free card place the first time).
    pub fn set_bytes_on(&self, card: &[u8; 16], bytes: u64) {
        let w = uuid_words(card);
        for i in 0..BOARD_CARDS {
            let cur = [
                self.cards[i][0].load(Ordering::Acquire),
                self.cards[i][1].load(Ordering::Acquire),
            ];
            if cur == w || cur == [0, 0] {
                self.cards[i][0].store(w[0], Ordering::Release);
                self.cards[i][1].store(w[1], Ordering::Release);
                self.device_bytes[i].store(bytes, Ordering::Release);
                return;
            }
        }
    }

    /// Its state.
    pub fn state(&self) -> ProcState {
        ProcState::from_u32(self.state.load(Ordering::Acquire))
    }

    /// Time spent suspended (restoring included) up to `now`, the current
    /// spell counted: it grows smoothly, as a counter should.
    pub fn suspended_ns_at(&self, now: u64) -> u64 {
        let total = self.suspended_total_ns.load(Ordering::Relaxed);
        match self.state() {
            ProcState::Suspended | ProcState::Restoring => total + self.in_state_ns(now),
            _ => total,
        }
    }

    /// Time spent restoring (waiting for room included) up to `now`, the
    /// current spell counted.
    pub fn restoring_ns_at(&self, now: u64) -> u64 {
        let total = self.restoring_total_ns.load(Ordering::Relaxed);
        match self.state() {
            ProcState::Restoring => total + self.in_state_ns(now),
            _ => total,
        }
    }

    /// Time in the current state at `now`.
    pub fn in_state_ns(&self, now: u64) -> u64 {
        now.saturating_sub(self.since_ns.load(Ordering::Acquire))
    }

    /// Enters `state` at `now` (adding the time spent suspended).
    pub fn set_state(&self, state: ProcState, now: u64) {
        let since = self.since_ns.swap(now, Ordering::AcqRel);
        let was = self.state();
        if matches!(was, ProcState::Suspended | ProcState::Restoring) {
            self.suspended_total_ns
                .fetch_add(now.saturating_sub(since), Ordering::Relaxed);
        }
        if was == ProcState::Restoring {
            self.restoring_total_ns
                .fetch_add(now.saturating_sub(since), Ordering::Relaxed);
        }
        self.state.store(state as u32, Ordering::Release);
    }

    /// What it waits for: (card, bytes), if anything.
    pub fn wants(&self) -> Option<([u8; 16], u64)> {
        let b = self.want_bytes.load(Ordering::Acquire);
        (b != 0).then(|| {
            (
                words_uuid([
                    self.want_card[0].load(Ordering::Acquire),
                    self.want_card[1].load(Ordering::Acquire),
                ]),
                b,
            )
        })
    }

    /// Publishes that it waits for `bytes` on `card` (0: no longer).
    pub fn set_want(&self, card: &[u8; 16], bytes: u64) {
        let w = uuid_words(card);
        self.want_card[0].store(w[0], Ordering::Release);
        self.want_card[1].store(w[1], Ordering::Release);
        self.want_bytes.store(bytes, Ordering::Release);
        self.mark_since(bytes);
    }

    /// Keeps `want_since_ns`: set when a wait begins, zero when none.
    fn mark_since(&self, bytes_now: u64) {
        if bytes_now == 0 {
            self.want_since_ns.store(0, Ordering::Release);
        } else if self.want_since_ns.load(Ordering::Acquire) == 0 {
            self.want_since_ns.store(monotonic_ns(), Ordering::Release);
        }
    }

    /// Adds `bytes` to what it waits for, on `card` (allocations of
    /// several threads may wait at once; the card published is the first
    /// one's).
    pub fn add_want(&self, card: &[u8; 16], bytes: u64) {
        if self.want_bytes.load(Ordering::Acquire) == 0 {
            let w = uuid_words(card);
            self.want_card[0].store(w[0], Ordering::Release);
            self.want_card[1].store(w[1], Ordering::Release);
        }
        let now = self.want_bytes.fetch_add(bytes, Ordering::AcqRel);
        self.mark_since(now.saturating_add(bytes));
    }

    /// Takes `bytes` off what it waits for.
    pub fn take_want(&self, bytes: u64) {
        let was = self
            .want_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                Some(b.saturating_sub(bytes))
            })
            .unwrap_or(0);
        self.mark_since(was.saturating_sub(bytes));
    }

    /// Its priority as read (0 high; anything else normal, 1).
    pub fn priority(&self) -> u32 {
        self.priority.load(Ordering::Acquire).min(1)
    }

    /// Publishes its priority (0 high, 1 normal).
    pub fn set_priority(&self, priority: u32) {
        self.priority.store(priority, Ordering::Release);
    }

    /// When its current wait began (0: it waits for nothing).
    pub fn want_since_ns(&self) -> u64 {
        self.want_since_ns.load(Ordering::Acquire)
    }

    /// Its quantum while it can give a turn (0: it cannot).
    pub fn quantum_ms(&self) -> u32 {
        self.quantum_ms.load(Ordering::Acquire)
    }

    /// Publishes its quantum (0: it cannot give a turn now).
    pub fn set_quantum_ms(&self, ms: u32) {
        self.quantum_ms.store(ms, Ordering::Release);
    }

    /// When its current turn on the card began.
    pub fn turn_since_ns(&self) -> u64 {
        self.turn_since_ns.load(Ordering::Acquire)
    }

    /// A turn on the card begins now (`now`).
    pub fn set_turn_since(&self, now: u64) {
        self.turn_since_ns.store(now, Ordering::Release);
    }

    /// Turns it was given.
    pub fn turns_taken(&self) -> u64 {
        self.turns_taken.load(Ordering::Relaxed)
    }

    /// Turns it gave.
    pub fn turns_given(&self) -> u64 {
        self.turns_given.load(Ordering::Relaxed)
    }

    /// It got the card back after waiting for its turn.
    pub fn count_turn_taken(&self) {
        self.turns_taken.fetch_add(1, Ordering::Relaxed);
    }

    /// It gave the card up at its quantum's end.
    pub fn count_turn_given(&self) {
        self.turns_given.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn clear(&self, pid: u32, now: u64) {
        for c in &self.cards {
            c[0].store(0, Ordering::Relaxed);
            c[1].store(0, Ordering::Relaxed);
        }
        for b in [
            &self.host_bytes,
            &self.want_bytes,
            &self.want_card[0],
            &self.want_card[1],
            &self.suspended_total_ns,
            &self.restoring_total_ns,
            &self.suspensions,
            &self.restores,
            &self.want_since_ns,
            &self.turn_since_ns,
            &self.turns_taken,
            &self.turns_given,
        ] {
            b.store(0, Ordering::Relaxed);
        }
        for b in self.device_bytes.iter().chain(&self.zero) {
            b.store(0, Ordering::Relaxed);
        }
        self.priority.store(1, Ordering::Relaxed);
        self.quantum_ms.store(0, Ordering::Relaxed);
        self.turn_since_ns.store(now, Ordering::Relaxed);
        self.last_active_ns.store(now, Ordering::Relaxed);
        self.since_ns.store(now, Ordering::Relaxed);
        self.pid.store(pid, Ordering::Relaxed);
        self.state
            .store(ProcState::Running as u32, Ordering::Release);
    }
}

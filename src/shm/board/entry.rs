//! A board entry's fields, read and written through their atomics: the
//! cards it holds, its state and the time spent in each, what it waits
//! for.

use std::sync::atomic::Ordering;

use super::{BOARD_CARDS, BoardEntry, ProcState};

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
            self.want_since_ns
                .store(super::monotonic_ns(), Ordering::Release);
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

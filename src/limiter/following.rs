//! Which period a device's turns follow from the node's SM board
//! (issue 29): the longest one any busy container there asks for
//! (`period.rs` says why and who asks), held a while so that asks that
//! come and go move the windows once, and none where anyone on the board
//! keeps a period of its own (pure, but for [`Following::tick`], which
//! sets the region's period through [`choose`]).
#![forbid(unsafe_code)]

use vgpu_shm::layout::DeviceEntry;
use vgpu_shm::sm_board::Others;

use super::period::{HOLD_NS, choose, lengthened, of};

/// The longest period (ms) asked on a device, as a busy leader that asks
/// `own` reads the board (`seen`: the others there when it published its
/// claim), rounded up to 10 ms (0: none asked, or no one else is on the
/// board: a neighbour in turns off it would not follow, and one that asked
/// and left is followed no more); None where nothing may be lengthened: it
/// holds no slot on a board (none mounted, every slot held: no neighbour
/// would know), or someone there keeps a period of its own
/// (`VGPU_SM_PERIOD_MS` set, or a library from before asks). (Rounded, a
/// word raised 1 ms a tick moves the windows every 10 ms of it.)
pub fn asked_on_the_board(own: u32, seen: Option<&Others>) -> Option<u32> {
    let o = seen.filter(|o| o.keeping_period == 0)?;
    if o.count == 0 {
        return Some(0);
    }
    Some(o.period_ms.max(own).div_ceil(10).saturating_mul(10))
}

/// What a device's leader holds of the periods asked there: a longer one
/// at once; a shorter one once the one held has not been asked for
/// [`HOLD_NS`], and then the longest asked meanwhile, so that asks that
/// come and go (a neighbour busy by fits, a forged word flipped every
/// tick) move the windows once; the configured one at once where nothing
/// may be lengthened.
#[derive(Debug, Default)]
pub struct Following {
    held_ms: u32,
    until_ns: u64,
    /// The longest asked since the hold was last renewed.
    recent_ms: u32,
    /// Whether this leader has ticked yet (a new one goes on from what the
    /// last one chose).
    started: bool,
}

impl Following {
    /// At each tick of the leader of a busy container: what it reads of
    /// the periods asked on the device ([`asked_on_the_board`]). Sets the
    /// period of the container's turns on `entry` ([`choose`]).
    pub fn tick(&mut self, entry: &DeviceEntry, asked: Option<u32>, now: u64) {
        if !std::mem::replace(&mut self.started, true) && lengthened(entry) {
            self.held_ms = u32::try_from(of(entry) / 1_000_000).unwrap_or(0);
            self.until_ns = now.saturating_add(HOLD_NS);
        }
        match asked {
            None => (self.held_ms, self.recent_ms) = (0, 0),
            Some(ms) if ms >= self.held_ms => {
                (self.held_ms, self.recent_ms) = (ms, 0);
                self.until_ns = now.saturating_add(HOLD_NS);
            }
            Some(ms) => {
                self.recent_ms = self.recent_ms.max(ms);
                if now >= self.until_ns {
                    (self.held_ms, self.recent_ms) = (self.recent_ms, 0);
                    self.until_ns = now.saturating_add(HOLD_NS);
                }
            }
        }
        choose(entry, self.held_ms, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::turns;

    const MS: u64 = 1_000_000;
    const P: u64 = turns::PERIOD_NS;

    #[test]
    fn an_ask_counts_where_it_was_published_and_everyone_there_follows() {
        let seen = |count, period_ms, keeping_period| Others {
            count,
            period_ms,
            keeping_period,
            ..Others::default()
        };
        assert_eq!(asked_on_the_board(140, Some(&seen(1, 0, 0))), Some(140));
        assert_eq!(asked_on_the_board(0, Some(&seen(1, 150, 0))), Some(150));
        assert_eq!(asked_on_the_board(140, Some(&seen(1, 150, 0))), Some(150));
        assert_eq!(asked_on_the_board(0, Some(&seen(1, 0, 0))), Some(0));
        // Read in 10 ms steps.
        assert_eq!(asked_on_the_board(0, Some(&seen(1, 141, 0))), Some(150));
        // Alone on the board: its own ask counts for nothing.
        assert_eq!(asked_on_the_board(140, Some(&seen(0, 0, 0))), Some(0));
        // No board, or no slot on it; a neighbour that keeps its period
        // (set, or from before asks): nothing may be lengthened.
        assert_eq!(asked_on_the_board(140, None), None);
        assert_eq!(asked_on_the_board(140, Some(&seen(2, 150, 1))), None);
    }

    #[test]
    fn a_longer_period_is_followed_at_once_and_a_shorter_after_a_hold() {
        let (r, i) = crate::limiter::bucket::tests::entry(10);
        let e = r.device(i);
        let mut f = Following::default();
        let s = 1_000_000_000_000u64;
        f.tick(e, Some(140), s);
        assert_eq!(of(e), 140 * MS);
        // A word flipped every tick: the longer holds.
        for k in 1..20 {
            let asked = if k % 2 == 0 { 140 } else { 0 };
            f.tick(e, Some(asked), s + k * 100 * MS);
            assert_eq!(of(e), 140 * MS, "tick {k}");
        }
        let t = s + 2_000 * MS;
        f.tick(e, Some(150), t);
        assert_eq!(of(e), 150 * MS);
        // Asked 140 but for one tick of 0 as the hold ends: 140, once.
        for k in 1..30 {
            f.tick(e, Some(140), t + k * 100 * MS);
        }
        assert_eq!(of(e), 150 * MS);
        f.tick(e, Some(0), t + HOLD_NS);
        assert_eq!(of(e), 140 * MS);
        // Not asked for a whole hold: back to the configured period.
        let u = t + HOLD_NS + 100 * MS;
        f.tick(e, Some(0), u);
        f.tick(e, Some(0), u + HOLD_NS / 2);
        assert_eq!(of(e), 140 * MS);
        f.tick(e, Some(0), u + HOLD_NS);
        assert_eq!(of(e), P);
        // Nothing may be lengthened (a neighbour that keeps its period
        // came, or the board went): at once.
        f.tick(e, Some(150), u + 2 * HOLD_NS);
        assert_eq!(of(e), 150 * MS);
        f.tick(e, None, u + 2 * HOLD_NS + 100 * MS);
        assert_eq!(of(e), P);
    }

    #[test]
    fn a_new_leader_goes_on_from_the_period_the_last_one_chose() {
        let (r, i) = crate::limiter::bucket::tests::entry(10);
        let e = r.device(i);
        let s = 1_000_000_000_000u64;
        Following::default().tick(e, Some(140), s);
        // The next leader reads no ask on its first ticks (its claim is
        // not on the board yet): the period holds.
        let mut next = Following::default();
        next.tick(e, Some(0), s + 100 * MS);
        next.tick(e, Some(0), s + 200 * MS);
        assert_eq!(of(e), 140 * MS);
        next.tick(e, Some(0), s + 100 * MS + HOLD_NS);
        assert_eq!(of(e), P);
    }
}

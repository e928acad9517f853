//! What was counted for each live allocation, so that a free releases
//! exactly that, a free of something we never saw passes through untouched,
//! and destroying a context releases everything it held.

use std::sync::atomic::{AtomicU64, Ordering};

use vgpu_shm::{EntryIndex, Kind};

use crate::lock::{Listed, Lock, Map, Name, map};
use crate::process;

/// An allocation's identity: device pointers, VMM handles and array
/// handles live in different name spaces.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Key {
    Ptr(u64),
    Vmm(u64),
    Array(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracked {
    pub dev: EntryIndex,
    pub kind: Kind,
    pub bytes: u64,
    /// The context current when it was made (0 if none).
    pub ctx: usize,
}

const SHARDS: usize = 16;

/// A part of the table; in a forked child, empty (its device memory is
/// not the parent's).
type Shard = Lock<Map<Key, Tracked>>;

static TABLE: [Shard; SHARDS] = [const { Lock::new(map(), |m| m.clear()) }; SHARDS];

/// The table's locks, for the fork handlers (`fork.rs`): `tracker.0`
/// to `tracker.15`.
pub fn locks() -> [Listed; SHARDS] {
    std::array::from_fn(|i| (Name::at("tracker", i), &TABLE[i] as _))
}

fn shard(key: &Key) -> &'static Shard {
    let bits = match *key {
        Key::Ptr(p) | Key::Vmm(p) => p,
        Key::Array(a) => a as u64,
    };
    // Allocations are at least 512-byte aligned: mix in higher bits.
    &TABLE[((bits >> 9) ^ (bits >> 21)) as usize % SHARDS]
}

pub fn insert(key: Key, t: Tracked) {
    shard(&key).lock().insert(key, t);
}

pub fn remove(key: Key) -> Option<Tracked> {
    shard(&key).lock().remove(&key)
}

/// Bytes held in context `ctx`, per device entry.
pub fn context_bytes(ctx: usize) -> Vec<(EntryIndex, u64)> {
    let mut per_dev: Vec<(EntryIndex, u64)> = Vec::new();
    for s in TABLE.iter() {
        for t in s.lock().values().filter(|t| t.ctx == ctx) {
            match per_dev.iter_mut().find(|(d, _)| *d == t.dev) {
                Some((_, b)) => *b += t.bytes,
                None => per_dev.push((t.dev, t.bytes)),
            }
        }
    }
    per_dev
}

/// An allocation of `bytes` was reserved and goes to the driver: counted
/// in the slot, not in the table yet.
pub fn flight_started(dev: EntryIndex, kind: Kind, bytes: u64) {
    in_flight(dev, kind).fetch_add(bytes, Ordering::AcqRel);
}

/// It came back: [`insert`]ed first when it succeeded, so that
/// [`totals`] never misses it.
pub fn flight_ended(dev: EntryIndex, kind: Kind, bytes: u64) {
    let _ = in_flight(dev, kind).fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
        Some(v.saturating_sub(bytes))
    });
}

fn in_flight(dev: EntryIndex, kind: Kind) -> &'static AtomicU64 {
    &process::device(dev).quota.in_flight[kind as usize]
}

/// Bytes this process's slot must count when it is filled again (a new
/// slot, a private copy): allocations in flight, read first, then every
/// live allocation. One ending meanwhile may be counted twice, never not.
pub fn totals() -> Vec<(EntryIndex, Kind, u64)> {
    let mut out: Vec<(EntryIndex, Kind, u64)> = Vec::new();
    let mut add = |dev: EntryIndex, kind: Kind, bytes: u64| match out
        .iter_mut()
        .find(|(d, k, _)| *d == dev && *k == kind)
    {
        Some((_, _, b)) => *b += bytes,
        None => out.push((dev, kind, bytes)),
    };
    for dev in EntryIndex::all() {
        for kind in Kind::ALL {
            match in_flight(dev, kind).load(Ordering::Acquire) {
                0 => {}
                b => add(dev, kind, b),
            }
        }
    }
    for s in TABLE.iter() {
        for t in s.lock().values() {
            add(t.dev, t.kind, t.bytes);
        }
    }
    out
}

/// Removes and returns everything made in context `ctx`.
pub fn drain_context(ctx: usize) -> Vec<Tracked> {
    let mut out = Vec::new();
    for s in TABLE.iter() {
        s.lock().retain(|_, t| {
            if t.ctx == ctx {
                out.push(*t);
                false
            } else {
                true
            }
        });
    }
    out
}

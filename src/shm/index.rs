//! Typed indices into a region: a device entry and a process slot are
//! different numbers, and neither is a CUDA ordinal or an NVML index.
//! Each is checked once, when it is made, so every access through it is
//! in range.
#![forbid(unsafe_code)]

use std::fmt;

use crate::layout::{MAX_DEVICES, MAX_SLOTS};

/// The index of a device entry in the region's device table: one per
/// physical GPU, keyed by UUID (below [`MAX_DEVICES`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryIndex(u8);

impl EntryIndex {
    /// Entry `i`, if the table has one.
    pub const fn new(i: usize) -> Option<EntryIndex> {
        if i < MAX_DEVICES {
            Some(EntryIndex(i as u8))
        } else {
            None
        }
    }

    /// The index as a number (below [`MAX_DEVICES`]).
    pub const fn get(self) -> usize {
        self.0 as usize
    }

    /// Every entry of the table, in order.
    pub fn all() -> impl Iterator<Item = EntryIndex> {
        (0..MAX_DEVICES as u8).map(EntryIndex)
    }
}

impl fmt::Display for EntryIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The index of a process slot (below [`MAX_SLOTS`]). Slots never move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotIndex(u16);

impl SlotIndex {
    /// Slot `i`, if the region has one.
    pub const fn new(i: usize) -> Option<SlotIndex> {
        if i < MAX_SLOTS {
            Some(SlotIndex(i as u16))
        } else {
            None
        }
    }

    /// The index as a number (below [`MAX_SLOTS`]).
    pub const fn get(self) -> usize {
        self.0 as usize
    }

    /// The first `n` slots (at most [`MAX_SLOTS`]), in order.
    pub fn first(n: usize) -> impl Iterator<Item = SlotIndex> {
        (0..n.min(MAX_SLOTS) as u16).map(SlotIndex)
    }
}

impl fmt::Display for SlotIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

const _: () = assert!(MAX_DEVICES <= u8::MAX as usize && MAX_SLOTS <= u16::MAX as usize);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_checked_once_when_made() {
        assert_eq!(
            EntryIndex::new(MAX_DEVICES - 1).map(EntryIndex::get),
            Some(MAX_DEVICES - 1)
        );
        assert_eq!(EntryIndex::new(MAX_DEVICES), None);
        assert_eq!(SlotIndex::new(MAX_SLOTS), None);
        assert_eq!(EntryIndex::all().count(), MAX_DEVICES);
        assert_eq!(SlotIndex::first(usize::MAX).count(), MAX_SLOTS);
        assert_eq!(SlotIndex::first(3).last(), SlotIndex::new(2));
    }
}

//! An allocation in flight. [`Charge::take`] reserves its bytes before the
//! driver sees the call; [`Charge::keep`] records what the driver made.
//! Dropped without being kept (the driver refused, the hook returned early,
//! a panic), a charge refunds itself: no path can forget to.
#![forbid(unsafe_code)]

use vgpu_shm::{EntryIndex, Kind, SlotIndex};

use super::overhead::{self, InDriver};
use super::tracker::{self, Key, Tracked};
use super::{grant, release};
use crate::attach::Attach;
use crate::cuda::sys::CUresult;

/// Bytes reserved for an allocation the driver is making.
pub struct Charge {
    attach: &'static Attach,
    slot: SlotIndex,
    dev: EntryIndex,
    kind: Kind,
    /// Counted in the slot now.
    bytes: u64,
    /// What `tracker::flight_started` was told.
    in_flight: u64,
    kept: bool,
    /// Ends after the refund or the record (fields drop after `drop`).
    _in_driver: InDriver,
}

impl Charge {
    /// Reserves `bytes` of `kind` on the device `device` names (asked once
    /// this process's slot is known). `Ok(None)` when nothing is enforced
    /// there (no attachment, no region, no context: the driver will
    /// answer); Err is the code to return instead of calling the driver.
    pub fn take(
        attach: Option<&'static Attach>,
        kind: Kind,
        bytes: u64,
        device: impl FnOnce(&Attach) -> Option<EntryIndex>,
    ) -> Result<Option<Charge>, CUresult> {
        let Some(attach) = attach else {
            return Ok(None);
        };
        let slot = grant::counted_slot(attach)?;
        let Some(dev) = device(attach) else {
            return Ok(None);
        };
        grant::reserve(attach, slot, dev, kind, bytes)?;
        tracker::flight_started(dev, kind, bytes);
        Ok(Some(Charge {
            attach,
            slot,
            dev,
            kind,
            bytes,
            in_flight: bytes,
            kept: false,
            _in_driver: overhead::in_driver(dev),
        }))
    }

    /// The attachment it is counted in.
    pub fn attach(&self) -> &'static Attach {
        self.attach
    }

    /// The UUID of the card it is on.
    pub fn card(&self) -> [u8; 16] {
        self.attach.region.device(self.dev).uuid()
    }

    /// The allocation came out `actual` bytes (the driver pads a pitched
    /// allocation's rows): the charge becomes that. Err when the extra is
    /// refused; the charge still holds what it held.
    pub fn settle(&mut self, actual: u64) -> Result<(), CUresult> {
        if !self.attach.intact() {
            // Counted in the private copy from here on, at the estimate.
            return Ok(());
        }
        if actual > self.bytes {
            grant::reserve(
                self.attach,
                self.slot,
                self.dev,
                self.kind,
                actual - self.bytes,
            )?;
        } else {
            self.attach
                .region
                .unreserve(self.slot, self.dev, self.kind, self.bytes - actual);
        }
        self.bytes = actual;
        Ok(())
    }

    /// The driver made `key` in context `ctx` (0: none current): it stays
    /// counted until it is freed.
    pub fn keep(mut self, key: Key, ctx: usize) {
        let t = Tracked {
            dev: self.dev,
            kind: self.kind,
            bytes: self.bytes,
            ctx,
        };
        // The driver handed out this address again, so whatever we had
        // under it is gone (freed through a path we do not see).
        if let Some(stale) = tracker::remove(key) {
            release::release(Some(self.attach), stale);
        }
        overhead::allocated(self.dev, self.bytes);
        tracker::insert(key, t);
        tracker::flight_ended(self.dev, self.kind, self.in_flight);
        self.kept = true;
    }
}

impl Drop for Charge {
    /// Not kept: the allocation failed, the bytes go back.
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        tracker::flight_ended(self.dev, self.kind, self.in_flight);
        if self.attach.intact() {
            self.attach
                .region
                .unreserve(self.slot, self.dev, self.kind, self.bytes);
        }
    }
}

//! What a new CUDA context costs, reserved before the driver makes it: a
//! context is device memory too, and a container at its limit gets
//! `CUDA_ERROR_OUT_OF_MEMORY`, as a full card would give.
//!
//! Threads racing the first retain of a device's primary context reserve
//! it once: the driver makes one context for all of them. One thread wins
//! a ticket and reserves; the others wait (not in the driver, holding
//! nothing) for that outcome and reserve nothing; if it fails, the next
//! one tries.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use vgpu_shm::{EntryIndex, Kind, SlotIndex};

use super::{grant, overhead, release, tracker};
use crate::attach::Attach;
use crate::cuda::sys::CUresult;
use crate::process;

/// This process's primary context reservation on a device entry
/// (`DeviceQuota::primary`).
fn primary(dev: EntryIndex) -> &'static AtomicU8 {
    &process::device(dev).quota.primary
}
const NONE: u8 = 0;
const RESERVING: u8 = 1;
const RESERVED: u8 = 2;

/// Longer than a context reservation may wait for room (one second).
const TICKET_WAIT: Duration = Duration::from_secs(5);
/// How long a context reservation waits for room before it fails.
const CONTEXT_WAIT_NS: u64 = 1_000_000_000;

/// What a context being made has reserved. Dropped without being kept
/// (the driver failed), it is refunded, and a primary context's
/// reservation is open to the next racer.
pub struct ContextCharge<'a> {
    attach: &'a Attach,
    slot: SlotIndex,
    dev: EntryIndex,
    bytes: u64,
    primary: bool,
    kept: bool,
}

impl ContextCharge<'_> {
    /// The driver made the context: the reservation stands until it is
    /// measured (`overhead`).
    pub fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for ContextCharge<'_> {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        // (The creation took a while: the region file is checked again.)
        if self.attach.intact() {
            self.attach
                .region
                .unreserve(self.slot, self.dev, Kind::Context, self.bytes);
        }
        if self.primary {
            primary(self.dev).store(NONE, Ordering::Release);
        }
    }
}

/// Reserves what a new context on `dev` costs before it is made; `primary`:
/// the device's primary context. `first` runs in the thread that reserves,
/// before it does. `Ok(None)`: nothing to reserve (another thread reserved
/// this primary context).
pub fn reserve<'a>(
    attach: &'a Attach,
    dev: EntryIndex,
    primary: bool,
    first: impl FnOnce(),
) -> Result<Option<ContextCharge<'a>>, CUresult> {
    let mut ticket = if primary {
        match primary_ticket(dev) {
            Some(t) => t,
            None => return Ok(None),
        }
    } else {
        Ticket(None)
    };
    first();
    let slot = grant::counted_slot(attach)?;
    // Processes starting together hold provisional figures for their new
    // contexts until each is measured, moments later: wait that long
    // before calling the container full.
    let deadline = crate::clock::monotonic_ns() + CONTEXT_WAIT_NS;
    loop {
        let bytes = overhead::expected_context_bytes(attach, dev);
        match grant::try_reserve(attach, slot, dev, Kind::Context, bytes) {
            Ok(()) => {
                ticket.settle(true);
                return Ok(Some(ContextCharge {
                    attach,
                    slot,
                    dev,
                    bytes,
                    primary,
                    kept: false,
                }));
            }
            Err(rc) if crate::clock::monotonic_ns() >= deadline => {
                grant::count_denial(attach, dev);
                return Err(rc);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
        if !attach.intact() {
            grant::count_denial(attach, dev);
            return Err(CUresult::ERROR_OUT_OF_MEMORY);
        }
    }
}

/// This thread reserves the primary context of a device for every racer;
/// dropped unsettled (an error, a panic), it lets the next one try.
struct Ticket(Option<EntryIndex>);

impl Ticket {
    /// The reservation stands (or is given up) for the other racers.
    fn settle(&mut self, reserved: bool) {
        if let Some(dev) = self.0.take() {
            primary(dev).store(if reserved { RESERVED } else { NONE }, Ordering::Release);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.settle(false);
    }
}

/// Whether this thread must reserve the primary context of `dev`: Some for
/// the one that wins the race, None once it is reserved. Waits while
/// another thread reserves; after [`TICKET_WAIT`] it reserves on its own
/// rather than wait on.
fn primary_ticket(dev: EntryIndex) -> Option<Ticket> {
    let state = primary(dev);
    let until = Instant::now() + TICKET_WAIT;
    loop {
        match state.compare_exchange(NONE, RESERVING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(Ticket(Some(dev))),
            Err(RESERVED) => return None,
            Err(_) if Instant::now() >= until => return Some(Ticket(None)),
            Err(_) => std::thread::sleep(Duration::from_micros(200)),
        }
    }
}

/// A context of ours now lives on `dev`: its overhead is measured.
pub fn created(attach: &Attach, dev: EntryIndex) {
    overhead::context_created(attach, dev);
}

/// Context `ctx` on `dev` is gone (the driver destroyed or reset it):
/// what was made in it is released, and with the device's last context,
/// its overhead.
pub fn gone(attach: Option<&Attach>, ctx: usize, dev: EntryIndex, was_primary: bool) {
    if was_primary {
        primary(dev).store(NONE, Ordering::Release);
    }
    for t in tracker::drain_context(ctx) {
        release::release(attach, t);
    }
    if let Some(attach) = attach {
        overhead::context_destroyed(attach, dev);
    }
}

/// The bytes held in context `ctx`, per device entry: what its destruction
/// frees.
pub fn held_in(ctx: usize) -> Vec<(EntryIndex, u64)> {
    tracker::context_bytes(ctx)
}

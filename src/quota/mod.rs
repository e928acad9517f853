//! Per-process memory accounting: what this process holds on each device,
//! counted in its slot of the container's region. The CUDA hooks
//! translate driver calls into the calls below; `grant.rs` alone decides
//! whether an allocation is granted.
//!
//! - `grant`: reserve-then-check against the limit, one retry after making
//!   room, the denial report
//! - `charge`: an allocation in flight ([`Charge`]: refunded unless kept)
//! - `release`: a free in flight (the bracket around the driver's free),
//!   and what it gives back
//! - `context`: what a new context costs, reserved once before it is made
//! - `restore`: what this process holds, counted again in a new slot
//! - `tracker`: what each live allocation counted
//! - `overhead`: context and library memory, reconciled against NVML
//! - `counters`: what the above keep per device (in `process::DeviceState`)
#![forbid(unsafe_code)]

pub mod charge;
pub mod context;
pub mod counters;
pub mod grant;
pub mod overhead;
pub mod release;
pub mod restore;
pub mod tracker;

pub use charge::Charge;
pub use grant::counted_slot;
pub use release::{Freeing, uncounted};
pub use tracker::Key;

use vgpu_shm::{EntryIndex, Kind};

use crate::attach::Attach;
use crate::cuda::sys::CUresult;

/// Counts `bytes` of `kind` on the device `device` names around `alloc`,
/// in `attach`'s slot (nothing is counted without one):
/// reserved before, kept if `made` names what the driver made (and the
/// context it was made in), refunded otherwise. Within the quota but
/// beyond what the card holds, an oversubscribed container's allocation
/// waits for room (`oversub::admit`), still reserved.
pub fn counted(
    attach: Option<&'static Attach>,
    kind: Kind,
    bytes: u64,
    device: impl FnOnce(&Attach) -> Option<EntryIndex>,
    alloc: impl FnMut() -> CUresult,
    made: impl FnOnce() -> Option<(Key, usize)>,
) -> CUresult {
    let charge = match Charge::take(attach, kind, bytes, device) {
        Ok(c) => c,
        Err(rc) => return rc,
    };
    let on = charge.as_ref().map(|c| (c.attach(), c.card()));
    let rc = crate::oversub::admit(on, bytes, alloc);
    if let Some(c) = charge
        && let Some((key, ctx)) = made().filter(|_| rc.is_ok())
    {
        c.keep(key, ctx);
    }
    rc
}

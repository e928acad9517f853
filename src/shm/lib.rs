//! The shared accounting region of vgpu.
//!
//! One file per container (`CUDA_DEVICE_MEMORY_SHARED_CACHE`), mapped
//! `MAP_SHARED` by every process of the container. It holds a device table
//! keyed by UUID (limits, the compute bucket) and a fixed array of process
//! slots (pid, host pid, start time, bytes per device and kind).
//!
//! This crate has no FFI to CUDA or NVML and exports no C symbols, so tools
//! (`vgpuctl`) and tests use it without interposing on themselves.
//!
//! - [`layout`]: the `#[repr(C)]` layout, mirrored by `include/vgpu_shm.h`
//! - [`region`]: create/attach/validate a file, or a private region
//! - [`file`]: open or create the file itself (no symlinks, no races, owner checks)
//! - `copy`: a read-only copy of a region file, for monitors
//! - `lock`: the OFD file lock (dies with its holder)
//! - `slots`: claim, release, reclaim dead slots
//! - `index`: typed indices of device entries and slots
//! - `devices`: the UUID-keyed device table and limit precedence
//! - `compute`: a device entry's bucket, scale, utilisation and leader
//! - `quota`: reserve-then-check without a lock
//! - [`procinfo`]: process identity and liveness across pid namespaces
//! - `space`: disk space reserved before mapping (no SIGBUS on a full disk)
//! - `boot`: state of another boot is reset
//! - `private`: a file that shrinks under us is swapped for a private copy
//! - [`sigbus`]: a SIGBUS in a mapped region's pages is repaired, not fatal

#![warn(missing_docs)]

mod boot;
mod compute;
mod copy;
pub mod devices;
pub mod error;
pub mod file;
mod index;
pub mod layout;
mod lock;
mod private;
pub mod procinfo;
pub mod quota;
pub mod region;
pub mod sigbus;
pub mod slots;
mod space;

pub use devices::{CorePolicy, DeviceInfo, Limits, Registered};
pub use error::{Refusal, ShmError, check};
pub use file::{DEFAULT_CREATE_MODE, FileOptions};
pub use index::{EntryIndex, SlotIndex};
pub use layout::{Kind, MAX_DEVICES, MAX_SLOTS};
pub use lock::{LocalLock, RegionGuard};
pub use private::Tamper;
pub use procinfo::{ProcId, ProcView};
pub use quota::{Owners, Reservation};
pub use region::{OpenMode, Region};

/// Formats a device UUID the way NVML and nvidia-smi print it.
pub fn format_uuid(uuid: &[u8; 16]) -> String {
    let h: Vec<String> = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// Parses `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (NVML's form) into bytes.
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex: String = text
        .trim_end_matches('\0')
        .strip_prefix("GPU-")?
        .chars()
        .filter(|c| *c != '-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod copy_tests;
#[cfg(test)]
mod survival_tests;
#[cfg(test)]
mod tests;

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
//! - [`layout`]: vgpu's `#[repr(C)]` part, mirrored by `include/vgpu_shm.h`
//! - [`hami`]: HAMi's layout 1.2 at the start of the file (what node
//!   monitors read, `include/hami_region.h`), its mirror of vgpu's part,
//!   and reading any region file ([`hami::open_any`])
//! - [`format`]: what a file is, before it is mapped
//! - [`region`]: a mapped region, or a private one
//! - `open`: create, attach or repair a file under its lock
//! - `adopt`: vgpu's layout 1.x and HAMi-core's files, made into 2.x
//! - [`file`]: open or create the file itself (no symlinks, no races, owner checks)
//! - `copy`: a read-only copy of a region file, for monitors
//! - `lock`: the OFD file lock (dies with its holder)
//! - `slots`: claim, release, reclaim dead slots
//! - `index`: typed indices of device entries and slots
//! - `devices`: the UUID-keyed device table and limit precedence
//! - `compute`: a device entry's bucket, scale, utilisation and leader
//! - `lease`: one process of the container does a job while it renews a lease
//! - `quota`: reserve-then-check without a lock
//! - [`procinfo`]: process identity and liveness across pid namespaces
//! - `space`: disk space reserved before mapping (no SIGBUS on a full disk)
//! - `boot`: state of another boot is reset (the boot id: [`procinfo`])
//! - `private`: a file that shrinks under us is swapped for a private copy
//! - [`sigbus`]: a SIGBUS in a mapped region's pages is repaired, not fatal
//! - [`board`]: the node's oversubscription board (who holds, waits, is suspended)
//! - `board_dir`: its directory, checked (no symlink, a safe owner and mode)
//! - [`sm_board`]: the node's SM board (each limited container's SM limit
//!   per GPU, for pacing beside others)
//!
//! Layers, from the top: a file imports only from its own layer or below
//! (`tests/layers.rs` reads this list and checks every import; a module
//! path names its files, the longest path wins):
//! 1. readers: hami, hami::monitor, copy
//! 2. opening: open, adopt
//! 3. region: region, devices, slots, quota, compute, private, boot,
//!    hami::mirror, hami::feedback, hami::fill
//! 4. file: format, file, error, sigbus, lock, space, lease, board,
//!    board_dir, sm_board
//! 5. layout: layout, hami::layout, hami::snapshot, index, procinfo

#![warn(missing_docs)]

mod adopt;
pub mod board;
mod board_dir;
mod boot;
mod compute;
mod copy;
pub mod devices;
pub mod error;
pub mod file;
pub mod format;
pub mod hami;
mod index;
pub mod layout;
mod lease;
mod lock;
mod open;
mod private;
pub mod procinfo;
pub mod quota;
pub mod region;
pub mod sigbus;
pub mod slots;
pub mod sm_board;
mod space;

pub use copy::read_copy;
pub use devices::{CorePolicy, DeviceInfo, Limits, Registered};
pub use error::{HamiLimit, Refusal, ShmError, Tamper};
pub use file::{DEFAULT_CREATE_MODE, FileOptions};
pub use format::{Format, check};
pub use index::{EntryIndex, SlotIndex};
pub use layout::{Kind, MAX_DEVICES, MAX_SLOTS};
pub use lock::{LocalLock, RegionGuard};
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
mod adopt_tests;
#[cfg(test)]
mod copy_tests;
#[cfg(test)]
mod survival_tests;
#[cfg(test)]
mod tests;

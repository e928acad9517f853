//! The HAMi part of a region: HAMi's layout 1.2 at the start of every
//! region file vgpu writes, so that the node monitors of HAMi, Volcano and
//! KAI (which accept nothing else) see the container, and the read API
//! tools use on any region file.
//!
//! - [`layout`]: the layout, byte for byte (`include/hami_region.h`)
//! - [`snapshot`]: a bounded, seqlock-consistent copy of what monitors read
//! - `mirror`: how the library keeps it true from vgpu's own part
//! - `fill`: a fresh HAMi part, slots reset or emptied, SM limits converted
//! - [`monitor`]: the node monitor's half of the feedback loop (`vgpuctl serve --feedback`)
//! - `feedback`: what a monitor writes (priority blocking, the switch of
//!   the SM limit) and what launches mark for it
//! - [`open_any`], [`probe`]: open or identify any region file: vgpu's
//!   layout 2.x, its layout 1.x, or HAMi-core's
//!
//! Who writes what: vgpu writes the magic, versions, `device_num`,
//! `uuids`, `limit`, `sm_limit`, the process slots, `proc_num`, `priority`
//! and `last_kernel_time`, and marks `recent_kernel` at launches; a
//! monitor writes `recent_kernel` (-1 blocks the container's launches),
//! `utilization_switch`, and may write `limit`/`sm_limit`, which vgpu then
//! applies as region limits.

mod feedback;
pub(crate) mod fill;
pub mod layout;
mod mirror;
pub mod monitor;
pub mod snapshot;

use std::fs::File;
use std::path::{Path, PathBuf};

pub use feedback::{ACTIVE, BLOCK_ALONE_S, BLOCK_MAX_S};
pub use fill::{sm_from_hami, sm_to_hami};
pub use layout::{
    HAMI_DEVICES, HAMI_MAGIC, HAMI_MAJOR, HAMI_MINOR, HAMI_PROCS, HAMI_SIZE, HAMI_STATUS_RUNNING,
    HamiProc, HamiRegion,
};
pub use mirror::Mirrored;
pub use snapshot::{Device, Proc, ProcDevice, Snapshot};

use crate::error::ShmError;
use crate::file::FileOptions;
use crate::format::Format;
use crate::open::{Purpose, inspect};
use crate::region::Region;

/// A region file opened for reading, whatever its format.
pub enum Opened {
    /// A vgpu region: layout 2.x (with its HAMi part) or 1.x (without).
    Vgpu(Region),
    /// A HAMi-core file: its HAMi part alone, mapped read-only.
    HamiCore(HamiFile),
}

impl Opened {
    /// The file's format.
    pub fn format(&self) -> Format {
        match self {
            Opened::Vgpu(r) => r.format(),
            Opened::HamiCore(_) => Format::HamiCore {
                major: HAMI_MAJOR,
                minor: HAMI_MINOR,
            },
        }
    }

    /// The HAMi part, when the file has one (not vgpu's layout 1.x).
    pub fn hami(&self) -> Option<&HamiRegion> {
        match self {
            Opened::Vgpu(r) => r.hami(),
            Opened::HamiCore(f) => Some(f.hami()),
        }
    }

    /// [`HamiRegion::snapshot`] of the HAMi part, when there is one.
    pub fn snapshot(&self) -> Option<Snapshot> {
        self.hami().map(HamiRegion::snapshot)
    }

    /// The vgpu region, when it is one.
    pub fn region(&self) -> Option<&Region> {
        match self {
            Opened::Vgpu(r) => Some(r),
            Opened::HamiCore(_) => None,
        }
    }
}

/// A HAMi-core region file, mapped read-only.
pub struct HamiFile {
    map: memmap2::Mmap,
    path: PathBuf,
}

impl HamiFile {
    /// A HAMi-core file already in `map` (a copy, `copy.rs`): `map` is at
    /// least [`HAMI_SIZE`] bytes.
    pub(crate) fn from_map(map: memmap2::Mmap, path: &Path) -> HamiFile {
        debug_assert!(map.len() >= HAMI_SIZE);
        HamiFile {
            map,
            path: path.to_path_buf(),
        }
    }

    /// Its HAMi part.
    pub fn hami(&self) -> &HamiRegion {
        // SAFETY: the mapping is HAMI_SIZE bytes (checked when it was made),
        // page-aligned and borrowed from self; HamiRegion is repr(C),
        // atomics only (valid for any bits); atomic loads of read-only pages
        // are plain loads on x86-64, and nothing here stores.
        unsafe { &*(self.map.as_ptr() as *const HamiRegion) }
    }

    /// [`HamiRegion::snapshot`].
    pub fn snapshot(&self) -> Snapshot {
        self.hami().snapshot()
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Opens any region file for reading, never creating, adopting or
/// upgrading it: vgpu's layouts as a [`Region`] (so `vgpuctl reclaim` can
/// still free dead slots), HAMi-core's read-only. Never through a symbolic
/// link; `any_owner` accepts a file of any owner.
pub fn open_any(path: &Path, any_owner: bool) -> Result<Opened, ShmError> {
    let opts = FileOptions {
        create: None,
        any_owner,
    };
    if probe(path)?
        == (Format::HamiCore {
            major: HAMI_MAJOR,
            minor: HAMI_MINOR,
        })
    {
        let (file, _) = crate::file::open(path, opts)?;
        return Ok(Opened::HamiCore(map_hami_core(&file, path)?));
    }
    crate::open::open(path, opts, Purpose::Inspect).map(Opened::Vgpu)
}

/// The format of the file at `path`, read without mapping or locking it;
/// a file of no known format is [`ShmError::Refused`] with the reason.
pub fn probe(path: &Path) -> Result<Format, ShmError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| ShmError::io(path, "open", e))?;
    let meta = file.metadata().map_err(|e| ShmError::io(path, "stat", e))?;
    if !meta.is_file() {
        return Err(ShmError::NotRegular {
            path: path.to_path_buf(),
            what: "not a regular file",
        });
    }
    inspect(&file, path, false).map(|l| match l.found {
        Some(found) => found.format(),
        None => unreachable!("inspect without creation always finds something or refuses"),
    })
}

/// The length of a HAMi-core file; one shorter than its layout is
/// refused, not mapped.
pub(crate) fn check_hami_len(file: &File, path: &Path) -> Result<u64, ShmError> {
    let len = file
        .metadata()
        .map_err(|e| ShmError::io(path, "stat", e))?
        .len();
    if len < HAMI_SIZE as u64 {
        return Err(ShmError::Refused {
            path: path.to_path_buf(),
            why: crate::Refusal::Truncated { len },
        });
    }
    Ok(len)
}

fn map_hami_core(file: &File, path: &Path) -> Result<HamiFile, ShmError> {
    check_hami_len(file, path)?;
    // SAFETY: a read-only shared mapping of HAMI_SIZE bytes of a file that
    // long; it is only read through atomics (HamiFile::hami).
    let map = unsafe { memmap2::MmapOptions::new().len(HAMI_SIZE).map(file) }
        .map_err(|e| ShmError::io(path, "mmap", e))?;
    Ok(HamiFile {
        map,
        path: path.to_path_buf(),
    })
}

#[cfg(test)]
mod tests;

//! Opening a region file: under the file lock, tell what it is
//! (`format.rs`) before anything is mapped, then create, attach, or adopt
//! an older file (`adopt.rs`).
//!
//! | found | attach (the library) | inspect (tools) |
//! |---|---|---|
//! | nothing (empty file, may create) | create layout 2.x | - |
//! | layout 2.x, ready | map; a HAMi part left half-written is written again | map |
//! | layout 2.x, not ready | its creator died: create again (keeping a HAMi part that is whole, from an adoption cut short) | map |
//! | layout 1.x, ready | upgraded to 2.x when no live process holds a slot; else used as it is, so old processes keep sharing it | map |
//! | layout 1.x, not ready | create 2.x | map |
//! | HAMi-core 1.2 | adopted (limits kept) unless HAMi-core processes map it: refused | see `hami::open_any` |
//! | anything else | refused, untouched | refused |

#![forbid(unsafe_code)]

use std::fs::File;
use std::path::Path;

use crate::error::ShmError;
use crate::file::{FileOptions, read_at, zero_range};
use crate::format::{Found, Locked, classify};
use crate::layout::{FILE_SIZE, PREFIX_LEN, VGPU_OFFSET};
use crate::lock::{LocalLock, RegionGuard};
use crate::region::{Region, Shape, initialise, map};
use crate::{adopt, space};

impl Region {
    /// [`Region::open`] with the file's creation mode and owner policy. A
    /// file of an older layout is adopted (this file says how), or refused
    /// with what to delete.
    pub fn open_with(path: &Path, opts: FileOptions) -> Result<Region, ShmError> {
        open(path, opts, Purpose::Attach)
    }
}

/// Why a region is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// By the library: create, repair, adopt and upgrade as needed.
    Attach,
    /// By a tool: map what is there, change nothing.
    Inspect,
}

/// Opens the region at `path`.
pub(crate) fn open(path: &Path, opts: FileOptions, purpose: Purpose) -> Result<Region, ShmError> {
    let (file, _created) = crate::file::open(path, opts)?;
    let local = LocalLock::new();
    let guard =
        RegionGuard::acquire(&local, Some(&file)).map_err(|e| ShmError::io(path, "lock", e))?;
    let locked = inspect(&file, path, opts.create.is_some())?;
    let region = match purpose {
        Purpose::Attach => attach(&locked, &guard)?,
        Purpose::Inspect => {
            let shape = match locked.found {
                Some(Found::VgpuLegacy { .. }) => Shape::LEGACY,
                Some(Found::Vgpu { .. }) => Shape::CURRENT,
                Some(Found::HamiCore) | None => {
                    return Err(ShmError::Refused {
                        path: path.to_path_buf(),
                        why: crate::Refusal::Truncated { len: locked.len },
                    });
                }
            };
            map(&file, path, shape)?
        }
    };
    let mut region = region.with_mapped_id();
    drop(guard);
    region.local = local;
    region.file = Some(file);
    Ok(region)
}

/// Reads what the file is (the lock is held). An empty file is `None`
/// when it may be created.
pub(crate) fn inspect<'a>(
    file: &'a File,
    path: &'a Path,
    may_create: bool,
) -> Result<Locked<'a>, ShmError> {
    let len = file
        .metadata()
        .map_err(|e| ShmError::io(path, "stat", e))?
        .len();
    let found = if len == 0 && may_create {
        None
    } else {
        let mut start = [0u8; PREFIX_LEN];
        let n = read_at(file, &mut start, 0).map_err(|e| ShmError::io(path, "read", e))?;
        let mut part = [0u8; PREFIX_LEN];
        let m = if len > VGPU_OFFSET as u64 {
            read_at(file, &mut part, VGPU_OFFSET as u64)
                .map_err(|e| ShmError::io(path, "read", e))?
        } else {
            0
        };
        let found = classify(&start[..n], &part[..m], len).map_err(|why| ShmError::Refused {
            path: path.to_path_buf(),
            why,
        })?;
        Some(found)
    };
    Ok(Locked {
        file,
        path,
        len,
        found,
    })
}

/// Creates, repairs, upgrades or adopts as the table in the module docs
/// says, and maps the result.
fn attach(l: &Locked<'_>, guard: &RegionGuard<'_>) -> Result<Region, ShmError> {
    match l.found {
        None
        | Some(Found::Vgpu {
            ready: false,
            hami_ready: false,
            ..
        })
        | Some(Found::VgpuLegacy { ready: false, .. }) => create(l.file, l.path),
        Some(Found::Vgpu {
            ready: false,
            hami_ready: true,
            ..
        }) => adopt::hami_core(l, true),
        Some(Found::Vgpu {
            ready: true,
            hami_ready,
            ..
        }) => {
            if !hami_ready {
                // An upgrade or a creation stopped before the HAMi part
                // was written: nobody reads it without its magic.
                zero_range(l.file, 0, crate::hami::layout::HAMI_SIZE as u64)
                    .map_err(|e| ShmError::io(l.path, "write", e))?;
            }
            space::reserve_existing(l.file, FILE_SIZE as u64)
                .map_err(|e| ShmError::no_space(l.path, e))?;
            let mut region = map(l.file, l.path, Shape::CURRENT)?;
            if !hami_ready && let Some(h) = region.hami() {
                crate::hami::fill::initialise(h);
                region.created = true;
            }
            region.settle_boot(guard, crate::procinfo::boot_id());
            Ok(region)
        }
        Some(Found::VgpuLegacy { ready: true, .. }) => adopt::legacy(l, guard),
        Some(Found::HamiCore) => adopt::hami_core(l, false),
    }
}

/// (Re)creates the file as a fresh region of layout 2.x.
pub(crate) fn create(file: &File, path: &Path) -> Result<Region, ShmError> {
    // New, or its creator died half-way (we hold the lock, so nobody
    // can be using it). Truncating to zero first zeroes every byte.
    file.set_len(0)
        .map_err(|e| ShmError::io(path, "ftruncate", e))?;
    if let Err(e) = space::reserve_new(file, FILE_SIZE as u64) {
        // Left empty: the next process tries again.
        let _ = file.set_len(0);
        return Err(ShmError::no_space(path, e));
    }
    // The mode is left as it is: `file.rs` set it when vgpu created the
    // file, and a file someone else made keeps theirs.
    let mut region = map(file, path, Shape::CURRENT)?;
    region.created = true;
    // vgpu's part first: a HAMi magic promises a whole file.
    initialise(region.header());
    if let Some(h) = region.hami() {
        crate::hami::fill::initialise(h);
    }
    Ok(region)
}

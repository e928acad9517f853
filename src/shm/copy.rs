//! A copy of a region file, for monitors (`vgpuctl status`, `vgpuctl
//! serve`): read with `pread` from a descriptor opened read-only, without
//! the lock, into private memory. Nothing in the file can change because
//! of it, and a file truncated or rewritten meanwhile is an error, never a
//! SIGBUS (a mapping of the file would fault, and only a few mappings per
//! process can be watched: `sigbus.rs`). It reads every format
//! [`crate::hami::open_any`] does, and answers through the same
//! [`Opened`]: every read of [`Region`] and of the HAMi part works on the
//! copy as on the file when it was read.
//!
//! Only the parts in use are read: the HAMi part's header, its first
//! `proc_num` slots and its tail; vgpu's header and its slots up to the
//! high-water mark. The rest of the copy stays zero, and its pages are
//! never touched. The kernel copies the bytes while processes change
//! them: a figure may be a moment stale, and `pread` does not promise that
//! a word changing during the copy arrives whole (HAMi's slots carry a
//! seqlock, which the snapshot checks); the next read sees it settled.
#![forbid(unsafe_code)]

use std::fs::File;
use std::io;
use std::mem::{offset_of, size_of};
use std::os::unix::fs::FileExt;
use std::path::Path;

use memmap2::{MmapMut, MmapOptions};

use crate::error::ShmError;
use crate::format::{Found, classify};
use crate::hami::{HAMI_PROCS, HAMI_SIZE, HamiFile, HamiProc, HamiRegion, Opened};
use crate::layout::{HEADER_SIZE, Header, MAX_SLOTS, PREFIX_LEN, SLOT_SIZE, VGPU_OFFSET};
use crate::region::{Region, Shape};

/// Reads the region file at `path`, of any format, into private memory
/// without writing to it. A file of no known format, or one its creator
/// has not finished, is refused with the reason.
pub fn read_copy(path: &Path) -> Result<Opened, ShmError> {
    let file = crate::file::open_read_only(path)?;
    let len = file
        .metadata()
        .map_err(|e| ShmError::io(path, "stat", e))?
        .len();
    let io = |e| ShmError::io(path, "read", e);
    let mut start = [0u8; PREFIX_LEN];
    let n = crate::file::read_at(&file, &mut start, 0).map_err(io)?;
    let mut part = [0u8; PREFIX_LEN];
    let m = if len > VGPU_OFFSET as u64 {
        crate::file::read_at(&file, &mut part, VGPU_OFFSET as u64).map_err(io)?
    } else {
        0
    };
    let found = classify(&start[..n], &part[..m], len).map_err(|why| ShmError::Refused {
        path: path.to_path_buf(),
        why,
    })?;
    let shape = match found {
        Found::Vgpu { ready: true, .. } => Shape::CURRENT,
        Found::VgpuLegacy { ready: true, .. } => Shape::LEGACY,
        Found::HamiCore => {
            let mut map = anon(path, HAMI_SIZE)?;
            copy_hami(&file, &mut map).map_err(io)?;
            let map = map
                .make_read_only()
                .map_err(|e| ShmError::io(path, "mprotect", e))?;
            return Ok(Opened::HamiCore(HamiFile::from_map(map, path)));
        }
        Found::Vgpu { ready: false, .. } | Found::VgpuLegacy { ready: false, .. } => {
            let why = io::Error::other("not initialised yet: its creator has not finished");
            return Err(ShmError::io(path, "read", why));
        }
    };
    let mut map = anon(path, shape.len)?;
    if shape.base != 0 {
        copy_hami(&file, &mut map[..HAMI_SIZE]).map_err(io)?;
    }
    copy_vgpu(&file, &mut map[shape.base..], shape.base as u64).map_err(io)?;
    let region = Region::from_map(map.into(), shape, None, path.to_path_buf(), None);
    Ok(Opened::Vgpu(region.with_mapped_id()))
}

fn anon(path: &Path, len: usize) -> Result<MmapMut, ShmError> {
    MmapOptions::new()
        .len(len)
        .map_anon()
        .map_err(|e| ShmError::io(path, "mmap", e))
}

/// HAMi's part into `buf` (at least HAMI_SIZE bytes): the header, the
/// tail, then the slots `proc_num` (clamped) says are in use.
fn copy_hami(file: &File, buf: &mut [u8]) -> io::Result<()> {
    let procs = offset_of!(HamiRegion, procs);
    let tail = offset_of!(HamiRegion, proc_num);
    file.read_exact_at(&mut buf[..procs], 0)?;
    file.read_exact_at(&mut buf[tail..HAMI_SIZE], tail as u64)?;
    let n = i32::from_le_bytes(buf[tail..tail + 4].try_into().expect("4 bytes"));
    let n = usize::try_from(n).unwrap_or(0).min(HAMI_PROCS);
    let end = procs + n * size_of::<HamiProc>();
    file.read_exact_at(&mut buf[procs..end], procs as u64)
}

/// vgpu's part, which starts at `at` in the file, into `buf`: the header,
/// then the slots up to its high-water mark.
fn copy_vgpu(file: &File, buf: &mut [u8], at: u64) -> io::Result<()> {
    file.read_exact_at(&mut buf[..HEADER_SIZE], at)?;
    let hwm = offset_of!(Header, slot_hwm);
    let hwm = u32::from_le_bytes(buf[hwm..hwm + 4].try_into().expect("4 bytes"));
    let slots = (hwm as usize).min(MAX_SLOTS) * SLOT_SIZE;
    file.read_exact_at(
        &mut buf[HEADER_SIZE..HEADER_SIZE + slots],
        at + HEADER_SIZE as u64,
    )
}

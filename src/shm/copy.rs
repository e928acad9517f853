//! A copy of a region file, for monitors (`vgpuctl status`, `vgpuctl
//! serve`): read with `pread` from a descriptor opened read-only, without
//! the lock, into private memory. Nothing in the file can change because
//! of it, and a file truncated or rewritten meanwhile is an error, never a
//! SIGBUS. The copy answers every read of [`Region`] (usage, owners,
//! heartbeats, buckets) as the file stood when it was read. The kernel
//! copies the bytes while processes change them: a figure may be a moment
//! stale, and `pread` does not promise that a word changing during the
//! copy arrives whole; the next read sees it settled.
#![forbid(unsafe_code)]

use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use memmap2::{MmapMut, MmapOptions};

use crate::Region;
use crate::error::{ShmError, check};
use crate::layout::{HEADER_SIZE, Header, MAX_SLOTS, PREFIX_LEN, REGION_SIZE, SLOT_SIZE};

impl Region {
    /// Reads the region file at `path` into private memory, without
    /// writing to it. A file that is not a ready region of this layout is
    /// refused with the reason, as [`Region::open`] refuses it.
    pub fn read_copy(path: &Path) -> Result<Region, ShmError> {
        let file = crate::file::open_read_only(path)?;
        let len = file
            .metadata()
            .map_err(|e| ShmError::io(path, "stat", e))?
            .len();
        let mut head = [0u8; PREFIX_LEN];
        let n = read_upto(&file, &mut head, 0).map_err(|e| ShmError::io(path, "read", e))?;
        let ready = check(&head[..n], len).map_err(|why| ShmError::Refused {
            path: path.to_path_buf(),
            why,
        })?;
        if !ready {
            let why = io::Error::other("not initialised yet: its creator has not finished");
            return Err(ShmError::io(path, "read", why));
        }
        let mut map: MmapMut = MmapOptions::new()
            .len(REGION_SIZE)
            .map_anon()
            .map_err(|e| ShmError::io(path, "mmap", e))?;
        // The header, then the slots it says were ever claimed; the rest
        // stays zero (free slots), and its pages are never touched.
        let short = |e| ShmError::io(path, "read", e);
        file.read_exact_at(&mut map[..HEADER_SIZE], 0)
            .map_err(short)?;
        let hwm_at = std::mem::offset_of!(Header, slot_hwm);
        let hwm = u32::from_le_bytes(map[hwm_at..hwm_at + 4].try_into().expect("4 bytes"));
        let slots = (hwm as usize).min(MAX_SLOTS) * SLOT_SIZE;
        file.read_exact_at(
            &mut map[HEADER_SIZE..HEADER_SIZE + slots],
            HEADER_SIZE as u64,
        )
        .map_err(short)?;
        Ok(Region::in_private(map.into(), path.to_path_buf()))
    }
}

/// Reads up to `buf.len()` bytes at `at`; fewer only at the end of file.
fn read_upto(file: &std::fs::File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

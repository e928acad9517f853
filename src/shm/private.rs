//! A region file that shrinks under its users. Anyone who may write the
//! file (it is 0666) can `truncate` it; every page of a `MAP_SHARED`
//! mapping past the new end of file then raises SIGBUS when touched. The
//! library checks the file before it touches the mapping
//! ([`Region::check_intact`]) and, on a shrunk or re-created file, swaps
//! the mapping in place for a private copy ([`Region::become_private`]).
//! The swap is one `mremap` over the same addresses, so references into
//! the region stay valid and never see a half-filled copy.

use std::ffi::c_void;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use crate::Region;
use crate::error::{ShmError, Tamper};

impl Region {
    /// Whether the file is still long enough for the mapping: one `fstat`,
    /// made just before the mapping is touched. A private region passes.
    pub fn check_size(&self) -> Result<(), Tamper> {
        let Some(file) = self.shared_file() else {
            return Ok(());
        };
        // An fd that cannot be stat'ed says nothing about the size.
        match file.metadata() {
            Ok(meta) if meta.len() < self.shape().len as u64 => {
                Err(Tamper::Shrunk { len: meta.len() })
            }
            _ => Ok(()),
        }
    }

    /// [`Region::check_size`], and that the file still holds the region we
    /// mapped (its id is read with `pread`, never through the mapping, so
    /// the check itself cannot fault).
    pub fn check_intact(&self) -> Result<(), Tamper> {
        self.check_size()?;
        let Some(file) = self.shared_file() else {
            return Ok(());
        };
        let mut id = [0u8; 8];
        let at =
            (self.shape().base + std::mem::offset_of!(crate::layout::Header, region_id)) as u64;
        match file.read_exact_at(&mut id, at) {
            Ok(()) if u64::from_le_bytes(id) != self.mapped_id => Err(Tamper::Replaced),
            Ok(()) => Ok(()),
            Err(_) => Err(Tamper::Shrunk { len: 0 }),
        }
    }

    /// Replaces the mapping with private memory that `fill` prepares first
    /// (on a fresh region: it must not read `self`, whose pages may fault).
    /// From then on the region is this process's alone.
    pub fn become_private(&self, fill: impl FnOnce(&Region)) -> Result<(), ShmError> {
        let len = self.shape().len;
        let fresh = Region::anonymous_shaped(self.shape())?;
        fill(&fresh);
        let Region { map, .. } = fresh;
        // SAFETY: both mappings are `len` bytes (one shape) and page-aligned;
        // MREMAP_FIXED moves `map`'s pages onto `self.map`'s addresses,
        // unmapping what was there in the same step. `map` is forgotten
        // below, so nothing unmaps its old (now empty) addresses later,
        // and `self.map` unmaps the moved pages when the region is dropped.
        let moved = unsafe {
            libc::mremap(
                map.as_mut_ptr().cast::<c_void>(),
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                self.map.as_mut_ptr().cast::<c_void>(),
            )
        };
        if moved == libc::MAP_FAILED {
            return Err(ShmError::io(
                self.path(),
                "mremap",
                std::io::Error::last_os_error(),
            ));
        }
        std::mem::forget(map);
        self.private.store(true, Ordering::Release);
        Ok(())
    }
}

//! Reading a region file of any format into a [`Snapshot`], without
//! writing to it: `vgpu-shm`'s [`read_copy`] opens the file read-only,
//! never through a symbolic link, and copies it with `pread` (no lock, no
//! mapping of the file), then tells its format: vgpu's layout 2.x (HAMi's
//! layout 1.2 with vgpu's part behind it), vgpu's layout 1.x, or a
//! HAMi-core file. Each has its translation here.
#![forbid(unsafe_code)]

pub mod hami;
pub mod vgpu;

use std::path::Path;

use vgpu_shm::hami::Opened;
use vgpu_shm::{ProcView, read_copy};

use crate::snapshot::Snapshot;

/// Reads the region at `path`, whichever layout it has.
pub fn read(path: &Path) -> Result<Snapshot, String> {
    match read_copy(path).map_err(|e| e.to_string())? {
        Opened::Vgpu(region) => Ok(vgpu::snapshot(&region, &ProcView::current())),
        Opened::HamiCore(file) => Ok(hami::snapshot(file.path(), &file.snapshot())),
    }
}

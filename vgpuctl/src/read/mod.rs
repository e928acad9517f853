//! Reading a region file of any format into a [`Snapshot`], without
//! writing to it: the file is opened read-only, never through a symbolic
//! link, and read with `pread` (no lock, no mapping of the file).
//!
//! The format is told by the file's first bytes: vgpu's magic `VGPUSHM`,
//! or HAMi-core's 19920718. Each format has its reader here, behind the
//! one function [`read`], so that a reader can be swapped for the
//! `vgpu-shm` crate's own when it has one.
#![forbid(unsafe_code)]

pub mod hami;
pub mod vgpu;

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use crate::snapshot::Snapshot;

/// Reads the region at `path`, whichever layout it has.
pub fn read(path: &Path) -> Result<Snapshot, String> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => {
                format!("region {}: a symbolic link, never followed", path.display())
            }
            _ => format!("region {}: open failed: {e}", path.display()),
        })?;
    if !file.metadata().is_ok_and(|m| m.file_type().is_file()) {
        return Err(format!("region {}: not a regular file", path.display()));
    }
    let mut head = [0u8; 8];
    let n = read_upto(&file, &mut head).map_err(|e| format!("region {}: {e}", path.display()))?;
    if hami::is_hami(&head[..n]) {
        hami::read(path, &file)
    } else {
        // vgpu's reader names every other case (wrong magic, too short).
        vgpu::read(path)
    }
}

fn read_upto(file: &File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

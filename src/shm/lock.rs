//! The region lock: an in-process mutex plus an OFD `fcntl` write lock on
//! the region file. The kernel drops an OFD lock when its holder dies, so no
//! lock outlives `kill -9`. Taken only to create, attach, register a device
//! or reclaim slots; never on the allocation or launch path, and never
//! across a driver call.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use parking_lot::{Mutex, MutexGuard};

/// Held while the region's structure (slots, device table) changes.
pub struct RegionGuard<'a> {
    file: Option<&'a File>,
    _local: MutexGuard<'a, ()>,
}

impl<'a> RegionGuard<'a> {
    /// Takes `local`, then the OFD lock on `file` (when the region has one).
    pub(crate) fn acquire(local: &'a Mutex<()>, file: Option<&'a File>) -> io::Result<Self> {
        let guard = local.lock();
        if let Some(f) = file {
            ofd_lock(f, libc::F_WRLCK as libc::c_short)?;
        }
        Ok(RegionGuard {
            file,
            _local: guard,
        })
    }
}

impl Drop for RegionGuard<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.file {
            // An unlock of a lock we hold cannot fail in a way we could act on;
            // closing the file (or dying) releases it regardless.
            let _ = ofd_lock(f, libc::F_UNLCK as libc::c_short);
        }
    }
}

fn ofd_lock(file: &File, kind: libc::c_short) -> io::Result<()> {
    let fl = libc::flock {
        l_type: kind,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    let cmd = if kind == libc::F_UNLCK as libc::c_short {
        libc::F_OFD_SETLK
    } else {
        libc::F_OFD_SETLKW
    };
    loop {
        // SAFETY: the fd is open for the lifetime of `file`, and `fl` is a
        // fully initialised flock that fcntl only reads.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &fl) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

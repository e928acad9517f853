//! The region lock: an in-process mutex plus an OFD `fcntl` write lock on
//! the region file. The kernel drops an OFD lock when its holder dies, so no
//! lock outlives `kill -9`. Taken only to create, attach, register a device
//! or reclaim slots; never on the allocation or launch path, and never
//! across a driver call.

use std::cell::UnsafeCell;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The in-process half of the region lock. A std mutex: the kernel queues
/// its waiters, so a forked child inherits none of the parent's and can
/// start from a fresh lock ([`LocalLock::reset_in_child`]).
pub struct LocalLock(UnsafeCell<Mutex<()>>);

// SAFETY: the cell is written only by `reset_in_child`, whose caller
// guarantees that no other thread and no guard exist; otherwise it is only
// read, and a `Mutex<()>` is Sync.
unsafe impl Sync for LocalLock {}

impl LocalLock {
    /// An unlocked lock.
    pub const fn new() -> LocalLock {
        LocalLock(UnsafeCell::new(Mutex::new(())))
    }

    fn mutex(&self) -> &Mutex<()> {
        // SAFETY: see `reset_in_child`, the only writer.
        unsafe { &*self.0.get() }
    }

    /// Waits for the lock.
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        self.mutex().lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock, if it is free now.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, ()>> {
        match self.mutex().try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Replaces the lock with a fresh, unlocked one, in a forked child.
    ///
    /// # Safety
    /// Only in a forked child before any other code runs there (one
    /// thread), with every guard of this lock forgotten, never dropped.
    pub unsafe fn reset_in_child(&self) {
        // SAFETY: the caller guarantees nobody else reads or writes the
        // cell now; the old mutex is overwritten, never dropped.
        unsafe { self.0.get().write(Mutex::new(())) };
    }
}

impl Default for LocalLock {
    fn default() -> LocalLock {
        LocalLock::new()
    }
}

/// Held while the region's structure (slots, device table) changes.
pub struct RegionGuard<'a> {
    file: Option<&'a File>,
    _local: MutexGuard<'a, ()>,
}

impl<'a> RegionGuard<'a> {
    /// Takes `local`, then the OFD lock on `file` (when the region has one).
    pub(crate) fn acquire(local: &'a LocalLock, file: Option<&'a File>) -> io::Result<Self> {
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

//! Disk space for a region, reserved before it is mapped: a store through
//! a shared mapping into a hole the filesystem cannot fill (a full tmpfs)
//! is a SIGBUS, so every page gets its blocks up front.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

/// Gives `file` (freshly truncated to 0, nobody has it mapped) `len`
/// bytes of zeros with their blocks allocated.
pub fn reserve_new(file: &File, len: u64) -> io::Result<()> {
    match fallocate(file, len) {
        Err(e) if !is_full(&e) => {
            // No fallocate here (EOPNOTSUPP and the like): writing the
            // zeros allocates the blocks. Safe only because nobody maps
            // this file yet.
            file.set_len(0)?;
            let zeros = vec![0u8; 64 << 10];
            let mut at = 0;
            while at < len {
                let n = zeros.len().min((len - at) as usize);
                file.write_all_at(&zeros[..n], at)?;
                at += n as u64;
            }
            file.sync_data()
        }
        other => other,
    }
}

/// Makes sure an existing region has no holes: an error only when the
/// filesystem is out of space for them. Where `fallocate` is missing
/// nothing can be checked without writing, which others' mappings
/// forbid: it is left as it is.
pub fn reserve_existing(file: &File, len: u64) -> io::Result<()> {
    match fallocate(file, len) {
        Err(e) if !is_full(&e) => Ok(()),
        other => other,
    }
}

fn is_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// `fallocate(fd, 0, 0, len)`: allocates without changing any byte (mode
/// 0 never writes data, unlike glibc's `posix_fallocate` emulation).
fn fallocate(file: &File, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
    loop {
        // SAFETY: the fd is open for the lifetime of `file`; fallocate
        // takes no pointers.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

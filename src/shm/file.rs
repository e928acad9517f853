//! Opening and creating the region file, safely in a directory others can
//! write to (`/tmp`, a directory shared by a container's users).
//!
//! - The last path component is never followed if it is a symbolic link
//!   (`O_NOFOLLOW`): a link planted at the region path is refused, never
//!   created through nor written through.
//! - Only a regular file is used (`fstat` on the opened descriptor, so what
//!   is checked is what is used). FIFOs and devices are opened
//!   non-blocking and refused.
//! - A new file is created with `O_CREAT | O_EXCL`: there is no window
//!   between "it does not exist" and "open it" for someone else's file to
//!   appear in. If one appears, the loop opens it as an existing file.
//! - Only a file vgpu just created gets its mode set (`fchmod` on our own
//!   descriptor), to the configured creation mode whatever the umask.
//! - A file owned by another user who is not root is refused unless the
//!   caller allows any owner: whoever owns a region can set its limits.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use crate::error::ShmError;

/// How a region file may be opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOptions {
    /// Create it if missing, with this mode (`None`: never create).
    pub create: Option<u32>,
    /// Accept a file owned by any user (default: ours or root's only).
    pub any_owner: bool,
}

/// The mode of a region vgpu creates, unless configured: every user of the
/// container can attach (its processes may run as several uids). The
/// directory is what keeps other containers out (HAMi mounts one directory
/// per container); see docs/reliability.md.
pub const DEFAULT_CREATE_MODE: u32 = 0o666;

/// How often a racing `O_EXCL` create or a half-created file is retried.
const ATTEMPTS: u32 = 50;

/// Opens the region file at `path` for reading and writing. Returns the
/// file and whether this call created it.
pub fn open(path: &Path, opts: FileOptions) -> Result<(File, bool), ShmError> {
    let cpath = c_path(path)?;
    let base =
        libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK;
    let mut last = io::Error::from_raw_os_error(libc::EAGAIN);
    for _ in 0..ATTEMPTS {
        match open_raw(&cpath, base, 0) {
            Ok(file) => return checked(path, file, false, opts),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let Some(mode) = opts.create else {
                    return Err(ShmError::io(path, "open", e));
                };
                match open_raw(&cpath, base | libc::O_CREAT | libc::O_EXCL, 0o600) {
                    Ok(file) => {
                        set_mode(&file, mode).map_err(|e| ShmError::io(path, "fchmod", e))?;
                        return checked(path, file, true, opts);
                    }
                    // Someone else created it first: open theirs.
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => last = e,
                    Err(e) => return Err(refusal_or_io(path, "create", e)),
                }
            }
            // A file another process is creating right now has the mode
            // 0600 until its creator sets it, and is still empty.
            Err(e) if e.raw_os_error() == Some(libc::EACCES) && is_being_created(path) => {
                last = e;
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(refusal_or_io(path, "open for writing", e)),
        }
    }
    Err(ShmError::io(path, "open for writing", last))
}

/// Opens the region file at `path` for reading only (a monitor): never
/// through a symbolic link, only a regular file, of any owner.
pub fn open_read_only(path: &Path) -> Result<File, ShmError> {
    let cpath = c_path(path)?;
    let flags =
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK;
    let file = open_raw(&cpath, flags, 0).map_err(|e| refusal_or_io(path, "open", e))?;
    let opts = FileOptions {
        create: None,
        any_owner: true,
    };
    checked(path, file, false, opts).map(|(file, _)| file)
}

/// `path` for `open(2)`; one with a NUL byte cannot be opened.
fn c_path(path: &Path) -> Result<std::ffi::CString, ShmError> {
    std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        ShmError::io(
            path,
            "open",
            io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"),
        )
    })
}

fn open_raw(path: &std::ffi::CStr, flags: i32, mode: libc::mode_t) -> io::Result<File> {
    // SAFETY: a NUL-terminated path and plain flags; the descriptor returned
    // is new and owned by the File made from it.
    let fd = unsafe { libc::open(path.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a freshly opened descriptor nobody else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    // The region is used blocking (O_NONBLOCK only kept a FIFO from hanging
    // the open).
    // SAFETY: fcntl on our own open descriptor.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    if flags >= 0 {
        // SAFETY: as above.
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) };
    }
    Ok(file)
}

fn set_mode(file: &File, mode: u32) -> io::Result<()> {
    // SAFETY: fchmod on a descriptor we own, of a file this call created.
    if unsafe { libc::fchmod(file.as_raw_fd(), mode as libc::mode_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Checks what was opened: a regular file, of an acceptable owner.
fn checked(
    path: &Path,
    file: File,
    created: bool,
    opts: FileOptions,
) -> Result<(File, bool), ShmError> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata().map_err(|e| ShmError::io(path, "stat", e))?;
    if !meta.file_type().is_file() {
        return Err(ShmError::NotRegular {
            path: path.to_path_buf(),
            what: kind_of(meta.mode()),
        });
    }
    if meta.nlink() != 1 {
        // A hard link to someone else's file is no region of ours.
        return Err(ShmError::NotRegular {
            path: path.to_path_buf(),
            what: "a file with several hard links",
        });
    }
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !created && !opts.any_owner && meta.uid() != me && meta.uid() != 0 {
        return Err(ShmError::ForeignOwner {
            path: path.to_path_buf(),
            owner: meta.uid(),
            me,
        });
    }
    Ok((file, created))
}

fn kind_of(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR | libc::S_IFBLK => "a device",
        libc::S_IFLNK => "a symbolic link",
        _ => "not a regular file",
    }
}

/// ELOOP from `O_NOFOLLOW` means the path is a symbolic link; ENXIO, a
/// socket. Both are refusals, not I/O errors.
fn refusal_or_io(path: &Path, op: &'static str, e: io::Error) -> ShmError {
    match e.raw_os_error() {
        Some(libc::ELOOP) => ShmError::NotRegular {
            path: path.to_path_buf(),
            what: "a symbolic link",
        },
        Some(libc::ENXIO) => ShmError::NotRegular {
            path: path.to_path_buf(),
            what: "a socket",
        },
        _ => ShmError::io(path, op, e),
    }
}

/// Whether `path` is an empty regular file: one whose creator has not set
/// its mode and size yet.
fn is_being_created(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file() && m.len() == 0)
}

/// Writes zeros over `[at, at + len)` of `file` (never through a mapping:
/// the bytes may lie past a mapping's end).
pub(crate) fn zero_range(file: &File, at: u64, len: u64) -> io::Result<()> {
    let zeros = vec![0u8; 64 << 10];
    let mut done = 0;
    while done < len {
        let n = zeros.len().min((len - done) as usize);
        file.write_all_at(&zeros[..n], at + done)?;
        done += n as u64;
    }
    Ok(())
}

/// Reads up to `buf.len()` bytes at `at`; fewer only at the end of file.
pub(crate) fn read_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
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

//! The board's directory, checked before the board is made in it. The
//! board is node-wide and every container's user may reach it, so the
//! directory is where a neighbour would squat: a symbolic link at
//! `/tmp/vgpu-oversub` made root create a 0666 board wherever it pointed
//! (issue 26). So:
//! - a symbolic link as the directory is refused (its parents are not
//!   checked: they are the node's or the container's, like `/tmp`);
//! - the directory must belong to root or to this process's user;
//! - if others may write in it, it must be sticky (as `/tmp`), so nobody
//!   replaces a board another made;
//! - made here, it is mode 0755 (less the umask);
//! - where none is named, root's default is `/run/vgpu-oversub`, which
//!   only root can make ([`default_dir`]).
//!
//! The board is then opened relative to the directory checked
//! (`openat`), so a directory swapped after the check is not followed.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

/// The board's directory when none is named: `/run/vgpu-oversub` for root
/// (only root can make it, so nobody squats it), else `/tmp/vgpu-oversub`.
pub fn default_dir() -> std::path::PathBuf {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    std::path::PathBuf::from(if root {
        "/run/vgpu-oversub"
    } else {
        "/tmp/vgpu-oversub"
    })
}

/// Opens `dir` (making it if missing) after the checks above.
pub(crate) fn prepare(dir: &Path) -> io::Result<OwnedFd> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent)?;
            }
            match std::fs::DirBuilder::new().mode(0o755).create(dir) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    open_checked(dir)
}

/// Opens the directory `dir`, which must exist, after the checks above.
pub(crate) fn open_checked(dir: &Path) -> io::Result<OwnedFd> {
    open_owned(dir, true)
}

/// [`open_checked`], but a directory anybody may write without the
/// sticky bit will do (Volcano's device plugin makes `/tmp/vgpulock`
/// 0777): for the SM board, where a file swapped under its users costs
/// no more than a neighbour that takes no turns (`sm_board.rs`).
pub(crate) fn open_shared(dir: &Path) -> io::Result<OwnedFd> {
    open_owned(dir, false)
}

fn open_owned(dir: &Path, sticky_if_open: bool) -> io::Result<OwnedFd> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))?;
    // SAFETY: open with a NUL-terminated path; the descriptor is owned
    // below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(
            if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) {
                refused(dir, "is a symbolic link or not a directory")
            } else {
                e
            },
        );
    }
    // SAFETY: `fd` is a descriptor we just opened and nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let meta = File::from(fd.try_clone()?).metadata()?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let mode = if sticky_if_open {
        meta.mode()
    } else {
        meta.mode() & !0o022
    };
    check(dir, meta.uid(), mode, me)?;
    Ok(fd)
}

/// Whether a directory of owner `uid` and `mode` may hold the board for
/// user `me`.
fn check(dir: &Path, uid: u32, mode: u32, me: u32) -> io::Result<()> {
    if uid != 0 && uid != me {
        return Err(refused(
            dir,
            &format!("belongs to uid {uid}, neither root nor this process's user ({me})"),
        ));
    }
    if mode & 0o022 != 0 && mode & libc::S_ISVTX == 0 {
        return Err(refused(
            dir,
            &format!(
                "is writable by others (mode {:o}) and not sticky",
                mode & 0o7777
            ),
        ));
    }
    Ok(())
}

fn refused(dir: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("the directory {} {why}: refused", dir.display()),
    )
}

/// Opens (creating, mode 0666 less nothing) `name` inside `dir`, never
/// through a symbolic link. An existing file is opened without
/// `O_CREAT`: in a sticky directory anybody may write, the kernel refuses
/// `O_CREAT` on another user's file (`fs.protected_regular`).
pub(crate) fn open_in(dir: &OwnedFd, name: &str) -> io::Result<File> {
    let c = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the name"))?;
    let open = |create: libc::c_int| {
        // SAFETY: openat on a directory descriptor we own, with a
        // NUL-terminated name; the descriptor returned is owned below.
        unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDWR
                    | create
                    | libc::O_NOFOLLOW
                    | libc::O_CLOEXEC
                    | libc::O_NONBLOCK
                    | libc::O_NOCTTY,
                0o666 as libc::c_uint,
            )
        }
    };
    let mut fd = open(0);
    if fd < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
        fd = open(libc::O_CREAT);
    }
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Whether `dir` is a mount point in this process's mount namespace
/// (`/proc/self/mountinfo`): a `/tmp/vgpulock` that a container made
/// itself is not one, and would show it no other container.
pub fn is_mount_point(dir: &Path) -> bool {
    let Ok(dir) = std::fs::canonicalize(dir) else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = dir.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| unescape_mount(m) == want)
}

/// A mountinfo path, its `\ooo` escapes (space, tab, newline, backslash)
/// undone.
fn unescape_mount(m: &str) -> String {
    let mut out = String::with_capacity(m.len());
    let mut rest = m;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(char::from(c));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlinked_or_squatted_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        let link = dir.path().join("vgpu-oversub");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = prepare(&link).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(crate::board::Board::open(&link).is_err());
        assert!(!target.join(crate::board::BOARD_FILE).exists());
        // Another user's directory, or one anybody may write without the
        // sticky bit.
        assert!(check(&link, 1234, 0o40755, 0).is_err());
        assert!(check(&link, 0, 0o40777, 0).is_err());
        assert!(check(&link, 0, 0o41777, 1000).is_ok());
        assert!(check(&link, 1000, 0o40755, 1000).is_ok());
        // Made here: a real directory, not writable by others.
        let fresh = dir.path().join("a/b");
        prepare(&fresh).unwrap();
        let m = std::fs::symlink_metadata(&fresh).unwrap();
        assert!(m.is_dir() && m.mode() & 0o022 == 0);
    }

    #[test]
    fn mount_points_are_read_from_mountinfo() {
        assert!(is_mount_point(Path::new("/")));
        assert!(is_mount_point(Path::new("/proc")));
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mount_point(dir.path()));
        assert!(!is_mount_point(&dir.path().join("missing")));
        assert_eq!(unescape_mount("/a\\040b\\134c"), "/a b\\c");
        assert_eq!(unescape_mount("/odd\\x"), "/odd\\x");
    }
}

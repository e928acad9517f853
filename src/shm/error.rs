//! Why a region could not be used.
#![forbid(unsafe_code)]

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::layout::{MAGIC, PREFIX_LEN, Prefix, REGION_SIZE, STATE_READY, VERSION_MAJOR};

/// Why a file is not a region this library can use. Produced by [`check`],
/// before anything is mapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Shorter than the fixed prefix.
    Truncated {
        /// The file's length.
        len: u64,
    },
    /// Not a vgpu region at all (HAMi-core's file, random bytes, ...).
    BadMagic {
        /// The first eight bytes, as a little-endian number.
        found: u64,
    },
    /// Written by a newer vgpu whose layout this library does not know.
    NewerLayout {
        /// The file's layout version.
        major: u32,
        /// The file's minor layout version.
        minor: u32,
    },
    /// Written by an older vgpu.
    OlderLayout {
        /// The file's layout version.
        major: u32,
        /// The file's minor layout version.
        minor: u32,
    },
    /// The header describes another geometry (slot count, slot size, ...)
    /// than this library's layout.
    Geometry {
        /// The header field that disagrees.
        field: &'static str,
        /// Its value in the file.
        found: u64,
        /// Its value in this library's layout.
        expected: u64,
    },
    /// The header's size disagrees with the file or the layout.
    SizeMismatch {
        /// The size the header records.
        header_says: u64,
        /// The file's length.
        file_len: u64,
        /// The size of a region of this layout.
        expected: u64,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Truncated { len } => {
                write!(f, "file is {len} bytes, shorter than a region header")
            }
            Refusal::BadMagic { found } => write!(
                f,
                "wrong magic {found:#018x}: not a vgpu region (a HAMi-core cache file?)"
            ),
            Refusal::NewerLayout { major, minor } => write!(
                f,
                "layout version {major}.{minor} is newer than this library's {VERSION_MAJOR}.x"
            ),
            Refusal::OlderLayout { major, minor } => write!(
                f,
                "layout version {major}.{minor} is older than this library's {VERSION_MAJOR}.x"
            ),
            Refusal::Geometry {
                field,
                found,
                expected,
            } => write!(
                f,
                "layout mismatch: the header says {field} = {found}, this library's layout has {expected}"
            ),
            Refusal::SizeMismatch {
                header_says,
                file_len,
                expected,
            } => write!(
                f,
                "size mismatch: header says {header_says} bytes, file has {file_len}, layout needs {expected}"
            ),
        }
    }
}

/// Checks a region file from its first bytes and its length. Pure: the
/// fuzz target `region_check` drives it with arbitrary input.
///
/// `Ok(true)` means ready; `Ok(false)` means a region of our layout whose
/// creator died before it marked it ready (safe to initialise again under
/// the lock).
pub fn check(head: &[u8], file_len: u64) -> Result<bool, Refusal> {
    let Some(p) = Prefix::parse(head) else {
        return Err(Refusal::Truncated { len: file_len });
    };
    if file_len < PREFIX_LEN as u64 {
        return Err(Refusal::Truncated { len: file_len });
    }
    if p.magic != MAGIC {
        return Err(Refusal::BadMagic { found: p.magic });
    }
    if p.version_major > VERSION_MAJOR {
        return Err(Refusal::NewerLayout {
            major: p.version_major,
            minor: p.version_minor,
        });
    }
    if p.version_major < VERSION_MAJOR {
        return Err(Refusal::OlderLayout {
            major: p.version_major,
            minor: p.version_minor,
        });
    }
    let expected = REGION_SIZE as u64;
    if p.size != expected || file_len != expected {
        return Err(Refusal::SizeMismatch {
            header_says: p.size,
            file_len,
            expected,
        });
    }
    // Sizes agree: a geometry that differs is named (a slot count of
    // another build used to read "header says N bytes, file has N").
    for (field, found, want) in [
        ("header_size", p.header_size, crate::layout::HEADER_SIZE),
        ("slot_size", p.slot_size, crate::layout::SLOT_SIZE),
        ("max_devices", p.max_devices, crate::layout::MAX_DEVICES),
        ("max_slots", p.max_slots, crate::layout::MAX_SLOTS),
    ] {
        if found as usize != want {
            return Err(Refusal::Geometry {
                field,
                found: u64::from(found),
                expected: want as u64,
            });
        }
    }
    Ok(p.state == STATE_READY)
}

/// Why a region could not be opened, created or locked.
#[derive(Debug)]
pub enum ShmError {
    /// A system call on the file failed.
    Io {
        /// The region file.
        path: PathBuf,
        /// What was being done (`open for writing`, `mmap`, `lock`, ...).
        op: &'static str,
        /// The error the system gave.
        source: io::Error,
    },
    /// The file is not a region of this layout (see [`Refusal`]).
    Refused {
        /// The region file.
        path: PathBuf,
        /// Why it was refused.
        why: Refusal,
    },
    /// A symbolic link, directory, FIFO, device or hard link: never used.
    NotRegular {
        /// The region path.
        path: PathBuf,
        /// What is there instead.
        what: &'static str,
    },
    /// Owned by another user who is not root (see `file.rs`).
    ForeignOwner {
        /// The region file.
        path: PathBuf,
        /// Its owner's uid.
        owner: u32,
        /// This process's uid.
        me: u32,
    },
    /// The filesystem could not give the region its space (full tmpfs):
    /// mapping it anyway would end in SIGBUS.
    NoSpace {
        /// The region file.
        path: PathBuf,
        /// The error the system gave.
        source: io::Error,
    },
    /// The file shrank or was created again under our mapping.
    Tampered {
        /// The region file.
        path: PathBuf,
        /// What happened to it.
        why: crate::private::Tamper,
    },
    /// Every process slot is held by a live process.
    SlotsFull {
        /// The region file.
        path: PathBuf,
    },
    /// Every device entry is taken by another UUID.
    DevicesFull {
        /// The region file.
        path: PathBuf,
    },
}

impl ShmError {
    pub(crate) fn no_space(path: &std::path::Path, source: io::Error) -> ShmError {
        ShmError::NoSpace {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn io(path: &std::path::Path, op: &'static str, source: io::Error) -> ShmError {
        ShmError::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    }
}

impl ShmError {
    /// The file exists but this process may not write it (permissions, a
    /// read-only mount): the container's limits may live only there.
    pub fn cannot_write(&self) -> bool {
        matches!(self, ShmError::Io { op: "open for writing", source, .. }
            if matches!(source.raw_os_error(), Some(libc::EACCES | libc::EPERM | libc::EROFS)))
    }
}

impl fmt::Display for ShmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShmError::Io { path, op, source } => {
                write!(f, "region {}: {op} failed: {source}", path.display())
            }
            ShmError::Refused { path, why } => {
                write!(f, "region {} refused: {why}", path.display())
            }
            ShmError::NotRegular { path, what } => write!(
                f,
                "region {} refused: it is {what}, not a regular file of its own; never followed or modified",
                path.display()
            ),
            ShmError::ForeignOwner { path, owner, me } => write!(
                f,
                "region {} refused: owned by uid {owner}, neither this user (uid {me}) nor root, and whoever owns a region can change its limits (VGPU_REGION_ANY_OWNER=1 accepts any owner)",
                path.display()
            ),
            ShmError::NoSpace { path, source } => write!(
                f,
                "region {}: cannot reserve its {} bytes on disk ({source}); is the filesystem full?",
                path.display(),
                REGION_SIZE
            ),
            ShmError::Tampered { path, why } => write!(f, "region {}: {why}", path.display()),
            ShmError::SlotsFull { path } => write!(
                f,
                "region {}: all {} process slots are held by live processes",
                path.display(),
                crate::layout::MAX_SLOTS
            ),
            ShmError::DevicesFull { path } => write!(
                f,
                "region {}: all {} device entries are in use",
                path.display(),
                crate::layout::MAX_DEVICES
            ),
        }
    }
}

impl std::error::Error for ShmError {}

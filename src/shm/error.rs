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
    Truncated { len: u64 },
    /// Not a vgpu region at all (HAMi-core's file, random bytes, ...).
    BadMagic { found: u64 },
    /// Written by a newer vgpu whose layout this library does not know.
    NewerLayout { major: u32, minor: u32 },
    /// Written by an older vgpu.
    OlderLayout { major: u32, minor: u32 },
    /// The header's geometry or size disagrees with the file or the layout.
    SizeMismatch {
        header_says: u64,
        file_len: u64,
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
    let geometry_ok = p.header_size as usize == crate::layout::HEADER_SIZE
        && p.slot_size as usize == crate::layout::SLOT_SIZE
        && p.max_devices as usize == crate::layout::MAX_DEVICES
        && p.max_slots as usize == crate::layout::MAX_SLOTS;
    if p.size != expected || file_len != expected || !geometry_ok {
        return Err(Refusal::SizeMismatch {
            header_says: p.size,
            file_len,
            expected,
        });
    }
    Ok(p.state == STATE_READY)
}

/// Why a region could not be opened, created or locked.
#[derive(Debug)]
pub enum ShmError {
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    Refused {
        path: PathBuf,
        why: Refusal,
    },
    /// The filesystem could not give the region its space (full tmpfs):
    /// mapping it anyway would end in SIGBUS.
    NoSpace {
        path: PathBuf,
        source: io::Error,
    },
    /// The file shrank or was created again under our mapping.
    Tampered {
        path: PathBuf,
        why: crate::private::Tamper,
    },
    /// Every process slot is held by a live process.
    SlotsFull {
        path: PathBuf,
    },
    /// Every device entry is taken by another UUID.
    DevicesFull {
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

impl fmt::Display for ShmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShmError::Io { path, op, source } => {
                write!(f, "region {}: {op} failed: {source}", path.display())
            }
            ShmError::Refused { path, why } => {
                write!(f, "region {} refused: {why}", path.display())
            }
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

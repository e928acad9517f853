//! Why a region could not be used.
#![forbid(unsafe_code)]

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::layout::{FILE_SIZE, VERSION_MAJOR};

/// Why a file is not a region this library can use. Produced by
/// [`check`](crate::check) before anything is mapped, or when a HAMi-core
/// file cannot be adopted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Shorter than the fixed prefix.
    Truncated {
        /// The file's length.
        len: u64,
    },
    /// Neither a vgpu region nor HAMi's (random bytes, ...).
    BadMagic {
        /// The first eight bytes, as a little-endian number.
        found: u64,
    },
    /// HAMi's magic, but a layout version or size other than 1.2: its
    /// fields cannot be told apart, so it is neither read nor modified.
    HamiCoreVersion {
        /// Its major version.
        major: u32,
        /// Its minor version.
        minor: u32,
        /// The file's length.
        len: u64,
    },
    /// HAMi-core's file (layout 1.2), still mapped by HAMi-core processes:
    /// their accounting cannot be shared. Its limits are given, so that
    /// this process can be held to them alone.
    HamiCoreInUse {
        /// The HAMi-core processes that map it (pids in the container).
        pids: Vec<i32>,
        /// The limits it holds.
        limits: Vec<HamiLimit>,
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

/// One device's limits, as a HAMi-core file stores them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HamiLimit {
    /// The device index (the container's device number).
    pub index: usize,
    /// The UUID string, empty when the file names none.
    pub uuid: String,
    /// Bytes, 0 for none.
    pub mem: u64,
    /// Percent, 0 for none (HAMi's 100 reads as 0).
    pub sm: u32,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Truncated { len } => {
                write!(f, "file is {len} bytes, shorter than a region header")
            }
            Refusal::BadMagic { found } => write!(
                f,
                "wrong magic {found:#018x}: neither a vgpu region nor a HAMi-core one; it is left as it is (delete it to let vgpu create its region there)"
            ),
            Refusal::HamiCoreVersion { major, minor, len } => write!(
                f,
                "a HAMi-core region of layout {major}.{minor} ({len} bytes), which vgpu cannot read (it adopts layout 1.2 only); it is left as it is: delete it once no process of the container uses it, and vgpu creates its own"
            ),
            Refusal::HamiCoreInUse { pids, limits } => {
                let pids: Vec<String> = pids.iter().map(i32::to_string).collect();
                let limits: Vec<String> = limits
                    .iter()
                    .map(|l| {
                        format!(
                            "device {} {} memory {} SM {}%",
                            l.index, l.uuid, l.mem, l.sm
                        )
                    })
                    .collect();
                write!(
                    f,
                    "HAMi-core's region (layout 1.2), still used by HAMi-core processes (pids {}), whose accounting vgpu cannot share; its limits ({}) bind this process alone. Delete the file once those processes have exited (or restart the container): vgpu then adopts it, limits kept",
                    pids.join(", "),
                    if limits.is_empty() {
                        "none".to_string()
                    } else {
                        limits.join("; ")
                    }
                )
            }
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
        why: Tamper,
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
                FILE_SIZE
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

/// Why the mapped file can no longer be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tamper {
    /// The file is shorter than a region: its pages would raise SIGBUS.
    Shrunk {
        /// The file's length now.
        len: u64,
    },
    /// The file holds another region than the one mapped (it was
    /// truncated and created again): our slot is not in it.
    Replaced,
}

impl fmt::Display for Tamper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tamper::Shrunk { len } => write!(
                f,
                "the file shrank to {len} bytes under this process (a region is {FILE_SIZE})"
            ),
            Tamper::Replaced => write!(f, "the file was truncated and created again"),
        }
    }
}

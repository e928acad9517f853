//! What a region file is, told from its first bytes, the bytes at
//! [`VGPU_OFFSET`] and its length, before anything is mapped. Pure: the
//! fuzz target `region_check` drives [`check`] with arbitrary input.
//!
//! A node may hold three kinds of region file:
//! - vgpu's layout 2.x ([`Format::Vgpu`]): HAMi's layout 1.2 first, then
//!   vgpu's part with its `VGPUSHM` header at [`VGPU_OFFSET`], the marker
//!   that tells vgpu the file is its own;
//! - vgpu's layout 1.x ([`Format::VgpuLegacy`]): `VGPUSHM` at offset 0,
//!   written by vgpu before issue 11;
//! - HAMi-core's layout 1.2 ([`Format::HamiCore`]): HAMi's magic at
//!   offset 0 and no vgpu part.
//!
//! Anything else is a [`Refusal`] naming what was found.
#![forbid(unsafe_code)]

use std::fs::File;
use std::path::Path;

use crate::error::Refusal;
use crate::hami::layout::{HAMI_MAGIC, HAMI_MAJOR, HAMI_MINOR, HAMI_SIZE};
use crate::layout::{
    FILE_SIZE, HEADER_SIZE, LEGACY_MAJOR, LEGACY_SIZE, MAGIC, MAX_DEVICES, MAX_SLOTS, PREFIX_LEN,
    Prefix, SLOT_SIZE, STATE_READY, VERSION_MAJOR, VGPU_OFFSET,
};

/// Which layout a region file has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// vgpu's layout 2.x: HAMi's layout 1.2, then vgpu's part at
    /// [`VGPU_OFFSET`].
    Vgpu {
        /// The vgpu part's major version.
        major: u32,
        /// The vgpu part's minor version.
        minor: u32,
    },
    /// vgpu's layout 1.x: its part alone at offset 0 (vgpu before issue
    /// 11). Node monitors cannot read it.
    VgpuLegacy {
        /// Major version (1).
        major: u32,
        /// Minor version.
        minor: u32,
    },
    /// HAMi-core's file: HAMi's layout, no vgpu part.
    HamiCore {
        /// HAMi's major version (1).
        major: u32,
        /// HAMi's minor version (2).
        minor: u32,
    },
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Format::Vgpu { major, minor } => {
                write!(f, "vgpu {major}.{minor} (HAMi layout 1.2 + vgpu part)")
            }
            Format::VgpuLegacy { major, minor } => write!(f, "vgpu {major}.{minor} (legacy)"),
            Format::HamiCore { major, minor } => write!(f, "HAMi-core {major}.{minor}"),
        }
    }
}

/// A file as [`classify`] found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// vgpu's layout 2.x.
    Vgpu {
        /// The vgpu part is initialised (`state` READY).
        ready: bool,
        /// The HAMi part carries HAMi's magic and version 1.2. Without it
        /// (a creation or an upgrade stopped half-way) it is written again.
        hami_ready: bool,
        /// The vgpu part's minor version.
        minor: u32,
    },
    /// vgpu's layout 1.x.
    VgpuLegacy {
        /// Initialised (`state` READY).
        ready: bool,
        /// The minor version.
        minor: u32,
    },
    /// HAMi-core's layout 1.2.
    HamiCore,
}

impl Found {
    /// The file's [`Format`].
    pub fn format(self) -> Format {
        match self {
            Found::Vgpu { minor, .. } => Format::Vgpu {
                major: VERSION_MAJOR,
                minor,
            },
            Found::VgpuLegacy { minor, .. } => Format::VgpuLegacy {
                major: LEGACY_MAJOR,
                minor,
            },
            Found::HamiCore => Format::HamiCore {
                major: HAMI_MAJOR,
                minor: HAMI_MINOR,
            },
        }
    }
}

/// Bytes of the file [`check`] looks at: up to the end of the vgpu part's
/// prefix.
pub const HEAD_LEN: usize = VGPU_OFFSET + PREFIX_LEN;

/// [`classify`] on the first bytes of a file (as many as it has, up to
/// [`HEAD_LEN`]) and its length.
pub fn check(head: &[u8], file_len: u64) -> Result<Found, Refusal> {
    let part = head.get(VGPU_OFFSET..).unwrap_or(&[]);
    classify(head, part, file_len)
}

/// What a file is: `start` holds its first bytes (at least [`PREFIX_LEN`]
/// when it has them), `part` the bytes at [`VGPU_OFFSET`] (empty when the
/// file is shorter), `file_len` its length.
pub fn classify(start: &[u8], part: &[u8], file_len: u64) -> Result<Found, Refusal> {
    let u32_at = |b: &[u8], o: usize| {
        b.get(o..o + 4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    };
    let (Some(word0), Some(major0)) = (u32_at(start, 0), u32_at(start, 4)) else {
        return Err(Refusal::Truncated { len: file_len });
    };
    let minor0 = u32_at(start, 8).unwrap_or(0);
    let hami_magic = word0 as i32 == HAMI_MAGIC;
    let ours = Prefix::parse(part).filter(|p| p.magic == MAGIC);
    if let Some(p) = ours.filter(|_| file_len >= FILE_SIZE as u64) {
        let ready = vgpu_part(&p, file_len, VERSION_MAJOR, FILE_SIZE)?;
        return Ok(Found::Vgpu {
            ready,
            hami_ready: hami_magic && major0 == HAMI_MAJOR && minor0 == HAMI_MINOR,
            minor: p.version_minor,
        });
    }
    if let Some(p) = Prefix::parse(start).filter(|p| p.magic == MAGIC) {
        let ready = vgpu_part(&p, file_len, LEGACY_MAJOR, LEGACY_SIZE)?;
        return Ok(Found::VgpuLegacy {
            ready,
            minor: p.version_minor,
        });
    }
    if hami_magic {
        if (major0, minor0) == (HAMI_MAJOR, HAMI_MINOR) && file_len < HAMI_SIZE as u64 {
            return Err(Refusal::Truncated { len: file_len });
        }
        if major0 != HAMI_MAJOR || minor0 != HAMI_MINOR || file_len > FILE_SIZE as u64 {
            return Err(Refusal::HamiCoreVersion {
                major: major0,
                minor: minor0,
                len: file_len,
            });
        }
        return Ok(Found::HamiCore);
    }
    // A file of exactly our size that is zero at both headers: our own
    // creator stopped before writing either (we hold the lock now).
    if file_len == FILE_SIZE as u64 && is_zero(start) && is_zero(part) && !part.is_empty() {
        return Ok(Found::Vgpu {
            ready: false,
            hami_ready: false,
            minor: 0,
        });
    }
    let found = start.get(..8).map_or(u64::from(word0), |b| {
        u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))
    });
    Err(Refusal::BadMagic { found })
}

fn is_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// Checks a vgpu part's prefix against the layout `major` and `size`;
/// returns whether it is ready.
fn vgpu_part(p: &Prefix, file_len: u64, major: u32, size: usize) -> Result<bool, Refusal> {
    if p.version_major > major {
        return Err(Refusal::NewerLayout {
            major: p.version_major,
            minor: p.version_minor,
        });
    }
    if p.version_major < major {
        return Err(Refusal::OlderLayout {
            major: p.version_major,
            minor: p.version_minor,
        });
    }
    let expected = size as u64;
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
        ("header_size", p.header_size, HEADER_SIZE),
        ("slot_size", p.slot_size, SLOT_SIZE),
        ("max_devices", p.max_devices, MAX_DEVICES),
        ("max_slots", p.max_slots, MAX_SLOTS),
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

/// A file opened and locked, and what it was found to be (None: empty,
/// to be created).
pub(crate) struct Locked<'a> {
    pub file: &'a File,
    pub path: &'a Path,
    pub len: u64,
    pub found: Option<Found>,
}

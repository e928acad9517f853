//! A mapped region: where its parts lie, typed access to them, and private
//! anonymous regions. Opening a file is `open.rs`.

use std::fs::File;
use std::hash::{BuildHasher, RandomState};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use memmap2::{MmapOptions, MmapRaw};

use crate::error::ShmError;
use crate::file::{DEFAULT_CREATE_MODE, FileOptions};
use crate::format::Format;
use crate::hami::layout::HamiRegion;
use crate::index::{EntryIndex, SlotIndex};
use crate::layout::{
    DeviceEntry, FILE_SIZE, HEADER_SIZE, Header, LEGACY_SIZE, MAGIC, MAX_DEVICES, MAX_SLOTS,
    ProcSlot, SLOT_SIZE, STATE_READY, VERSION_MAJOR, VERSION_MINOR, VGPU_OFFSET,
};
use crate::lock::{LocalLock, RegionGuard};

/// Whether [`Region::open`] may create the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Create the file when it does not exist.
    CreateIfMissing,
    /// Only attach to an existing file.
    ExistingOnly,
}

/// A mapped region. Everything in it is atomic; see `layout.rs`.
pub struct Region {
    /// Repairs a SIGBUS in `map` (a file truncated under us); dropped
    /// first, before `map` is unmapped. Only held, never read.
    _watch: Option<crate::sigbus::Watch>,
    pub(crate) map: MmapRaw,
    pub(crate) file: Option<File>,
    path: PathBuf,
    pub(crate) local: LocalLock,
    /// `Header::region_id` of the file when it was mapped.
    pub(crate) mapped_id: u64,
    /// The mapping was replaced by a private copy (see `private.rs`).
    pub(crate) private: AtomicBool,
    /// Where vgpu's part lies in the mapping.
    shape: Shape,
    /// This open wrote the HAMi part afresh (`Region::created`).
    pub(crate) created: bool,
}

/// Where vgpu's part lies in a mapping, and how long the mapping is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Offset of vgpu's header.
    pub base: usize,
    /// Bytes mapped (the whole file).
    pub len: usize,
}

impl Shape {
    /// Layout 2.x: HAMi's layout, then vgpu's part.
    pub const CURRENT: Shape = Shape {
        base: VGPU_OFFSET,
        len: FILE_SIZE,
    };
    /// Layout 1.x: vgpu's part alone.
    pub const LEGACY: Shape = Shape {
        base: 0,
        len: LEGACY_SIZE,
    };
}

impl Region {
    /// Opens (and with [`OpenMode::CreateIfMissing`], creates) the region at
    /// `path`. A file that is not a region of this layout is refused with the
    /// reason; it is never modified.
    pub fn open(path: &Path, mode: OpenMode) -> Result<Region, ShmError> {
        let create = match mode {
            OpenMode::CreateIfMissing => Some(DEFAULT_CREATE_MODE),
            OpenMode::ExistingOnly => None,
        };
        Region::open_with(
            path,
            FileOptions {
                create,
                any_owner: false,
            },
        )
    }

    /// A region in private anonymous memory: the same accounting, for this
    /// process alone (used when the shared file cannot be used).
    pub fn anonymous() -> Result<Region, ShmError> {
        Region::anonymous_shaped(Shape::CURRENT)
    }

    /// A private region of the given shape (a private copy keeps the shape
    /// of the region it replaces).
    pub(crate) fn anonymous_shaped(shape: Shape) -> Result<Region, ShmError> {
        let path = PathBuf::from("<private>");
        let map = MmapOptions::new()
            .len(shape.len)
            .map_anon()
            .map_err(|e| ShmError::io(&path, "mmap", e))?;
        let region = Region::from_map(map.into(), shape, None, path, None);
        initialise(region.header());
        if let Some(h) = region.hami() {
            crate::hami::fill::initialise(h);
        }
        Ok(region.with_mapped_id())
    }

    /// A region over `map`, which is `shape.len` bytes.
    pub(crate) fn from_map(
        map: MmapRaw,
        shape: Shape,
        file: Option<File>,
        path: PathBuf,
        watch: Option<crate::sigbus::Watch>,
    ) -> Region {
        debug_assert!(map.len() >= shape.len);
        Region {
            _watch: watch,
            map,
            file,
            path,
            local: LocalLock::new(),
            mapped_id: 0,
            private: AtomicBool::new(false),
            shape,
            created: false,
        }
    }

    /// Records the id of the region now in the mapping.
    pub(crate) fn with_mapped_id(mut self) -> Region {
        self.mapped_id = self.header().region_id.load(Ordering::Acquire);
        self
    }
    /// The file's path (`<private>` for a private region).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this region is shared through a file (not private memory).
    pub fn is_shared(&self) -> bool {
        self.file.is_some() && !self.private.load(Ordering::Acquire)
    }

    /// The file, while the region is shared through it.
    pub(crate) fn shared_file(&self) -> Option<&File> {
        self.file
            .as_ref()
            .filter(|_| !self.private.load(Ordering::Acquire))
    }

    /// The header, which holds the device table.
    pub fn header(&self) -> &Header {
        // SAFETY: every mapping of a Region is `shape.len` bytes,
        // page-aligned, and outlives the returned reference (it borrows
        // self); `shape.base + HEADER_SIZE <= shape.len` and `base` is a
        // multiple of 8; Header is repr(C), made only of atomics (every bit
        // pattern is valid).
        unsafe { &*(self.map.as_ptr().add(self.shape.base) as *const Header) }
    }

    /// The HAMi part that node monitors read, when the file has one (not
    /// in vgpu's layout 1.x).
    pub fn hami(&self) -> Option<&HamiRegion> {
        if self.shape.base == 0 {
            return None;
        }
        // SAFETY: a shape with a vgpu part at a non-zero base maps the
        // HAMi layout (HAMI_SIZE <= base) at offset 0 of a page-aligned
        // mapping that outlives the reference; HamiRegion is repr(C),
        // atomics only, valid for any bit pattern.
        Some(unsafe { &*(self.map.as_ptr() as *const HamiRegion) })
    }

    /// The file's layout.
    pub fn format(&self) -> Format {
        let h = self.header();
        let (major, minor) = (
            h.version_major.load(Ordering::Relaxed),
            h.version_minor.load(Ordering::Relaxed),
        );
        if self.shape.base == 0 {
            Format::VgpuLegacy { major, minor }
        } else {
            Format::Vgpu { major, minor }
        }
    }

    /// Whether this open wrote the file's HAMi part afresh (a new region, or
    /// one upgraded from vgpu's layout 1.x): the settings HAMi takes from
    /// the creator's environment (`priority`) are the opener's to write.
    pub fn created(&self) -> bool {
        self.created
    }

    /// The mapping's shape.
    pub(crate) fn shape(&self) -> Shape {
        self.shape
    }

    /// Device entry `index`.
    pub fn device(&self, index: EntryIndex) -> &DeviceEntry {
        &self.header().devices[index.get()]
    }

    /// Slot `index`.
    pub fn slot(&self, index: SlotIndex) -> &ProcSlot {
        let offset = self.shape.base + HEADER_SIZE + index.get() * SLOT_SIZE;
        // SAFETY: offset + SLOT_SIZE <= shape.len (a SlotIndex is below
        // MAX_SLOTS, and base + REGION_SIZE == len), the offset is 8-aligned
        // (base, HEADER_SIZE and SLOT_SIZE are multiples of 8), and ProcSlot
        // is repr(C) atomics only, valid for any bit pattern.
        unsafe { &*(self.map.as_ptr().add(offset) as *const ProcSlot) }
    }

    /// Number of slots worth scanning: one past the highest ever claimed.
    pub fn slot_hwm(&self) -> usize {
        (self.header().slot_hwm.load(Ordering::Acquire) as usize).min(MAX_SLOTS)
    }

    /// Takes the region lock (in-process mutex, then the file's OFD lock).
    /// The file is checked once the lock is held (waiting for it can take
    /// a while): a truncated file is [`ShmError::Tampered`], not a SIGBUS.
    pub fn lock(&self) -> Result<RegionGuard<'_>, ShmError> {
        let guard = RegionGuard::acquire(&self.local, self.shared_file())
            .map_err(|e| ShmError::io(&self.path, "lock", e))?;
        self.check_intact().map_err(|why| ShmError::Tampered {
            path: self.path.clone(),
            why,
        })?;
        Ok(guard)
    }

    /// The in-process half of the lock, for `pthread_atfork` handlers: hold
    /// it across `fork` so the child never inherits a half-done change.
    pub fn fork_lock(&self) -> &LocalLock {
        &self.local
    }
}

/// Writes a fresh header; `state` goes READY last, with Release ordering.
pub(crate) fn initialise(h: &Header) {
    h.version_major.store(VERSION_MAJOR, Ordering::Relaxed);
    h.version_minor.store(VERSION_MINOR, Ordering::Relaxed);
    h.size.store(FILE_SIZE as u64, Ordering::Relaxed);
    h.header_size.store(HEADER_SIZE as u32, Ordering::Relaxed);
    h.slot_size.store(SLOT_SIZE as u32, Ordering::Relaxed);
    h.max_devices.store(MAX_DEVICES as u32, Ordering::Relaxed);
    h.max_slots.store(MAX_SLOTS as u32, Ordering::Relaxed);
    h.slot_hwm.store(0, Ordering::Relaxed);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    h.created_unix_s.store(now, Ordering::Relaxed);
    let [hi, lo] = crate::procinfo::boot_id().unwrap_or([0, 0]);
    h.boot_id[0].store(hi, Ordering::Relaxed);
    h.boot_id[1].store(lo, Ordering::Relaxed);
    // Never 0: 0 is what a file re-created as zeros would show.
    let id = RandomState::new().hash_one((now, std::process::id())) | 1;
    h.region_id.store(id, Ordering::Relaxed);
    h.magic.store(MAGIC, Ordering::Relaxed);
    h.state.store(STATE_READY, Ordering::Release);
}

/// Maps `shape.len` bytes of `file` as a region of that shape.
pub(crate) fn map(file: &File, path: &Path, shape: Shape) -> Result<Region, ShmError> {
    let map: MmapRaw = MmapOptions::new()
        .len(shape.len)
        .map_raw(file)
        .map_err(|e| ShmError::io(path, "mmap", e))?;
    let watch = crate::sigbus::Watch::new(map.as_ptr(), shape.len);
    Ok(Region::from_map(
        map,
        shape,
        None,
        path.to_path_buf(),
        watch,
    ))
}

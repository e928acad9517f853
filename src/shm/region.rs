//! Mapping a region: create or attach a file under the lock, validate it
//! before it is mapped, or make a private anonymous one.

use std::fs::File;
use std::hash::{BuildHasher, RandomState};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use memmap2::{MmapOptions, MmapRaw};

use crate::error::{ShmError, check};
use crate::file::{DEFAULT_CREATE_MODE, FileOptions};
use crate::index::{EntryIndex, SlotIndex};
use crate::layout::{
    DeviceEntry, HEADER_SIZE, Header, MAGIC, MAX_DEVICES, MAX_SLOTS, PREFIX_LEN, ProcSlot,
    REGION_SIZE, SLOT_SIZE, STATE_READY, VERSION_MAJOR, VERSION_MINOR,
};
use crate::lock::{LocalLock, RegionGuard};
use crate::{boot, space};

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
    file: Option<File>,
    path: PathBuf,
    local: LocalLock,
    /// `Header::region_id` of the file when it was mapped.
    pub(crate) mapped_id: u64,
    /// The mapping was replaced by a private copy (see `private.rs`).
    pub(crate) private: AtomicBool,
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

    /// [`Region::open`] with the file's creation mode and owner policy.
    pub fn open_with(path: &Path, opts: FileOptions) -> Result<Region, ShmError> {
        let create = opts.create.is_some();
        let (file, _created) = crate::file::open(path, opts)?;
        let local = LocalLock::new();
        let guard =
            RegionGuard::acquire(&local, Some(&file)).map_err(|e| ShmError::io(path, "lock", e))?;
        let len = file
            .metadata()
            .map_err(|e| ShmError::io(path, "stat", e))?
            .len();
        let ready = if len == 0 && create {
            false
        } else {
            let mut head = [0u8; PREFIX_LEN];
            let n = read_prefix(&file, &mut head).map_err(|e| ShmError::io(path, "read", e))?;
            check(&head[..n], len).map_err(|why| ShmError::Refused {
                path: path.to_path_buf(),
                why,
            })?
        };
        if !ready {
            // New, or its creator died half-way (we hold the lock, so nobody
            // can be using it): (re)initialise.
            // Truncating to zero first zeroes every slot and device entry.
            file.set_len(0)
                .map_err(|e| ShmError::io(path, "ftruncate", e))?;
            if let Err(e) = space::reserve_new(&file, REGION_SIZE as u64) {
                // Left empty: the next process tries again.
                let _ = file.set_len(0);
                return Err(ShmError::no_space(path, e));
            }
            // The mode is left as it is: `file.rs` set it when vgpu created
            // the file, and a file someone else made keeps theirs.
        } else {
            space::reserve_existing(&file, REGION_SIZE as u64)
                .map_err(|e| ShmError::no_space(path, e))?;
        }
        let map = MmapOptions::new()
            .len(REGION_SIZE)
            .map_raw(&file)
            .map_err(|e| ShmError::io(path, "mmap", e))?;
        let mut region = Region {
            _watch: crate::sigbus::Watch::new(map.as_ptr(), REGION_SIZE),
            map,
            file: None,
            path: path.to_path_buf(),
            local: LocalLock::new(),
            mapped_id: 0,
            private: AtomicBool::new(false),
        };
        if ready {
            region.settle_boot(&guard, boot::current());
        } else {
            initialise(region.header());
        }
        region.mapped_id = region.header().region_id.load(Ordering::Acquire);
        drop(guard);
        region.local = local;
        region.file = Some(file);
        Ok(region)
    }

    /// A region in private anonymous memory: the same accounting, for this
    /// process alone (used when the shared file cannot be used).
    pub fn anonymous() -> Result<Region, ShmError> {
        let path = PathBuf::from("<private>");
        let map = MmapOptions::new()
            .len(REGION_SIZE)
            .map_anon()
            .map_err(|e| ShmError::io(&path, "mmap", e))?;
        let map: MmapRaw = map.into();
        initialise(header_in(&map));
        Ok(Region::in_private(map, path))
    }

    /// A region over `map`, private memory of [`REGION_SIZE`] bytes that
    /// already holds one (initialised, or a copy of a file).
    pub(crate) fn in_private(map: MmapRaw, path: PathBuf) -> Region {
        debug_assert!(map.len() >= REGION_SIZE);
        let mapped_id = header_in(&map).region_id.load(Ordering::Acquire);
        Region {
            _watch: None,
            map,
            file: None,
            path,
            local: LocalLock::new(),
            mapped_id,
            private: AtomicBool::new(false),
        }
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
        header_in(&self.map)
    }

    /// Device entry `index`.
    pub fn device(&self, index: EntryIndex) -> &DeviceEntry {
        &self.header().devices[index.get()]
    }

    /// Slot `index`.
    pub fn slot(&self, index: SlotIndex) -> &ProcSlot {
        let offset = HEADER_SIZE + index.get() * SLOT_SIZE;
        // SAFETY: offset + SLOT_SIZE <= REGION_SIZE (a SlotIndex is below MAX_SLOTS), the
        // offset is 8-aligned (HEADER_SIZE and SLOT_SIZE are multiples of 8),
        // and ProcSlot is repr(C) atomics only, valid for any bit pattern.
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

fn read_prefix(file: &File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The header at the start of a mapping of REGION_SIZE bytes.
fn header_in(map: &MmapRaw) -> &Header {
    debug_assert!(map.len() >= REGION_SIZE);
    // SAFETY: every mapping made here is REGION_SIZE bytes, page-aligned, and
    // outlives the returned reference (it borrows `map`); Header is repr(C),
    // made only of atomics (every bit pattern is valid), and HEADER_SIZE <=
    // REGION_SIZE.
    unsafe { &*(map.as_ptr() as *const Header) }
}

/// Writes a fresh header; `state` goes READY last, with Release ordering.
pub(crate) fn initialise(h: &Header) {
    h.version_major.store(VERSION_MAJOR, Ordering::Relaxed);
    h.version_minor.store(VERSION_MINOR, Ordering::Relaxed);
    h.size.store(REGION_SIZE as u64, Ordering::Relaxed);
    h.header_size.store(HEADER_SIZE as u32, Ordering::Relaxed);
    h.slot_size.store(SLOT_SIZE as u32, Ordering::Relaxed);
    h.max_devices.store(MAX_DEVICES as u32, Ordering::Relaxed);
    h.max_slots.store(MAX_SLOTS as u32, Ordering::Relaxed);
    h.slot_hwm.store(0, Ordering::Relaxed);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    h.created_unix_s.store(now, Ordering::Relaxed);
    let [hi, lo] = boot::current().unwrap_or([0, 0]);
    h.boot_id[0].store(hi, Ordering::Relaxed);
    h.boot_id[1].store(lo, Ordering::Relaxed);
    // Never 0: 0 is what a file re-created as zeros would show.
    let id = RandomState::new().hash_one((now, std::process::id())) | 1;
    h.region_id.store(id, Ordering::Relaxed);
    h.magic.store(MAGIC, Ordering::Relaxed);
    h.state.store(STATE_READY, Ordering::Release);
}

//! The oversubscription board: one small file per node
//! (`VGPU_OVERSUBSCRIBE_DIR/vgpu-oversub.board`) that every process of
//! every oversubscribed container maps, whatever its region. Containers
//! share nothing else, yet a process that waits for room on a card must
//! be seen by the idle processes of other containers on that card.
//!
//! Each process owns one [`BoardEntry`] for life: what it holds on which
//! cards, whether it is running, suspended (its device memory on the
//! host) or restoring, what it waits for, and counters for `vgpuctl`.
//! Liveness is a POSIX record lock on the entry's byte past the end of the
//! file, held by its owner: the kernel drops it when the owner dies, in
//! any pid namespace, so a killed process's entry (and the host memory it
//! counted) stops counting at once. Every field is an atomic.

use std::fs::{File, OpenOptions};
use std::io;
use std::mem::size_of;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};

pub use crate::board_dir::default_dir;

mod entry;

pub use crate::procinfo::monotonic_ns;
pub use entry::{BOARD_CARDS, BoardEntry, ProcState};

/// `"VGPUOVS\0"` read as a little-endian `u64`.
pub const BOARD_MAGIC: u64 = u64::from_le_bytes(*b"VGPUOVS\0");
/// Bumped when the layout changes; other versions are refused.
pub const BOARD_VERSION: u32 = 2;
/// Processes on the board at once (every oversubscribed process of the node).
pub const BOARD_ENTRIES: usize = 256;
/// The board's file name in its directory.
pub const BOARD_FILE: &str = "vgpu-oversub.board";

/// The board's header.
#[repr(C)]
pub struct BoardHeader {
    /// [`BOARD_MAGIC`] once initialised.
    pub magic: AtomicU64,
    /// [`BOARD_VERSION`].
    pub version: AtomicU32,
    /// [`BOARD_ENTRIES`].
    pub entries: AtomicU32,
    _reserved: [AtomicU64; 6],
}

const HEADER_SIZE: usize = 4096;
/// The file's size.
pub const BOARD_SIZE: usize = HEADER_SIZE + BOARD_ENTRIES * size_of::<BoardEntry>();

const _: () = assert!(size_of::<BoardHeader>() <= HEADER_SIZE);
const _: () = assert!(size_of::<BoardEntry>() == 256);

/// Why a board cannot be used.
#[derive(Debug)]
pub enum BoardError {
    /// Opening, sizing or mapping the file failed.
    Io(PathBuf, io::Error),
    /// The file is not a board of this version.
    Foreign(PathBuf),
    /// Every entry is taken by a live process.
    Full(PathBuf),
}

impl std::fmt::Display for BoardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BoardError::Io(p, e) => write!(f, "oversubscription board {}: {e}", p.display()),
            BoardError::Foreign(p) => write!(
                f,
                "oversubscription board {}: not a vgpu board of version {BOARD_VERSION}",
                p.display()
            ),
            BoardError::Full(p) => write!(
                f,
                "oversubscription board {}: all {BOARD_ENTRIES} entries are taken",
                p.display()
            ),
        }
    }
}

impl std::error::Error for BoardError {}

/// A mapped board.
pub struct Board {
    /// Declared before `map`: dropped (unwatched) before it is unmapped.
    _watch: Option<crate::sigbus::Watch>,
    map: MmapRaw,
    /// The one descriptor of the file this process keeps: closing another
    /// would drop this process's record locks on it.
    file: File,
    path: PathBuf,
}

impl Board {
    /// Opens (creating, mode 0666 whatever the umask, so containers of
    /// several users share it) the board in `dir`.
    pub fn open(dir: &Path) -> Result<Board, BoardError> {
        let path = dir.join(BOARD_FILE);
        let io_err = |e| BoardError::Io(path.clone(), e);
        let dir_fd = crate::board_dir::prepare(dir).map_err(io_err)?;
        let file = crate::board_dir::open_in(&dir_fd, BOARD_FILE).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        if !meta.is_file() {
            return Err(BoardError::Foreign(path));
        }
        // Made by us just now (or by someone whose umask narrowed it).
        if meta.len() == 0 && meta.permissions().mode() & 0o777 != 0o666 {
            let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
        }
        // SAFETY: flock on a descriptor we own; released below.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        let sized = if meta.len() < BOARD_SIZE as u64 {
            if meta.len() != 0 {
                // SAFETY: as above.
                unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
                return Err(BoardError::Foreign(path));
            }
            file.set_len(BOARD_SIZE as u64)
        } else {
            Ok(())
        };
        let mapped = sized.and_then(|()| MmapOptions::new().len(BOARD_SIZE).map_raw(&file));
        let map = match mapped {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: as above.
                unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
                return Err(io_err(e));
            }
        };
        // Anyone may cut the file short under its users: a fault in its
        // pages is repaired (zeros), never a SIGBUS (`intact` then says so).
        let board = Board {
            _watch: crate::sigbus::Watch::new(map.as_ptr(), BOARD_SIZE),
            map,
            file,
            path,
        };
        let h = board.header();
        if h.magic.load(Ordering::Acquire) == 0 {
            h.version.store(BOARD_VERSION, Ordering::Relaxed);
            h.entries.store(BOARD_ENTRIES as u32, Ordering::Relaxed);
            h.magic.store(BOARD_MAGIC, Ordering::Release);
        }
        // SAFETY: as above.
        unsafe { libc::flock(board.file.as_raw_fd(), libc::LOCK_UN) };
        if h.magic.load(Ordering::Acquire) != BOARD_MAGIC
            || h.version.load(Ordering::Acquire) != BOARD_VERSION
            || h.entries.load(Ordering::Acquire) as usize != BOARD_ENTRIES
        {
            return Err(BoardError::Foreign(board.path));
        }
        Ok(board)
    }

    /// A private copy of the board in `dir`, for those who only look
    /// (`vgpuctl oversub`, `vgpuctl serve`): read with `pread` from a
    /// read-only descriptor, so nothing in the file changes, a read-only
    /// mount will do, and a file cut short meanwhile is an error, never a
    /// SIGBUS. Figures are as they were when read; liveness
    /// ([`Board::others`]) is still asked of the file's locks. Writes to
    /// the copy go nowhere. `Ok(None)`: no board there, or one its creator
    /// has not finished making. Not for a process that holds an entry:
    /// dropping the copy closes a descriptor of the file, which drops that
    /// process's record locks (POSIX).
    pub fn read_copy(dir: &Path) -> Result<Option<Board>, BoardError> {
        let path = dir.join(BOARD_FILE);
        let io_err = |e| BoardError::Io(path.clone(), e);
        // O_NONBLOCK: a FIFO in its place must not hang the open.
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(e)),
        };
        let meta = file.metadata().map_err(io_err)?;
        if !meta.is_file() || (meta.len() != 0 && meta.len() < BOARD_SIZE as u64) {
            return Err(BoardError::Foreign(path));
        }
        if meta.len() == 0 {
            return Ok(None);
        }
        let mut copy = MmapOptions::new()
            .len(BOARD_SIZE)
            .map_anon()
            .map_err(io_err)?;
        file.read_exact_at(&mut copy[..], 0).map_err(io_err)?;
        let board = Board {
            _watch: None,
            map: copy.into(),
            file,
            path,
        };
        let h = board.header();
        if h.magic.load(Ordering::Acquire) == 0 {
            return Ok(None);
        }
        if h.magic.load(Ordering::Acquire) != BOARD_MAGIC
            || h.version.load(Ordering::Acquire) != BOARD_VERSION
            || h.entries.load(Ordering::Acquire) as usize != BOARD_ENTRIES
        {
            return Err(BoardError::Foreign(board.path));
        }
        Ok(Some(board))
    }

    /// Whether the board is still the one this process mapped, whole: the
    /// file at its path, at its full size, with its header. A board cut
    /// short (its pages then read as zeros, `sigbus.rs`) or replaced is
    /// no longer shared with anyone: its users stop oversubscribing.
    pub fn intact(&self) -> bool {
        let (Ok(ours), Ok(named)) = (self.file.metadata(), std::fs::symlink_metadata(&self.path))
        else {
            return false;
        };
        use std::os::unix::fs::MetadataExt;
        let h = self.header();
        ours.len() >= BOARD_SIZE as u64
            && (ours.dev(), ours.ino()) == (named.dev(), named.ino())
            && h.magic.load(Ordering::Acquire) == BOARD_MAGIC
            && h.version.load(Ordering::Acquire) == BOARD_VERSION
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn header(&self) -> &BoardHeader {
        // SAFETY: the mapping is BOARD_SIZE bytes, page-aligned, lives as
        // long as `self`, and the header is atomics only (valid for every
        // bit pattern).
        unsafe { &*(self.map.as_ptr() as *const BoardHeader) }
    }

    /// Entry `i` (below [`BOARD_ENTRIES`]).
    pub fn entry(&self, i: usize) -> &BoardEntry {
        assert!(i < BOARD_ENTRIES);
        // SAFETY: entry `i` lies inside the mapping (HEADER_SIZE + i * 256
        // + 256 <= BOARD_SIZE), is 8-aligned, and is atomics only.
        unsafe {
            &*(self
                .map
                .as_ptr()
                .add(HEADER_SIZE + i * size_of::<BoardEntry>()) as *const BoardEntry)
        }
    }

    /// Takes a free entry (or a dead process's) for this process, for life.
    pub fn claim(&self, pid: u32, now: u64) -> Result<usize, BoardError> {
        for i in 0..BOARD_ENTRIES {
            if self.record_lock(i, libc::F_SETLK, libc::F_WRLCK) {
                self.entry(i).clear(pid, now);
                return Ok(i);
            }
        }
        Err(BoardError::Full(self.path.clone()))
    }

    /// Whether entry `i` is held by a live process other than the caller
    /// (the caller's own entries are not seen: check those by index).
    pub fn held_by_other(&self, i: usize) -> bool {
        let mut fl = lock_at(i, libc::F_WRLCK);
        // SAFETY: fcntl on our open descriptor; it writes the conflicting
        // lock, if any, into `fl`, which we own.
        let rc = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_GETLK, &mut fl) };
        rc == 0 && fl.l_type != libc::F_UNLCK as libc::c_short
    }

    /// The live entries of other processes, with their indices.
    pub fn others(&self, mine: Option<usize>) -> impl Iterator<Item = (usize, &BoardEntry)> {
        (0..BOARD_ENTRIES)
            .filter(move |&i| Some(i) != mine)
            .filter(|&i| self.entry(i).state() != ProcState::Free && self.held_by_other(i))
            .map(|i| (i, self.entry(i)))
    }

    /// Bytes of suspended state on the host, over every live process
    /// (`mine` included).
    pub fn host_bytes(&self, mine: Option<usize>) -> u64 {
        let own = mine.map_or(0, |i| self.entry(i).host_bytes());
        own + self.others(mine).map(|(_, e)| e.host_bytes()).sum::<u64>()
    }

    /// Reserves `bytes` of host memory for entry `mine`'s suspension, if
    /// the node's total stays within `limit` (reserve, then check: two
    /// racing reservations may both be refused, never both granted past
    /// the limit).
    pub fn reserve_host(&self, mine: usize, bytes: u64, limit: u64) -> bool {
        let e = self.entry(mine);
        e.add_host_bytes(bytes);
        if self.host_bytes(Some(mine)) <= limit {
            return true;
        }
        e.release_host_bytes(bytes);
        false
    }

    /// The node's restore lock, held while one restore judges its room and
    /// claims it on the board (never across a driver call), so that two
    /// restores never count on the same room. Waits up to a second for
    /// another holder; None past that. The kernel drops it if the holder
    /// dies.
    pub fn restore_lock(&self) -> Option<RestoreLock<'_>> {
        self.restore_lock_within(std::time::Duration::from_secs(1))
    }

    /// [`Board::restore_lock`], waiting up to `wait` (zero: one try).
    pub fn restore_lock_within(&self, wait: std::time::Duration) -> Option<RestoreLock<'_>> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            if self.record_lock(RESTORE_LOCK, libc::F_SETLK, libc::F_WRLCK) {
                return Some(RestoreLock { board: self });
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// Takes (`F_SETLK`, true if taken) or tests a lock on entry `i`'s byte.
    fn record_lock(&self, i: usize, cmd: libc::c_int, kind: libc::c_int) -> bool {
        let fl = lock_at(i, kind);
        // SAFETY: fcntl on our open descriptor, reading `fl`, which we own.
        unsafe { libc::fcntl(self.file.as_raw_fd(), cmd, &fl) == 0 }
    }
}

/// The restore lock's byte, after the entries' (`lock_at`).
const RESTORE_LOCK: usize = BOARD_ENTRIES;

/// The node's restore lock while held ([`Board::restore_lock`]).
pub struct RestoreLock<'a> {
    board: &'a Board,
}

impl Drop for RestoreLock<'_> {
    fn drop(&mut self) {
        self.board
            .record_lock(RESTORE_LOCK, libc::F_SETLK, libc::F_UNLCK);
    }
}

/// Entry `i`'s lock: byte `BOARD_SIZE + i`, past the data.
fn lock_at(i: usize, kind: libc::c_int) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: (BOARD_SIZE + i) as libc::off_t,
        l_len: 1,
        l_pid: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_records_cards_states_and_wants() {
        let dir = tempfile::tempdir().unwrap();
        let b = Board::open(dir.path()).unwrap();
        let i = b.claim(42, 1000).unwrap();
        let e = b.entry(i);
        let card = [7u8; 16];
        e.set_bytes_on(&card, 5 << 30);
        e.set_bytes_on(&card, 6 << 30);
        assert_eq!(e.cards(), vec![(card, 6 << 30)]);
        assert_eq!(e.bytes_on(&[1u8; 16]), 0);
        e.set_state(ProcState::Suspended, 2000);
        e.set_state(ProcState::Restoring, 5000);
        e.set_state(ProcState::Running, 6000);
        assert_eq!(e.suspended_ns_at(7000), 4000);
        assert_eq!(e.restoring_ns_at(7000), 1000);
        e.set_want(&card, 9);
        assert_eq!(e.wants(), Some((card, 9)));
        e.set_want(&card, 0);
        // Allocations of two threads wait at once: the want is their sum,
        // and goes only when both are answered.
        e.add_want(&card, 3);
        e.add_want(&card, 4);
        assert_eq!(e.wants(), Some((card, 7)));
        e.take_want(3);
        assert_eq!(e.wants(), Some((card, 4)));
        e.take_want(4);
        assert_eq!(e.wants(), None);
        // The want's age, for the line of turns: set by the first want,
        // kept while it lasts, gone with it.
        e.add_want(&card, 3);
        let since = e.want_since_ns();
        assert_ne!(since, 0);
        e.set_want(&card, 5);
        assert_eq!(e.want_since_ns(), since);
        e.set_want(&card, 0);
        assert_eq!(e.want_since_ns(), 0);
        // Our own entry is not another process's.
        assert_eq!(b.others(None).count(), 0);
    }

    #[test]
    fn host_memory_is_reserved_within_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let b = Board::open(dir.path()).unwrap();
        let i = b.claim(1, 0).unwrap();
        assert!(b.reserve_host(i, 6, 10));
        assert!(!b.reserve_host(i, 6, 10));
        assert_eq!(b.host_bytes(Some(i)), 6);
        assert!(b.reserve_host(i, 4, 10));
    }

    #[test]
    fn a_copy_reads_the_board_as_it_was_and_sees_who_is_alive() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Board::read_copy(dir.path()).unwrap().is_none());
        let b = Board::open(dir.path()).unwrap();
        let i = b.claim(42, 1000).unwrap();
        b.entry(i).set_bytes_on(&[7u8; 16], 5 << 30);
        b.entry(i).set_state(ProcState::Suspended, 2000);
        b.entry(i).add_host_bytes(5 << 30);
        // Read through the board's own descriptor: closing any other
        // descriptor of the file would drop this process's locks (POSIX).
        let file_now = || {
            let mut v = vec![0u8; BOARD_SIZE];
            b.file.read_exact_at(&mut v, 0).unwrap();
            v
        };
        let before = file_now();
        // Our own lock is invisible to us: a forked child looks, and
        // answers with one byte through a pipe.
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into an array we own.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child reads the board (glibc's malloc is safe after
        // fork), writes one byte and _exits; it prints nothing and unwinds
        // nothing into the test harness.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let seen = std::panic::catch_unwind(|| {
                let c = Board::read_copy(dir.path()).unwrap().unwrap();
                let live: Vec<(usize, u64, u64, ProcState)> = c
                    .others(None)
                    .map(|(j, e)| {
                        let host = e.host_bytes();
                        (j, host, e.suspended_ns_at(5000), e.state())
                    })
                    .collect();
                live == vec![(i, 5 << 30, 3000, ProcState::Suspended)]
                    && c.host_bytes(None) == 5 << 30
            });
            let byte = [u8::from(seen.unwrap_or(false))];
            // SAFETY: one byte into the pipe we made, then leave without
            // running the harness's exit handlers.
            unsafe {
                libc::write(fds[1], byte.as_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        let mut byte = [0u8];
        // SAFETY: one byte from our pipe into a buffer we own; the child
        // is reaped.
        unsafe {
            libc::close(fds[1]);
            libc::read(fds[0], byte.as_mut_ptr().cast(), 1);
            libc::close(fds[0]);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert_eq!(byte[0], 1, "the child did not see the entry alive");
        // A copy writes nothing, even when written to.
        let c = Board::read_copy(dir.path()).unwrap().unwrap();
        assert_eq!(c.entry(i).restoring_ns_at(9000), 0);
        c.entry(i).set_state(ProcState::Failed, 9000);
        assert_eq!(c.entry(i).state(), ProcState::Failed);
        assert_eq!(file_now(), before);
        assert_eq!(b.entry(i).state(), ProcState::Suspended);
    }

    #[test]
    fn a_board_cut_short_or_replaced_reads_as_zeros_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let b = Board::open(dir.path()).unwrap();
        let i = b.claim(42, 1000).unwrap();
        b.entry(i).set_bytes_on(&[7u8; 16], 5 << 30);
        assert!(b.intact());
        let path = dir.path().join(BOARD_FILE);
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        assert!(!b.intact());
        // Without the watch this read is a SIGBUS (issue 26, finding 2).
        assert_eq!(b.entry(i).bytes_on(&[7u8; 16]), 0);
        b.entry(i).set_state(ProcState::Suspended, 5);
        assert!(!b.intact());
        // Replaced by another file at full size: not the board we share.
        let dir2 = tempfile::tempdir().unwrap();
        let c = Board::open(dir2.path()).unwrap();
        assert!(c.intact());
        let other = dir2.path().join("other");
        std::fs::write(&other, vec![0u8; BOARD_SIZE]).unwrap();
        std::fs::rename(&other, dir2.path().join(BOARD_FILE)).unwrap();
        assert!(!c.intact());
    }

    #[test]
    fn a_foreign_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(BOARD_FILE), b"not a board").unwrap();
        assert!(matches!(
            Board::open(dir.path()),
            Err(BoardError::Foreign(_))
        ));
        assert!(matches!(
            Board::read_copy(dir.path()),
            Err(BoardError::Foreign(_))
        ));
    }
}

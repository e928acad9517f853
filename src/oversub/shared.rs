//! VMM-backed blocks shared through legacy IPC (`cuIpcGetMemHandle`),
//! which VMM memory cannot do itself (docs/oversubscription.md, 2b).
//!
//! The exporting process makes the block's physical memory a POSIX file
//! descriptor and keeps it; the 64-byte handle it gives the program names
//! that descriptor: a magic, this process's random id, the block's random
//! token and its mapped size. A thread of the exporter answers on an
//! abstract Unix socket named after its id (so within one network
//! namespace: a pod) with the descriptor (`SCM_RIGHTS`) to whoever
//! presents a token it gave out. The peer's `cuIpcOpenMemHandle` (vgpu's
//! hook) imports it and maps it at addresses of its own, as the driver
//! maps a legacy handle. The handle is the capability, as the driver's is.
//!
//! A shared block never leaves the card: a peer maps its physical memory,
//! which a suspension's release would not free and a restore's new memory
//! would not be (mover.rs skips it, and a process that shares memory does
//! not use the checkpoint API: suspend.rs).
#![forbid(unsafe_code)]

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use rustix::net::sockopt::Timeout;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use super::backing;
use crate::cuda::sys::*;
use crate::cuda::{driver, real};
use crate::ffi::Out;
use crate::lock::{Listed, Lock, Name};

/// The first bytes of a handle that names a shared VMM-backed block.
const MAGIC: [u8; 8] = *b"vgpuIPC1";
/// How long a peer waits for the exporter's answer, its connection
/// included.
const ANSWER_BOUND: Duration = Duration::from_secs(5);
/// How long the exporter waits for a peer's token: far less than a
/// peer's bound, so that one that never sends holds others up briefly.
const TOKEN_BOUND: Duration = Duration::from_millis(500);
/// A pause after a failed accept (out of descriptors: the connection
/// stays queued, and the next accept would fail at once).
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, the one flag the driver takes.
pub const LAZY_ENABLE_PEER_ACCESS: u32 = 1;

/// What a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Named {
    /// The exporting process's id (its socket's name).
    id: u64,
    /// The block's token.
    token: u64,
    /// Its mapped size.
    mapped: u64,
}

impl Named {
    fn to_bytes(self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[..8].copy_from_slice(&MAGIC);
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..24].copy_from_slice(&self.token.to_le_bytes());
        b[24..32].copy_from_slice(&self.mapped.to_le_bytes());
        b
    }

    /// None: not one of ours (the driver's own handle).
    fn from_bytes(b: &[u8; 64]) -> Option<Named> {
        let word = |i: usize| {
            b.get(i..i + 8)
                .and_then(|w| <[u8; 8]>::try_from(w).ok())
                .map(u64::from_le_bytes)
        };
        if b.get(..8) != Some(&MAGIC[..]) {
            return None;
        }
        Some(Named {
            id: word(8)?,
            token: word(16)?,
            mapped: word(24)?,
        })
    }
}

/// The abstract socket an exporter with `id` answers on.
fn socket_name(id: u64) -> String {
    format!("vgpu-ipc-{id:016x}")
}

/// A random 64-bit number from the kernel (never 0). Err: none to be had.
fn random() -> Result<u64, String> {
    let mut b = [0u8; 8];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| format!("no random number ({e})"))?;
    Ok(u64::from_le_bytes(b).max(1))
}

/// One exported block.
struct Export {
    base: CUdeviceptr,
    token: u64,
    mapped: u64,
    fd: OwnedFd,
}

/// This process's exports, and the id its answering thread listens by
/// (0: none yet). A forked child has neither (its parent's thread is not
/// its own).
struct Exports {
    id: u64,
    list: Vec<Export>,
}

static EXPORTS: Lock<Exports> = Lock::new(
    Exports {
        id: 0,
        list: Vec::new(),
    },
    |e| {
        e.id = 0;
        e.list.clear();
    },
);

/// One block of another process mapped here, opened `opens` times (as
/// the driver's, a handle opened again answers the same address).
#[derive(Clone, Copy)]
struct Import {
    named: Named,
    base: CUdeviceptr,
    handle: CUmemGenericAllocationHandle,
    opens: u32,
}

/// A forked child has none (CUDA is not its to use).
static IMPORTS: Lock<Vec<Import>> = Lock::new(Vec::new(), Vec::clear);

/// This module's locks, for the fork handlers (`fork.rs`).
pub(super) fn locks() -> [Listed; 2] {
    [
        (Name::of("oversub.exports"), &EXPORTS),
        (Name::of("oversub.imports"), &IMPORTS),
    ]
}

/// Whether this process shares VMM memory with another now (exported or
/// imported): then it must not be checkpointed.
pub(super) fn any() -> bool {
    !EXPORTS.lock().list.is_empty() || !IMPORTS.lock().is_empty()
}

/// A handle naming the VMM-backed block that holds `p`, shared from now
/// on (the same handle each time it is asked). Err: why it cannot be.
pub fn export(p: CUdeviceptr) -> Result<[u8; 64], String> {
    let b = backing::find(p).ok_or("not a VMM-backed block")?;
    let handle = b.handle.ok_or("the block is not on the card")?;
    let named = |id, x: &Export| {
        Named {
            id,
            token: x.token,
            mapped: x.mapped,
        }
        .to_bytes()
    };
    {
        let e = EXPORTS.lock();
        if let Some(x) = e.list.iter().find(|x| x.base == b.base) {
            return Ok(named(e.id, x));
        }
    }
    // (No lock across the driver call.)
    let fd = real::mem_export_fd(handle)
        .map_err(|rc| format!("its memory cannot be exported as a file descriptor ({rc})"))?;
    // Not into programs this one starts (a spawned child skips the fork
    // handlers): the descriptor would keep the memory alive there.
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)
        .map_err(|e| format!("its descriptor cannot be kept from child programs ({e})"))?;
    let token = random()?;
    let mut e = EXPORTS.lock();
    if let Some(x) = e.list.iter().find(|x| x.base == b.base) {
        // Another thread exported it meanwhile: its handle stands.
        return Ok(named(e.id, x));
    }
    // Freed meanwhile (a program's race): nothing to share.
    if backing::find(b.base).and_then(|x| x.handle) != Some(handle) {
        return Err("the block was freed meanwhile".to_string());
    }
    if e.id == 0 {
        e.id = listen()?;
    }
    backing::set_shared(b.base);
    let x = Export {
        base: b.base,
        token,
        mapped: b.mapped,
        fd,
    };
    let bytes = named(e.id, &x);
    e.list.push(x);
    drop(e);
    log::info!(
        "VGPU_OVERSUBSCRIBE_VMM: a VMM-backed block of {} at {:#x} is shared through legacy IPC by its file descriptor; it stays on the card",
        crate::log::fmt_bytes(b.mapped),
        b.base
    );
    Ok(bytes)
}

/// Forgets the exports of the block at `base` (freed): peers that mapped
/// it keep its memory until they unmap it, as the driver's IPC does.
pub(super) fn forget(base: CUdeviceptr) {
    EXPORTS.lock().list.retain(|x| x.base != base);
}

/// Binds this process's socket and starts the thread that answers on
/// it; its id.
fn listen() -> Result<u64, String> {
    let id = random()?;
    let addr = SocketAddr::from_abstract_name(socket_name(id).as_bytes())
        .map_err(|e| format!("no socket name ({e})"))?;
    let listener =
        UnixListener::bind_addr(&addr).map_err(|e| format!("no socket to answer on ({e})"))?;
    std::thread::Builder::new()
        .name("vgpu-ipc".into())
        .spawn(move || serve(&listener))
        .map_err(|e| format!("no thread to answer peers ({e})"))?;
    Ok(id)
}

/// The answering thread: one short exchange per peer.
fn serve(listener: &UnixListener) {
    loop {
        let peer = match listener.accept() {
            Ok((peer, _)) => peer,
            Err(e) => {
                log::debug!("VGPU_OVERSUBSCRIBE_VMM: no peer accepted ({e})");
                std::thread::sleep(ACCEPT_PAUSE);
                continue;
            }
        };
        let answered = std::panic::catch_unwind(|| answer(&peer));
        if let Ok(Err(e)) = answered {
            log::debug!("VGPU_OVERSUBSCRIBE_VMM: a peer asking for shared memory: {e}");
        }
    }
}

/// Reads a token (within [`TOKEN_BOUND`] in all); sends "ok", the
/// block's size and its descriptor, or "no".
fn answer(peer: &UnixStream) -> std::io::Result<()> {
    peer.set_write_timeout(Some(ANSWER_BOUND))?;
    let mut reader = peer;
    let mut token = [0u8; 8];
    let mut got = 0;
    let end = Instant::now() + TOKEN_BOUND;
    while got < token.len() {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        peer.set_read_timeout(Some(left))?;
        match reader.read(&mut token[got..])? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    let token = u64::from_le_bytes(token);
    let found = EXPORTS
        .lock()
        .list
        .iter()
        .find(|x| x.token == token)
        .map(|x| x.fd.try_clone().map(|fd| (fd, x.mapped)));
    let Some((fd, mapped)) = found.transpose()? else {
        let mut writer = peer;
        return writer.write_all(b"no");
    };
    let mut word = [0u8; 10];
    word[..2].copy_from_slice(b"ok");
    word[2..].copy_from_slice(&mapped.to_le_bytes());
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd.as_fd()];
    control.push(SendAncillaryMessage::ScmRights(&fds));
    rustix::net::sendmsg(
        peer,
        &[IoSlice::new(&word)],
        &mut control,
        SendFlags::empty(),
    )?;
    Ok(())
}

/// Whether `handle` names a block shared by `export` (else it is the
/// driver's).
pub fn names_ours(handle: &[u8; 64]) -> bool {
    Named::from_bytes(handle).is_some()
}

/// Maps the block `handle` names (`names_ours`) here, readable and
/// writable by the current context's device; its address. A handle this
/// process opened already answers the same address, once more.
pub fn open(handle: &[u8; 64], flags: u32) -> Result<CUdeviceptr, CUresult> {
    let named = Named::from_bytes(handle).ok_or(CUresult::ERROR_INVALID_VALUE)?;
    if flags & !LAZY_ENABLE_PEER_ACCESS != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let dev = driver::current_ordinal().ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
    if let Some(i) = IMPORTS.lock().iter_mut().find(|i| i.named == named) {
        i.opens = i.opens.saturating_add(1);
        return Ok(i.base);
    }
    let fd = fetch(named).map_err(|why| {
        log::warn!(
            "VGPU_OVERSUBSCRIBE_VMM: cuIpcOpenMemHandle of a shared VMM-backed block: {why}"
        );
        CUresult::ERROR_INVALID_VALUE
    })?;
    let handle = real::mem_import_fd(fd.as_fd())?;
    drop(fd);
    let mut base: CUdeviceptr = 0;
    let rc = real::cuMemAddressReserve(Out::from(&mut base), named.mapped as usize, 0, 0, 0);
    if !rc.is_ok() {
        let _ = real::cuMemRelease(handle);
        return Err(rc);
    }
    if let Err(rc) = map(base, named.mapped, handle, dev) {
        let _ = real::cuMemRelease(handle);
        let _ = real::cuMemAddressFree(base, named.mapped as usize);
        return Err(rc);
    }
    let mut g = IMPORTS.lock();
    if let Some(i) = g.iter_mut().find(|i| i.named == named) {
        // Another thread opened it meanwhile: its mapping stands.
        i.opens = i.opens.saturating_add(1);
        let kept = i.base;
        drop(g);
        unmap(base, named.mapped, handle);
        return Ok(kept);
    }
    g.push(Import {
        named,
        base,
        handle,
        opens: 1,
    });
    Ok(base)
}

/// Undoes [`open`]'s mapping.
fn unmap(base: CUdeviceptr, mapped: u64, handle: CUmemGenericAllocationHandle) -> CUresult {
    let unmap = real::cuMemUnmap(base, mapped as usize);
    let release = real::cuMemRelease(handle);
    let free = real::cuMemAddressFree(base, mapped as usize);
    [unmap, release, free]
        .into_iter()
        .find(|rc| !rc.is_ok())
        .unwrap_or(CUresult::SUCCESS)
}

/// Maps `handle` at `base`, read-write for `dev`.
fn map(
    base: CUdeviceptr,
    mapped: u64,
    handle: CUmemGenericAllocationHandle,
    dev: CUdevice,
) -> Result<(), CUresult> {
    let rc = real::cuMemMap(base, mapped as usize, 0, handle, 0);
    if !rc.is_ok() {
        return Err(rc);
    }
    let desc = MemAccessDesc {
        location: MemLocation {
            kind: MEM_LOCATION_TYPE_DEVICE,
            id: dev.0,
        },
        flags: MEM_ACCESS_READWRITE,
    };
    let rc = real::mem_set_access(base, mapped as usize, &desc);
    if !rc.is_ok() {
        let _ = real::cuMemUnmap(base, mapped as usize);
        return Err(rc);
    }
    Ok(())
}

/// The descriptor of the block `named` names, from its exporter, within
/// [`ANSWER_BOUND`] in all (a connection included: one to a full queue
/// waits as a send does).
fn fetch(named: Named) -> Result<OwnedFd, String> {
    let end = Instant::now() + ANSWER_BOUND;
    let io = |e: std::io::Error| format!("the exporting process did not answer ({e})");
    let addr = SocketAddrUnix::new_abstract_name(socket_name(named.id).as_bytes())
        .map_err(|e| format!("no socket name ({e})"))?;
    let sock = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| io(e.into()))?;
    rustix::net::sockopt::set_socket_timeout(&sock, Timeout::Send, Some(ANSWER_BOUND))
        .map_err(|e| io(e.into()))?;
    rustix::net::connect(&sock, &addr)
        .map_err(|e| format!("the exporting process does not answer ({e})"))?;
    let peer = UnixStream::from(sock);
    let mut writer = &peer;
    writer.write_all(&named.token.to_le_bytes()).map_err(io)?;
    let left = end.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io(std::io::ErrorKind::TimedOut.into()));
    }
    peer.set_read_timeout(Some(left)).map_err(io)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut word = [0u8; 10];
    rustix::net::recvmsg(
        &peer,
        &mut [IoSliceMut::new(&mut word)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| io(e.into()))?;
    let fd = control.drain().find_map(|m| match m {
        RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
        _ => None,
    });
    let size = <[u8; 8]>::try_from(&word[2..]).map(u64::from_le_bytes);
    match (fd, size) {
        (Some(fd), Ok(size)) if word.starts_with(b"ok") && size == named.mapped => Ok(fd),
        (Some(_), Ok(size)) if word.starts_with(b"ok") => Err(format!(
            "the exporting process shares {size} bytes there, not the handle's {}",
            named.mapped
        )),
        _ => Err("the exporting process no longer shares that block".to_string()),
    }
}

/// `cuIpcCloseMemHandle` of a block `open` mapped (None: not one): the
/// mapping goes with its last close.
pub fn close(p: CUdeviceptr) -> Option<CUresult> {
    let gone = {
        let mut g = IMPORTS.lock();
        let at = g.iter().position(|x| x.base == p)?;
        match g.get_mut(at) {
            Some(i) if i.opens > 1 => {
                i.opens -= 1;
                None
            }
            _ => Some(g.remove(at)),
        }
    };
    let Some(i) = gone else {
        return Some(CUresult::SUCCESS);
    };
    // As the driver's close, after the work that may still use it.
    let _ = real::cuCtxSynchronize();
    Some(unmap(i.base, i.named.mapped, i.handle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_names_the_block_and_no_driver_handle_reads_as_one() {
        let n = Named {
            id: 0x0123_4567_89ab_cdef,
            token: 42,
            mapped: 64 << 20,
        };
        assert_eq!(Named::from_bytes(&n.to_bytes()), Some(n));
        assert!(names_ours(&n.to_bytes()));
        // The simulated driver's and the real driver's handles start
        // otherwise (the real one with its own fields).
        let mut driver = [0u8; 64];
        driver[..8].copy_from_slice(&0x7f00_0000_0000u64.to_le_bytes());
        assert!(!names_ours(&driver));
        assert!(!names_ours(&[0u8; 64]));
        let mut almost = n.to_bytes();
        almost[7] ^= 1;
        assert!(!names_ours(&almost));
    }

    #[test]
    fn a_peer_gets_the_descriptor_for_its_token_past_a_silent_one_and_nothing_for_another() {
        use std::io::{Seek, Write as _};
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"shared bytes").unwrap();
        let token = random().unwrap();
        let id = {
            let mut e = EXPORTS.lock();
            e.id = listen().unwrap();
            e.list.push(Export {
                base: 0x7000_0000_0000,
                token,
                mapped: 2 << 20,
                fd: OwnedFd::from(file.try_clone().unwrap()),
            });
            e.id
        };
        // One that connects and never sends holds the answers back at
        // most TOKEN_BOUND.
        let silent = UnixStream::connect_addr(
            &SocketAddr::from_abstract_name(socket_name(id).as_bytes()).unwrap(),
        )
        .unwrap();
        let t0 = Instant::now();
        let named = Named {
            id,
            token,
            mapped: 2 << 20,
        };
        let fd = fetch(named).unwrap();
        assert!(t0.elapsed() < ANSWER_BOUND, "{:?}", t0.elapsed());
        // The same open file: what the exporter wrote is there.
        let mut got = std::fs::File::from(fd);
        got.rewind().unwrap();
        let mut text = String::new();
        got.read_to_string(&mut text).unwrap();
        assert_eq!(text, "shared bytes");
        // Another token, another size, another exporter: refused.
        let err = fetch(Named {
            token: token ^ 1,
            ..named
        })
        .unwrap_err();
        assert!(err.contains("no longer shares"), "{err}");
        let err = fetch(Named {
            mapped: 4 << 20,
            ..named
        })
        .unwrap_err();
        assert!(err.contains("not the handle's"), "{err}");
        let err = fetch(Named {
            id: id ^ 1,
            ..named
        })
        .unwrap_err();
        assert!(err.contains("does not answer"), "{err}");
        drop(silent);
        EXPORTS.lock().list.clear();
    }

    #[test]
    fn ids_and_tokens_differ() {
        let a: Vec<u64> = (0..64).map(|_| random().unwrap()).collect();
        let mut b = a.clone();
        b.sort_unstable();
        b.dedup();
        assert_eq!(a.len(), b.len());
        assert!(a.iter().all(|&x| x != 0));
    }
}

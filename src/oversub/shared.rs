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

use std::hash::{BuildHasher, RandomState};
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::backing;
use crate::cuda::sys::*;
use crate::cuda::{driver, real};
use crate::ffi::Out;
use crate::lock::{Listed, Lock, Name, keep};

/// The first bytes of a handle that names a shared VMM-backed block.
const MAGIC: [u8; 8] = *b"vgpuIPC1";
/// How long a peer waits for the exporter's answer.
const ANSWER_BOUND: Duration = Duration::from_secs(5);

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

/// A random 64-bit number (std's hasher keys come from the OS).
fn random() -> u64 {
    let n = RandomState::new().hash_one((std::process::id(), crate::clock::monotonic_ns()));
    n.max(1)
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

/// One block of another process mapped here.
#[derive(Clone, Copy)]
struct Import {
    base: CUdeviceptr,
    mapped: u64,
    handle: CUmemGenericAllocationHandle,
}

static IMPORTS: Lock<Vec<Import>> = Lock::new(Vec::new(), keep);

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
    let id = {
        let mut e = EXPORTS.lock();
        if e.id == 0 {
            e.id = listen()?;
        }
        if let Some(x) = e.list.iter().find(|x| x.base == b.base) {
            return Ok(named(e.id, x));
        }
        e.id
    };
    // (No lock across the driver call.)
    let fd = real::mem_export_fd(handle)
        .map_err(|rc| format!("its memory cannot be exported as a file descriptor ({rc})"))?;
    backing::set_shared(b.base);
    let mut e = EXPORTS.lock();
    if let Some(x) = e.list.iter().find(|x| x.base == b.base) {
        // Another thread exported it meanwhile: its handle stands.
        return Ok(named(id, x));
    }
    let x = Export {
        base: b.base,
        token: random(),
        mapped: b.mapped,
        fd,
    };
    let bytes = named(id, &x);
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
    let id = random();
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
    for peer in listener.incoming().flatten() {
        let answered = std::panic::catch_unwind(|| answer(&peer));
        if let Ok(Err(e)) = answered {
            log::debug!("VGPU_OVERSUBSCRIBE_VMM: a peer asking for shared memory: {e}");
        }
    }
}

/// Reads a token; sends the descriptor of the block it names, or "no".
fn answer(peer: &UnixStream) -> std::io::Result<()> {
    peer.set_read_timeout(Some(ANSWER_BOUND))?;
    peer.set_write_timeout(Some(ANSWER_BOUND))?;
    let mut reader = peer;
    let mut token = [0u8; 8];
    reader.read_exact(&mut token)?;
    let token = u64::from_le_bytes(token);
    let fd = EXPORTS
        .lock()
        .list
        .iter()
        .find(|x| x.token == token)
        .map(|x| x.fd.try_clone());
    let Some(fd) = fd.transpose()? else {
        let mut writer = peer;
        return writer.write_all(b"no");
    };
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd.as_fd()];
    control.push(SendAncillaryMessage::ScmRights(&fds));
    rustix::net::sendmsg(
        peer,
        &[IoSlice::new(b"ok")],
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
/// writable by the current context's device; its address.
pub fn open(handle: &[u8; 64]) -> Result<CUdeviceptr, CUresult> {
    let named = Named::from_bytes(handle).ok_or(CUresult::ERROR_INVALID_VALUE)?;
    let fd = fetch(named).map_err(|why| {
        log::warn!(
            "VGPU_OVERSUBSCRIBE_VMM: cuIpcOpenMemHandle of a shared VMM-backed block: {why}"
        );
        CUresult::ERROR_INVALID_VALUE
    })?;
    let dev = driver::current_ordinal().ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
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
    IMPORTS.lock().push(Import {
        base,
        mapped: named.mapped,
        handle,
    });
    Ok(base)
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

/// The descriptor of the block `named` names, from its exporter.
fn fetch(named: Named) -> Result<OwnedFd, String> {
    let addr = SocketAddr::from_abstract_name(socket_name(named.id).as_bytes())
        .map_err(|e| format!("no socket name ({e})"))?;
    let peer = UnixStream::connect_addr(&addr)
        .map_err(|e| format!("the exporting process does not answer ({e})"))?;
    let io = |e: std::io::Error| format!("the exporting process did not answer ({e})");
    peer.set_read_timeout(Some(ANSWER_BOUND)).map_err(io)?;
    peer.set_write_timeout(Some(ANSWER_BOUND)).map_err(io)?;
    let mut writer = &peer;
    writer.write_all(&named.token.to_le_bytes()).map_err(io)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut word = [0u8; 2];
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
    match fd {
        Some(fd) if &word == b"ok" => Ok(fd),
        _ => Err("the exporting process no longer shares that block".to_string()),
    }
}

/// `cuIpcCloseMemHandle` of a block `open` mapped (None: not one).
pub fn close(p: CUdeviceptr) -> Option<CUresult> {
    let i = {
        let mut g = IMPORTS.lock();
        let at = g.iter().position(|x| x.base == p)?;
        g.remove(at)
    };
    // As the driver's close, after the work that may still use it.
    let _ = real::cuCtxSynchronize();
    let unmap = real::cuMemUnmap(i.base, i.mapped as usize);
    let release = real::cuMemRelease(i.handle);
    let free = real::cuMemAddressFree(i.base, i.mapped as usize);
    Some(
        [unmap, release, free]
            .into_iter()
            .find(|rc| !rc.is_ok())
            .unwrap_or(CUresult::SUCCESS),
    )
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
    fn ids_and_tokens_differ() {
        let a: Vec<u64> = (0..64).map(|_| random()).collect();
        let mut b = a.clone();
        b.sort_unstable();
        b.dedup();
        assert_eq!(a.len(), b.len());
        assert!(a.iter().all(|&x| x != 0));
    }
}

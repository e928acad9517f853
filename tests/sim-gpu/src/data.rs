//! Contents of device memory, so that tests can check data survives a
//! checkpoint and restore bit for bit. Only allocations of at most
//! `DATA_MAX` bytes keep contents (written by copies and memsets); larger
//! ones read as zeros, as before, so that tests may take gigabytes of
//! simulated memory without the host paying for it.
//!
//! VMM memory keeps its contents with its physical handle: an address
//! mapped with `cuMemMap` reads and writes its handle's bytes, an unmapped
//! one is no memory at all, and a new handle mapped at the same address
//! starts zeroed (as fresh physical memory may).

use crate::local::Local;

pub const DATA_MAX: u64 = 256 << 20;

/// Where the bytes of an address live.
#[derive(Clone, Copy)]
enum Key {
    /// An ordinary allocation, by base address.
    Alloc(u64),
    /// VMM physical memory, by handle.
    Handle(usize),
}

/// The memory holding `addr`: (key, its size, offset in it, bytes left).
fn find(l: &Local, addr: u64) -> Option<(Key, u64, usize, usize)> {
    let within = |base: u64, bytes: u64| {
        (addr >= base && addr < base + bytes)
            .then(|| ((addr - base) as usize, (base + bytes - addr) as usize))
    };
    l.allocs
        .iter()
        .find_map(|(&base, a)| {
            within(base, a.bytes).map(|(o, r)| (Key::Alloc(base), a.bytes, o, r))
        })
        .or_else(|| {
            l.mapped.iter().find_map(|(&base, &(h, bytes))| {
                within(base, bytes).map(|(o, r)| (Key::Handle(h), bytes, o, r))
            })
        })
}

/// The contents behind `key`, made (zeroed) on first write; None for
/// memory too large to keep any. Shared VMM memory (exported or
/// imported) lives in its memfd, whatever its size.
fn backing(l: &mut Local, key: Key, bytes: u64) -> Option<&mut [u8]> {
    if let Key::Handle(h) = key
        && l.shared.contains_key(&h)
    {
        return l.shared.get_mut(&h).map(|(_, m)| &mut m[..]);
    }
    if bytes > DATA_MAX {
        return None;
    }
    let zeroed = || vec![0u8; bytes as usize];
    Some(
        match key {
            Key::Alloc(base) => l.data.entry(base).or_insert_with(zeroed),
            Key::Handle(h) => l.hdata.entry(h).or_insert_with(zeroed),
        }
        .as_mut_slice(),
    )
}

/// Writes `src` at device address `dst`; false when `dst..dst+len` is not
/// inside one allocation or mapping.
pub fn write(l: &mut Local, dst: u64, src: &[u8]) -> bool {
    let Some((key, bytes, off, left)) = find(l, dst) else {
        return false;
    };
    if src.len() > left {
        return false;
    }
    if let Some(b) = backing(l, key, bytes) {
        b[off..off + src.len()].copy_from_slice(src);
    }
    true
}

/// Fills `dst..dst+len` with `v`.
pub fn fill(l: &mut Local, dst: u64, v: u8, len: usize) -> bool {
    let Some((key, bytes, off, left)) = find(l, dst) else {
        return false;
    };
    if len > left {
        return false;
    }
    if let Some(b) = backing(l, key, bytes) {
        b[off..off + len].fill(v);
    }
    true
}

/// Reads `out.len()` bytes at device address `src` (zeros where nothing
/// was ever written).
pub fn read(l: &Local, src: u64, out: &mut [u8]) -> bool {
    let Some((key, _, off, left)) = find(l, src) else {
        return false;
    };
    if out.len() > left {
        return false;
    }
    let b = match key {
        Key::Alloc(base) => l.data.get(&base).map(Vec::as_slice),
        Key::Handle(h) => match l.shared.get(&h) {
            Some((_, m)) => Some(&m[..]),
            None => l.hdata.get(&h).map(Vec::as_slice),
        },
    };
    match b {
        Some(b) => out.copy_from_slice(&b[off..off + out.len()]),
        None => out.fill(0),
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::Alloc;

    const VA: u64 = 0x7000_0000_0000;
    const MIB4: u64 = 4 << 20;

    fn handle(l: &mut Local, id: usize) {
        let a = Alloc {
            dev: 0,
            bytes: MIB4,
            ctx: 1,
        };
        l.handles.insert(id, a);
    }

    #[test]
    fn vmm_contents_live_with_the_handle_not_the_address() {
        let mut l = Local::default();
        handle(&mut l, 1);
        handle(&mut l, 2);
        l.mapped.insert(VA, (1, MIB4));
        assert!(write(&mut l, VA + 100, b"pattern"));
        let mut out = [0u8; 7];
        assert!(read(&l, VA + 100, &mut out));
        assert_eq!(&out, b"pattern");
        // Past the mapping: no memory.
        assert!(!write(&mut l, VA + MIB4 - 3, b"pattern"));
        // Unmapped: the address is no memory at all.
        l.mapped.remove(&VA);
        assert!(!read(&l, VA + 100, &mut out));
        // A new handle at the same address: fresh (zeroed) memory.
        l.mapped.insert(VA, (2, MIB4));
        assert!(read(&l, VA + 100, &mut out));
        assert_eq!(out, [0u8; 7]);
        // The first handle mapped again: its bytes come back with it.
        l.mapped.remove(&VA);
        l.mapped.insert(VA, (1, MIB4));
        assert!(read(&l, VA + 100, &mut out));
        assert_eq!(&out, b"pattern");
    }
}

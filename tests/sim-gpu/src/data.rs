//! Contents of device memory, so that tests can check data survives a
//! checkpoint and restore bit for bit. Only allocations of at most
//! `DATA_MAX` bytes keep contents (written by copies and memsets); larger
//! ones read as zeros, as before, so that tests may take gigabytes of
//! simulated memory without the host paying for it.

use crate::local::Local;

pub const DATA_MAX: u64 = 256 << 20;

/// The allocation holding `addr`: (base, offset in it, bytes left in it).
fn find(l: &Local, addr: u64) -> Option<(u64, usize, usize)> {
    l.allocs.iter().find_map(|(&base, a)| {
        (addr >= base && addr < base + a.bytes).then(|| {
            (
                base,
                (addr - base) as usize,
                (base + a.bytes - addr) as usize,
            )
        })
    })
}

/// The contents of the allocation at `base`, made (zeroed) on first write;
/// None for an allocation too large to keep any.
fn backing(l: &mut Local, base: u64) -> Option<&mut Vec<u8>> {
    let bytes = l.allocs.get(&base)?.bytes;
    if bytes > DATA_MAX {
        return None;
    }
    Some(
        l.data
            .entry(base)
            .or_insert_with(|| vec![0u8; bytes as usize]),
    )
}

/// Writes `src` at device address `dst`; false when `dst..dst+len` is not
/// inside one allocation.
pub fn write(l: &mut Local, dst: u64, src: &[u8]) -> bool {
    let Some((base, off, left)) = find(l, dst) else {
        return false;
    };
    if src.len() > left {
        return false;
    }
    if let Some(b) = backing(l, base) {
        b[off..off + src.len()].copy_from_slice(src);
    }
    true
}

/// Fills `dst..dst+len` with `v`.
pub fn fill(l: &mut Local, dst: u64, v: u8, len: usize) -> bool {
    let Some((base, off, left)) = find(l, dst) else {
        return false;
    };
    if len > left {
        return false;
    }
    if let Some(b) = backing(l, base) {
        b[off..off + len].fill(v);
    }
    true
}

/// Reads `out.len()` bytes at device address `src` (zeros where nothing
/// was ever written).
pub fn read(l: &Local, src: u64, out: &mut [u8]) -> bool {
    let Some((base, off, left)) = find(l, src) else {
        return false;
    };
    if out.len() > left {
        return false;
    }
    match l.data.get(&base) {
        Some(b) => out.copy_from_slice(&b[off..off + out.len()]),
        None => out.fill(0),
    }
    true
}

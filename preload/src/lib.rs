//! `libvgpu.so`, the preloaded stub, is built by this package's build
//! script from `stub.c` (see there for why it is C). This crate holds the
//! one writer of the bundle format the stub reads (`bundle.h`): the stub,
//! the core, the core's length, a checksum and a magic. deploy/build.sh
//! (through the `vgpu-bundle` program) and the tests make bundles with it.

/// The last 8 bytes of a bundle.
pub const TRAILER_MAGIC: &[u8; 8] = b"VGPUCOR1";
/// Core length (u64 LE), checksum (u64 LE), magic.
pub const TRAILER_SIZE: usize = 24;

const M: u64 = 0x9e37_79b9_7f4a_7c15;

fn mix(h: u64, w: u64) -> u64 {
    (h ^ w).rotate_left(31).wrapping_mul(M)
}

/// The checksum of the core in a bundle: the same function as
/// `vgpu_checksum` in preload/bundle.c (four lanes over 8-byte
/// little-endian words, the last block zero-padded, the length folded in).
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut h = [1u64, 2, 3, 4];
    let mut blocks = bytes.chunks_exact(32);
    let word = |b: &[u8], l: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[8 * l..8 * l + 8]);
        u64::from_le_bytes(w)
    };
    for b in &mut blocks {
        for (l, lane) in h.iter_mut().enumerate() {
            *lane = mix(*lane, word(b, l));
        }
    }
    let rest = blocks.remainder();
    if !rest.is_empty() {
        let mut tail = [0u8; 32];
        tail[..rest.len()].copy_from_slice(rest);
        for (l, lane) in h.iter_mut().enumerate() {
            *lane = mix(*lane, word(&tail, l));
        }
    }
    let r = h.iter().fold(bytes.len() as u64, |r, &lane| mix(r, lane));
    r ^ (r >> 29)
}

/// The bundle: `stub`, then `core`, then the trailer the stub checks
/// before it loads the core.
pub fn bundle(stub: &[u8], core: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(stub.len() + core.len() + TRAILER_SIZE);
    out.extend_from_slice(stub);
    out.extend_from_slice(core);
    out.extend_from_slice(&(core.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(core).to_le_bytes());
    out.extend_from_slice(TRAILER_MAGIC);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_sees_every_byte_and_the_length() {
        let core: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let c = checksum(&core);
        for at in [0, 31, 32, 500, 999] {
            let mut d = core.clone();
            d[at] ^= 1;
            assert_ne!(checksum(&d), c, "a flip at {at}");
        }
        assert_ne!(checksum(&core[..999]), c);
        let mut longer = core.clone();
        longer.push(0);
        assert_ne!(checksum(&longer), c, "a zero byte more");
    }

    #[test]
    fn a_bundle_ends_with_length_checksum_and_magic() {
        let b = bundle(b"stub", b"core!");
        assert_eq!(&b[..9], b"stubcore!");
        assert_eq!(b.len(), 9 + TRAILER_SIZE);
        assert_eq!(&b[9..17], &5u64.to_le_bytes());
        assert_eq!(&b[17..25], &checksum(b"core!").to_le_bytes());
        assert_eq!(&b[25..], TRAILER_MAGIC);
    }
}

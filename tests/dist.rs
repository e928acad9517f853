//! The deployable bundle, `target/dist/libvgpu.so` (deploy/build.sh):
//! built against glibc 2.17's symbol versions, so it loads in every image
//! with glibc 2.17 or newer (issue 28, item 1), and it enforces the
//! limits here, on every entry path.
//!
//! `VGPU_DIST` names the bundle; .ci/run builds it and sets it. Without
//! it, these tests use target/dist/libvgpu.so if deploy/build.sh has made
//! one, and say they did nothing if not.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// The bundle, or None (with a note) where none was built and none asked.
fn dist() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VGPU_DIST") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "VGPU_DIST={} is not a file", p.display());
        return Some(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dist/libvgpu.so");
    if p.is_file() {
        return Some(p);
    }
    eprintln!("no target/dist/libvgpu.so and no VGPU_DIST: run deploy/build.sh (.ci/run does)");
    None
}

/// The stub and the core of a bundle, split at its trailer.
fn split(bundle: &[u8]) -> (&[u8], &[u8]) {
    let t = bundle.len() - vgpu_preload::TRAILER_SIZE;
    assert_eq!(&bundle[t + 16..], vgpu_preload::TRAILER_MAGIC, "no trailer");
    let n = u64::from_le_bytes(bundle[t..t + 8].try_into().unwrap()) as usize;
    let core = &bundle[t - n..t];
    assert_eq!(
        u64::from_le_bytes(bundle[t + 8..t + 16].try_into().unwrap()),
        vgpu_preload::checksum(core)
    );
    (&bundle[..t - n], core)
}

/// Every `GLIBC_x.y[.z]` version `lib` needs or defines, as numbers.
fn glibc_versions(lib: &Path) -> Vec<Vec<u32>> {
    let out = Command::new("objdump").arg("-T").arg(lib).output();
    let out = out.expect("objdump (binutils) is needed for this test");
    assert!(out.status.success(), "objdump -T {}", lib.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let mut v: Vec<Vec<u32>> = text
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|w| w.split('.').map(|n| n.parse().ok()).collect())
        .collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn the_bundle_needs_glibc_2_17_at_most_and_its_stub_keeps_its_budget() {
    let Some(dist) = dist() else { return };
    let bytes = std::fs::read(&dist).unwrap();
    let (stub, core) = split(&bytes);
    let dir = tempfile::tempdir().unwrap();
    for (name, part) in [("stub.so", stub), ("core.so", core)] {
        let f = dir.path().join(name);
        std::fs::write(&f, part).unwrap();
        let v = glibc_versions(&f);
        assert!(!v.is_empty(), "{name}: no GLIBC_ versions read");
        let newest = v.last().unwrap();
        assert!(
            *newest <= vec![2, 17],
            "{name} of {} needs GLIBC_{newest:?} (the floor is 2.17): {v:?}",
            dist.display()
        );
    }
    // The stub's budget (tests/preload.rs) holds for the zig build too:
    // no libdl.so.2 or libpthread.so.0, each one more object for every
    // exec to load on a new glibc.
    stub_budget(&dir.path().join("stub.so"));
}

#[test]
fn the_bundle_enforces_the_limit_on_every_path() {
    let Some(dist) = dist() else { return };
    // Alone in a directory, as a node has it.
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libvgpu.so");
    std::fs::copy(&dist, &lib).unwrap();
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let run = |path, bytes: u64| {
        Run::from(
            sim.client_cmd(path, false, &["alloc", "buffer", &bytes.to_string()])
                .env("LD_PRELOAD", &lib)
                .output()
                .unwrap(),
        )
        .ok()
    };
    for path in PATHS {
        let over = run(path, 900 * MIB);
        assert_eq!(over.i64("alloc_rc"), 2, "{path:?}: {}", over.stderr);
        assert!(over.stderr.contains("out of memory"), "{}", over.stderr);
        assert_eq!(over.u64("during_total"), GIB, "{path:?}");
        let ok = run(path, 400 * MIB);
        assert_eq!(ok.i64("alloc_rc"), 0, "{path:?}: {}", ok.stderr);
    }
    // Programs that never use CUDA run as without it.
    let out = Command::new("/bin/true")
        .env("LD_PRELOAD", &lib)
        .output()
        .unwrap();
    assert!(out.status.success() && out.stderr.is_empty());
}

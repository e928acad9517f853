//! A damaged bundle fails closed (issue 26, finding 5): cut anywhere in
//! the core or its trailer, or with a byte changed, the stub refuses the
//! core before ld.so maps it, every CUDA call answers 999 and stderr gets
//! one line saying why; no process crashes. And a stub that cannot read
//! its own file says so (finding 6), not "no core appended".

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// The test bundle (stub + core + trailer) and where its core starts
/// (read from the trailer: `VGPU_TEST_BUNDLE` may name another stub's).
fn parts() -> (Vec<u8>, usize) {
    let bytes = std::fs::read(&artifacts().libvgpu).unwrap();
    let t = bytes.len() - vgpu_preload::TRAILER_SIZE;
    assert_eq!(
        &bytes[t + 16..],
        vgpu_preload::TRAILER_MAGIC,
        "the bundle ends with its trailer"
    );
    let core = u64::from_le_bytes(bytes[t..t + 8].try_into().unwrap()) as usize;
    assert_eq!(
        &bytes[t - core..t - core + 4],
        b"\x7fELF",
        "the core starts there"
    );
    (bytes.clone(), t - core)
}

/// Writes `bytes` as libvgpu.so alone in a new directory (no core beside).
fn install(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let sub = dir.join(name);
    std::fs::create_dir_all(&sub).unwrap();
    let lib = sub.join("libvgpu.so");
    std::fs::write(&lib, bytes).unwrap();
    lib
}

/// Runs the first CUDA call of every entry path under `lib` and checks it
/// fails closed: no signal, cuInit answers 999, one `[vgpu]` line that
/// names the damage (`reason`).
fn fails_closed(sim: &Sim, lib: &Path, what: &str, reason: &str) {
    for path in PATHS {
        let r = Run::from(
            sim.client_cmd(path, false, &["alloc", "buffer", "1048576"])
                .env("LD_PRELOAD", lib)
                .output()
                .unwrap(),
        );
        let ctx = format!("{what}, {path:?}: {:?}\n{}{}", r.status, r.stdout, r.stderr);
        if path == Path3::ProcAddr {
            // Its first call, cuGetProcAddress, answers 999: no symbol.
            assert_eq!(r.status.code(), Some(2), "no crash, a failed call: {ctx}");
            assert!(r.stdout.contains("error=load"), "{ctx}");
        } else {
            assert_eq!(r.status.code(), Some(3), "no crash, a failed call: {ctx}");
            assert!(r.stdout.contains("error=999 call=cu.cuInit(0)"), "{ctx}");
        }
        let lines: Vec<&str> = r.stderr.lines().filter(|l| l.contains("[vgpu]")).collect();
        assert_eq!(lines.len(), 1, "one line: {ctx}");
        assert!(
            lines[0].contains("cannot load the core") && lines[0].contains(reason),
            "{ctx}"
        );
    }
}

#[test]
fn a_bundle_cut_anywhere_in_its_core_or_trailer_fails_closed() {
    let (bytes, start) = parts();
    let core = bytes.len() - start - vgpu_preload::TRAILER_SIZE;
    assert!(core > (1 << 20), "a core of {core} bytes");
    let dir = tempfile::tempdir().unwrap();
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let mut cuts: Vec<usize> = [2, 4, 8, 16, 64, 200, 256, 512, 700, 1024]
        .iter()
        .map(|k| k * 1024)
        .collect();
    cuts.push(core - 1);
    // Into the trailer: the whole core there, the trailer short.
    cuts.extend([core, core + 1, core + 8, core + 16, core + 23]);
    for cut in cuts {
        let lib = install(dir.path(), &format!("cut{cut}"), &bytes[..start + cut]);
        fails_closed(
            &sim,
            &lib,
            &format!("cut {cut} bytes into the core"),
            "without a vgpu trailer",
        );
    }
}

#[test]
fn a_changed_byte_or_a_wrong_length_fails_closed() {
    let (bytes, start) = parts();
    let core = bytes.len() - start - vgpu_preload::TRAILER_SIZE;
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::new(1, "8g");
    for at in [16, 4096, 1 << 20, core - 1] {
        let mut b = bytes.clone();
        b[start + at] ^= 0x40;
        let lib = install(dir.path(), &format!("flip{at}"), &b);
        fails_closed(
            &sim,
            &lib,
            &format!("byte {at} changed"),
            "checksum does not match",
        );
    }
    // A trailer that claims more than the file holds.
    let mut b = bytes.clone();
    let at = b.len() - vgpu_preload::TRAILER_SIZE;
    b[at..at + 8].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
    let lib = install(dir.path(), "long", &b);
    fails_closed(
        &sim,
        &lib,
        "a length past the file",
        "the trailer names a core",
    );
    // A core whose program headers reach past its end, with a trailer
    // that matches it (a bundle made of an already cut core).
    let cut = &bytes[start..start + (1 << 20)];
    let stub = &bytes[..start];
    let lib = install(dir.path(), "short", &vgpu_preload::bundle(stub, cut));
    fails_closed(
        &sim,
        &lib,
        "a cut core with its own trailer",
        "program headers",
    );
    // The old format, a plain concatenation: refused, not guessed at.
    let lib = install(
        dir.path(),
        "plain",
        &bytes[..bytes.len() - vgpu_preload::TRAILER_SIZE],
    );
    fails_closed(&sim, &lib, "no trailer", "without a vgpu trailer");
}

#[test]
fn a_damaged_bundle_does_not_stop_programs_that_never_use_cuda() {
    let (bytes, start) = parts();
    let dir = tempfile::tempdir().unwrap();
    let lib = install(dir.path(), "cut", &bytes[..start + 100 * 1024]);
    let out = std::process::Command::new("/bin/sh")
        .args(["-c", "echo hi"])
        .env("LD_PRELOAD", &lib)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_stub_out_of_file_descriptors_names_the_real_cause() {
    // RLIMIT_NOFILE of 4 or 5: the stub cannot open its own file or make
    // the memfd. The line names that, not "no core appended".
    let a = artifacts();
    let sim = Sim::new(1, "8g");
    let mut refused = 0;
    for limit in [4, 5] {
        for path in PATHS {
            let prog = sim.client_cmd(path, false, &[]).get_program().to_owned();
            let mut cmd = sim.cmd("/bin/sh", false);
            cmd.args(["-c", &format!("ulimit -n {limit} && exec \"$0\" \"$@\"")])
                .arg(&prog)
                .args(["alloc", "buffer", "1048576"])
                .env("LD_PRELOAD", &a.libvgpu);
            let r = Run::from(cmd.output().unwrap());
            let ctx = format!(
                "limit {limit}, {path:?}: {:?}\n{}{}",
                r.status, r.stdout, r.stderr
            );
            // (Where the core did load, the simulated driver may itself
            // die of the limit: not vgpu's to judge.)
            if !r.stderr.contains("cannot load the core") {
                continue;
            }
            assert!(r.stderr.contains("Too many open files"), "{ctx}");
            assert!(!r.stderr.contains("no core appended"), "{ctx}");
            refused += 1;
        }
    }
    assert!(refused > 0, "no limit was low enough to refuse the core");
}

//! The preloaded stub (`libvgpu.so`, preload/stub.c) stays what makes
//! preloading cheap (issue 14, docs/benchmarks.md): small, with few
//! relocations, no constructor and nothing beyond libc; it loads the core
//! (`libvgpu_core.so`) only in processes that use CUDA or NVML, from the
//! bundle or from beside itself, and fails closed without one.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::*;

const GIB: u64 = 1 << 30;

/// The defined dynamic symbols of `lib`.
fn exports(lib: &Path) -> BTreeSet<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .expect("nm (binutils) is needed for this test");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_stub_stays_within_its_budget() {
    stub_budget(&artifacts().stub);
}

#[test]
fn the_stub_exports_exactly_the_cores_hooks() {
    let a = artifacts();
    let stub = exports(&a.stub);
    let core: BTreeSet<String> = exports(&a.core)
        .into_iter()
        .filter(|s| s.starts_with("cu") || s.starts_with("nvml") || s.starts_with("dlsym"))
        .chain(["dlvsym".to_string()])
        .collect();
    assert!(core.contains("cuMemAlloc_v2") && core.contains("nvmlDeviceGetMemoryInfo"));
    assert_eq!(stub, core);
}

#[test]
fn a_process_that_never_uses_cuda_does_not_load_the_core() {
    let a = artifacts();
    for lib in [&a.libvgpu, &a.stub] {
        let out = Command::new("cat")
            .arg("/proc/self/maps")
            .env("LD_PRELOAD", lib)
            .output()
            .unwrap();
        let maps = String::from_utf8_lossy(&out.stdout);
        assert!(maps.contains("libvgpu.so"), "preloaded: {maps}");
        assert!(
            !maps.contains("libvgpu_core") && !maps.contains("memfd:"),
            "{}: {maps}",
            lib.display()
        );
        assert!(out.stderr.is_empty());
    }
}

#[test]
fn a_global_probe_for_a_hooked_name_without_a_driver_does_not_load_the_core() {
    // Libraries probe for CUDA with dlsym(RTLD_DEFAULT, ...): without a
    // driver in the process that must cost nothing (no core, no memfd).
    let a = artifacts();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("probe.c");
    std::fs::write(
        &src,
        r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    void *f = dlsym(RTLD_DEFAULT, "cuInit");
    FILE *m = fopen("/proc/self/maps", "r");
    char l[1024];
    int core = 0;
    while (m && fgets(l, sizeof l, m)) core |= strstr(l, "libvgpu_core") || strstr(l, "memfd:");
    printf("found=%d core=%d\n", f != NULL, core);
    return 0;
}
"#,
    )
    .unwrap();
    let prog = dir.path().join("probe");
    compile_c(&src, &prog, &["-ldl".as_ref()]);
    for lib in [&a.libvgpu, &a.stub] {
        let out = Command::new(&prog).env("LD_PRELOAD", lib).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        // Not found, as without vgpu, and nothing loaded for the asking.
        assert!(
            stdout.contains("found=0 core=0"),
            "{}: {stdout}",
            lib.display()
        );
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_bundle_and_the_stub_beside_the_core_both_enforce() {
    let a = artifacts();
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    for lib in [&a.libvgpu, &a.stub] {
        for path in PATHS {
            let r = Run::from(
                sim.client_cmd(path, false, &["info"])
                    .env("LD_PRELOAD", lib)
                    .output()
                    .unwrap(),
            )
            .ok();
            assert_eq!(r.u64("ctx_total"), GIB, "{} {path:?}", lib.display());
        }
    }
}

#[test]
fn an_appended_core_that_will_not_load_falls_back_to_the_one_beside_the_stub() {
    // An appended image that dlopen refuses (here: an ELF magic and
    // garbage; on a node, an LSM forbidding executable memfds) must not
    // stop the core beside the stub from being used, silently.
    let a = artifacts();
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libvgpu.so");
    let mut bytes = std::fs::read(&a.stub).unwrap();
    bytes.extend(b"\x7fELF");
    bytes.extend(std::iter::repeat_n(0x5au8, 4096));
    std::fs::write(&lib, bytes).unwrap();
    std::fs::copy(&a.core, dir.path().join("libvgpu_core.so")).unwrap();
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    for path in PATHS {
        let r = Run::from(
            sim.client_cmd(path, false, &["info"])
                .env("LD_PRELOAD", &lib)
                .output()
                .unwrap(),
        )
        .ok();
        assert_eq!(r.u64("ctx_total"), GIB, "{path:?}: {}", r.stderr);
        assert!(!r.stderr.contains("cannot load the core"), "{}", r.stderr);
    }
}

#[test]
fn without_a_core_every_hook_fails_closed_and_other_programs_run() {
    let a = artifacts();
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libvgpu.so");
    std::fs::copy(&a.stub, &lib).unwrap();
    let sim = Sim::new(1, "8g");
    // Every entry path: dlsym and cuGetProcAddress too hand out the
    // failing exports, never the driver's functions unlimited.
    for path in PATHS {
        let r = Run::from(
            sim.client_cmd(path, false, &["alloc", "buffer", "1048576"])
                .env("LD_PRELOAD", &lib)
                .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
                .output()
                .unwrap(),
        );
        assert!(
            r.stderr.contains("cannot load the core"),
            "{path:?}: {}",
            r.stderr
        );
        assert!(!r.stdout.contains("alloc_rc=0"), "{path:?}: {}", r.stdout);
    }
    let out = Command::new("/bin/sh")
        .args(["-c", "echo hi"])
        .env("LD_PRELOAD", &lib)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    assert!(out.stderr.is_empty());
}

#[test]
fn every_lookup_answers_the_address_a_linked_program_calls() {
    let a = artifacts();
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("identity");
    compile_c(
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/programs/identity.c"
        )),
        &prog,
        &[
            "-L".as_ref(),
            a.link_dir.as_os_str(),
            "-l:libcuda.so.1".as_ref(),
            "-ldl".as_ref(),
        ],
    );
    let sim = Sim::new(1, "8g");
    let r = Run::from(sim.cmd(&prog, true).output().unwrap()).ok();
    assert_eq!(r.i64("init_rc"), 0, "{}", r.stderr);
    assert_eq!(r.i64("proc_rc"), 0);
    for k in ["default_same", "handle_same", "next_same", "proc_same"] {
        assert_eq!(r.u64(k), 1, "{k}\n{}", r.stdout);
    }
}

#[test]
fn at_log_level_2_one_line_names_the_limits_and_the_region() {
    let run = |level: &str| {
        let mut sim = Sim::new(1, "8g");
        sim.set("CUDA_DEVICE_MEMORY_LIMIT", "2g")
            .set("CUDA_DEVICE_SM_LIMIT", "30")
            .set("LIBCUDA_LOG_LEVEL", level);
        let r = sim.client(Path3::Link, true, &["info"]).ok();
        assert_eq!(r.u64("ctx_total"), 2 * GIB, "level {level}: limited");
        (sim.region().display().to_string(), r.stderr)
    };
    for level in ["2", "3"] {
        let (region, stderr) = run(level);
        let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(" loaded, ")).collect();
        assert_eq!(lines.len(), 1, "level {level}: {stderr}");
        let expected = format!(
            "] INFO: vgpu {} loaded, region {region}: memory limit 2.00 GiB, SM limit 30%, policy default",
            env!("CARGO_PKG_VERSION")
        );
        assert!(lines[0].ends_with(&expected), "level {level}: {}", lines[0]);
    }
    // Level 1 (warnings) says nothing.
    let (_, stderr) = run("1");
    assert!(!stderr.contains(" loaded, "), "{stderr}");
}

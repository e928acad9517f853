//! The library is transparent while no limit is set, through every entry
//! path; and the simulated driver resolves cuGetProcAddress exactly as the
//! real one recorded on the GPU machine.

mod common;

use common::*;

/// Output lines that depend on timing or on process ids.
fn stable(out: &str) -> String {
    out.lines()
        .filter(|l| {
            !l.starts_with("rate=") && !l.starts_with("per_sec=") && !l.starts_with("launched=")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_path_passes_through_unchanged_without_limits() {
    for path in PATHS {
        let scenarios: &[&[&str]] = &[
            &["info"],
            &["alloc", "buffer", "67108864"],
            &["alloc", "vmm", "67108864"],
            &["alloc", "array", "67108864"],
            &["fill", "buffer", "268435456"],
            &["ctx", "16777216"],
            &["nulls"],
            &["badfree"],
            &["spin", "100000", "132", "1", "graph"],
        ];
        for args in scenarios {
            // A fresh machine per run, so both see the same physical state.
            let bare = Sim::new(1, "2g").client(path, false, args);
            let hooked = Sim::new(1, "2g").client(path, true, args);
            assert_eq!(
                bare.status.code(),
                hooked.status.code(),
                "{path:?} {args:?}"
            );
            assert_eq!(
                stable(&bare.stdout),
                stable(&hooked.stdout),
                "{path:?} {args:?}\nstderr: {}",
                hooked.stderr
            );
            assert!(
                hooked.stderr.is_empty(),
                "{path:?} {args:?} printed: {}",
                hooked.stderr
            );
        }
    }
}

#[test]
fn the_fill_really_reaches_the_physical_limit() {
    // Guards the test above against comparing two runs that do nothing.
    let r = Sim::new(1, "2g")
        .client(Path3::Dlsym, true, &["fill", "buffer", "268435456"])
        .ok();
    assert_eq!(r.i64("stop_rc"), 2);
    assert_eq!(
        r.u64("filled_bytes"),
        7 * 256 * MIB,
        "2 GiB less a 256 MiB context"
    );
}

#[test]
fn nvml_client_sees_the_same_with_and_without_the_library() {
    let sim = Sim::new(2, "4g");
    let holder = sim.spawn_client(Path3::Link, false, &["hold", "268435456", "30"]);
    // Context (256 MiB) and allocation both made: the figure is settled.
    assert!(wait_until(10.0, || sim.physical(0).1 >= 512 * MIB));
    let bare = Run::from(sim.cmd("smi", false).output().unwrap()).ok();
    let hooked = Run::from(sim.cmd("smi", true).output().unwrap()).ok();
    let mut holder = holder;
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(bare.stdout, hooked.stdout);
    assert_eq!(hooked.u64("gpus"), 2);
    assert_eq!(hooked.u64("gpu0_v1_used"), 512 * MIB);
}

/// Runs the probe that recorded tests/data/proc_address_table.csv on the
/// H200 against the simulator: with and without the library, every row
/// must match (the library hands out its wrapper of the very symbol the
/// driver chose, which dlsym also resolves to).
#[test]
fn cu_get_proc_address_matches_the_recorded_driver() {
    let recorded = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/proc_address_table.csv"
    ))
    .unwrap();
    let rows = recorded.lines().count() - 1;
    let symbols: std::collections::HashSet<&str> = recorded
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').nth(1))
        .collect();
    assert!(
        rows >= 3000 && symbols.len() >= 40,
        "{rows} rows, {} symbols",
        symbols.len()
    );
    let sim = Sim::new(1, "1g");
    for preload in [false, true] {
        let out = sim.cmd("proc_address", preload).output().unwrap();
        assert!(out.status.success());
        let got = String::from_utf8(out.stdout).unwrap();
        let diff: Vec<_> = recorded
            .lines()
            .zip(got.lines())
            .filter(|(a, b)| a != b)
            .take(5)
            .collect();
        assert!(
            diff.is_empty(),
            "preload={preload}: differing rows {diff:?}"
        );
        assert_eq!(
            recorded.lines().count(),
            got.lines().count(),
            "preload={preload}"
        );
    }
}

/// The families the library hooks all appear in the recorded table.
#[test]
fn the_table_covers_every_hooked_family() {
    let recorded = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/proc_address_table.csv"
    ))
    .unwrap();
    for base in [
        "cuMemAlloc",
        "cuMemAllocPitch",
        "cuMemAllocManaged",
        "cuMemAllocAsync",
        "cuMemAllocFromPoolAsync",
        "cuMemFree",
        "cuMemFreeAsync",
        "cuMemCreate",
        "cuMemRelease",
        "cuArrayCreate",
        "cuArray3DCreate",
        "cuMipmappedArrayCreate",
        "cuMemGetInfo",
        "cuDeviceTotalMem",
        "cuCtxCreate",
        "cuCtxDestroy",
        "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease",
        "cuDevicePrimaryCtxReset",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "cuGraphLaunch",
        "cuGraphInstantiate",
        "cuStreamBeginCapture",
        "cuStreamEndCapture",
        "cuGetProcAddress",
        "cuInit",
        "cuMemPoolCreate",
    ] {
        assert!(
            recorded.contains(&format!("v2,{base},")),
            "{base} missing from the table"
        );
    }
}

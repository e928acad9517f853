//! A fork while another thread holds a lock of vgpu must not deadlock the
//! child (issue 10, bug 2): a child has one thread, so a lock inherited
//! held stays held. `VGPU_TEST_HOLD_LOCK=<name>` has a thread of vgpu hold
//! that lock from `cuInit` until a fork is under way; the program forks at
//! once, and the child makes a context, allocates, frees and exits. Every
//! lock vgpu lists is tried (the library names them), through every entry
//! path's program build.

mod common;

use common::*;

/// Every lock the library knows, as it names them.
fn lock_names(sim: &Sim) -> Vec<String> {
    let mut c = sim.client_cmd(Path3::Dlsym, true, &["forkheld"]);
    c.env("VGPU_TEST_HOLD_LOCK", "?");
    let r = Run::from(c.output().expect("run cuclient"));
    let line = r
        .stderr
        .lines()
        .find_map(|l| l.split("locks: ").nth(1))
        .unwrap_or_else(|| panic!("no lock list:\n{}", r.stderr));
    line.split_whitespace().map(str::to_string).collect()
}

#[test]
fn a_fork_while_any_lock_is_held_never_hangs_the_child() {
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "2g");
    let names = lock_names(&sim);
    // One name of each module's list, so that a list left out of the
    // library's fails here.
    for expected in [
        "attach.claiming",
        "region",
        "contexts",
        "pools",
        "tracker.0",
        "tracker.15",
        "events.pending",
        "probes",
        "nvml.devices",
        "hostpid.before",
        "oversub.restore_done",
        "oversub.free_probe",
        "oversub.claims",
        "oversub.lock_missed",
        "oversub.baseline",
        "oversub.saved",
        "nvml.unreaped",
        "watcher.thread",
    ] {
        assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
    }
    for (i, name) in names.iter().enumerate() {
        let path = PATHS[i % PATHS.len()];
        let mut c = sim.client_cmd(path, true, &["forkheld"]);
        c.env("VGPU_TEST_HOLD_LOCK", name);
        let r = Run::from(c.output().expect("run cuclient")).ok();
        assert!(
            r.stderr
                .contains(&format!("a thread holds {name} until a fork")),
            "{name}: the hook did not hold it\n{}",
            r.stderr
        );
        assert_eq!(
            r.get("child_exit"),
            "0",
            "{name}: the forked child\n{}{}",
            r.stdout,
            r.stderr
        );
        assert!(!r.stderr.contains("still held"), "{name}: {}", r.stderr);
        assert_eq!(r.i64("parent_rc"), 0, "{name}: the parent\n{}", r.stderr);
    }
}

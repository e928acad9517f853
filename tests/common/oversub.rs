//! The simulated node of the oversubscription tests (tests/oversub.rs,
//! tests/oversub_hostile.rs): each "container" has its own region; they
//! share the simulated card (4 GiB, 256 MiB per context) and the node's
//! board, and NVML's memory queries of a suspended process wait for its
//! restore, as on the H200.

use std::cell::RefCell;
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Path3, Run, Sim};

pub struct Node {
    pub sim: Sim,
    /// When each container's last process was spawned (`settle`).
    spawned: RefCell<HashMap<String, Instant>>,
}

impl Node {
    /// After a's start, b asks for `bytes` (held 1.5 s) that the card has
    /// only once a is suspended; returns b once the board shows `seen`
    /// (within `within_s`).
    pub fn crowd_out_with(&self, bytes: u64, seen: &str, within_s: f64) -> Child {
        self.settle("a");
        let a_for = self.spawned.borrow().get("a").map(|t| t.elapsed());
        let b = self.spawn(
            "b",
            &[("VGPU_OVERSUBSCRIBE_WAIT_MS", "10000")],
            &["hold", &bytes.to_string(), "1.5"],
        );
        if !super::wait_until(within_s, || self.board().contains(seen)) {
            let board = self.board();
            let mut b = b;
            // (It has given up by now: killed only if it still waits.)
            let _ = b.kill();
            let b = super::finish(b);
            panic!(
                "the board never showed {seen}: {board}\nb (asked for {bytes}, a had run {a_for:?}): {}\n{}",
                b.stdout, b.stderr
            );
        }
        b
    }

    /// Waits until container `name` (spawned last) holds 1 GiB, then 1.5 s
    /// from its spawn and at least half a second more: the time a
    /// neighbour comes to crowd it out. On a loaded host its start takes
    /// longer, and a neighbour that came at a fixed time took the card
    /// first, so it was never suspended (a loaded CI run).
    pub fn settle(&self, name: &str) {
        let spawned = self.spawned.borrow().get(name).copied();
        let spawned = spawned.unwrap_or_else(Instant::now);
        assert!(
            super::wait_until(30.0, || self.used_bytes(name) >= 1 << 30),
            "{name} never held 1 GiB"
        );
        let go = (spawned + Duration::from_millis(1500))
            .max(Instant::now() + Duration::from_millis(500));
        std::thread::sleep(go.saturating_duration_since(Instant::now()));
    }

    /// Every byte container `name`'s processes hold, as its region says.
    pub fn used_bytes(&self, name: &str) -> u64 {
        let region = self.sim.dir.path().join(format!("{name}.cache"));
        self.sim.used_bytes(&region)
    }

    /// Host copies the simulated driver's checkpoint API holds: one per
    /// process suspended through it.
    pub fn host_copies(&self) -> usize {
        std::fs::read_dir(self.sim.dir.path())
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("sim.state.ckpt.")
            })
            .count()
    }

    /// Asserts that the checkpoint API holds no host copy but those of
    /// `others` that exited suspended. Such a process (b, idle in its hold
    /// once a asks its room back, where a loaded host stretched b's start
    /// past a's idle spell) leaves its copy until its entry is claimed
    /// again, as the kernel frees a dead process's memory: by the time
    /// this looks, another process may have claimed it (a loaded CI run
    /// found none left), so those copies may be there or not.
    pub fn assert_no_copies_but_of(&self, others: &[&Run]) {
        let exited_suspended = others
            .iter()
            .filter(|r| {
                r.stderr.matches("suspended this process").count()
                    > r.stderr.matches("restored this process").count()
            })
            .count();
        let copies = self.host_copies();
        assert!(
            copies <= exited_suspended,
            "{copies} host copies left, {exited_suspended} processes exited suspended; the others' logs: {:?}",
            others.iter().map(|r| &r.stderr).collect::<Vec<_>>()
        );
    }

    pub fn new() -> Node {
        Node::with_card("4g", "3g")
    }

    /// A node whose card holds `card` bytes, each container `quota`.
    pub fn with_card(card: &str, quota: &str) -> Node {
        Node::with_cards(1, card, quota)
    }

    /// [`Node::with_card`] with `count` such cards.
    pub fn with_cards(count: u32, card: &str, quota: &str) -> Node {
        let mut sim = Sim::new(count, card);
        let board = sim.dir.path().join("board").display().to_string();
        sim.set("CUDA_DEVICE_MEMORY_LIMIT", quota)
            .set("CUDA_OVERSUBSCRIBE", "true")
            .set("VGPU_OVERSUBSCRIBE_DIR", &board)
            .set("VGPU_OVERSUBSCRIBE_IDLE_MS", "300")
            // The checkpoint API moves everything unless a test says
            // otherwise (on auto, the default, a process that sees one
            // card moves its large blocks by VMM copies).
            .set("VGPU_OVERSUBSCRIBE_VMM", "false")
            // As the H200 behaved: NVML's memory queries of a suspended
            // process wait for its restore.
            .set("SIM_GPU_NVML_LOCKED", "1");
        Node {
            sim,
            spawned: RefCell::default(),
        }
    }

    /// The node's board directory.
    pub fn board_dir(&self) -> std::path::PathBuf {
        self.sim.dir.path().join("board")
    }

    /// `vgpuctl oversub` on the node's board.
    pub fn board(&self) -> String {
        let dir = self.board_dir();
        self.sim.ctl(&["oversub", dir.to_str().unwrap()]).stdout
    }

    /// cuclient in container `name`, with `env` on top.
    pub fn client(&self, name: &str, env: &[(&str, &str)], args: &[&str]) -> Command {
        self.client_via(Path3::Link, name, env, args)
    }

    pub fn client_via(
        &self,
        path: Path3,
        name: &str,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Command {
        let mut c = self.sim.client_cmd(path, true, args);
        let region = self.sim.dir.path().join(format!("{name}.cache"));
        c.env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region);
        for (k, v) in env {
            c.env(k, v);
        }
        c
    }

    pub fn spawn(&self, name: &str, env: &[(&str, &str)], args: &[&str]) -> Child {
        self.spawn_via(Path3::Link, name, env, args)
    }

    /// `spawn` through another entry path of the driver.
    pub fn spawn_via(&self, path: Path3, name: &str, env: &[(&str, &str)], args: &[&str]) -> Child {
        self.spawned
            .borrow_mut()
            .insert(name.to_string(), Instant::now());
        self.client_via(path, name, env, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    pub fn run(&self, name: &str, env: &[(&str, &str)], args: &[&str]) -> Run {
        Run::from(self.client(name, env, args).output().unwrap())
    }
}

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
    /// After a's start, b (`env` on top of a 10 s wait for room) runs
    /// cuclient `b_args` (a `hold` of what the card has only once a is
    /// suspended); returns b once the board has counted a suspension
    /// (within 30 s). Where none comes, the test fails with the board,
    /// where a's watcher thread was, and both processes' output (b's
    /// first, the shorter), both stopped.
    pub fn crowd_out_by(&self, a: &mut Child, env: &[(&str, &str)], b_args: &[&str]) -> Child {
        self.settle("a");
        let a_for = self
            .spawned
            .borrow()
            .get("a")
            .map_or(0.0, |t| t.elapsed().as_secs_f64());
        let mut b_env = vec![("VGPU_OVERSUBSCRIBE_WAIT_MS", "10000")];
        b_env.extend_from_slice(env);
        let b = self.spawn("b", &b_env, b_args);
        // (The count, not the state: a process whose idle spell ends at
        // once is restoring by the time a loaded host lists the board.)
        if !super::wait_until(30.0, || self.board().contains("suspensions=1")) {
            let board = self.board();
            let watcher = thread_stack(a.id(), "vgpu-watcher");
            let (a_out, a_err) = stopped(a);
            let mut b = b;
            let (b_out, b_err) = stopped(&mut b);
            panic!(
                "no suspension counted: {board}\na's watcher thread:\n{watcher}\nb (came {a_for:.2} s after a's spawn):\n{b_out}\n{b_err}\na:\n{a_out}\n{a_err}"
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

/// Kills `child` if it still runs and reads what its pipes hold (a pipe
/// another reader took reads empty).
fn stopped(child: &mut Child) -> (String, String) {
    use std::io::Read;
    let _ = child.kill();
    let _ = child.wait();
    let mut out = String::new();
    let mut err = String::new();
    if let Some(p) = child.stdout.as_mut() {
        let _ = p.read_to_string(&mut out);
    }
    if let Some(p) = child.stderr.as_mut() {
        let _ = p.read_to_string(&mut err);
    }
    (out, err)
}

/// The functions on the stack of `pid`'s thread named `name`, innermost
/// first, as gdb sees them (attached for a moment), or why not: whether
/// a process that should have made room had its watcher stuck somewhere.
fn thread_stack(pid: u32, name: &str) -> String {
    // vgpu's core runs from a memfd (the bundle), which gdb cannot open:
    // its symbols come from the rig's copy, at the memfd's load address.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let base = maps
        .lines()
        .find(|l| l.contains("memfd:libvgpu_core.so"))
        .and_then(|l| l.split('-').next());
    let core = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libvgpu.so"))
        .map(|p| std::path::Path::new(p).with_file_name("stub/libvgpu_core.so"));
    let symbols = match (base, core) {
        (Some(base), Some(core)) => format!("add-symbol-file {} -o 0x{base}", core.display()),
        _ => "echo".to_string(),
    };
    let out = Command::new("timeout")
        .args(["30", "gdb", "-p", &pid.to_string(), "-batch", "-nx"])
        .args(["-iex", "set auto-solib-add off"])
        .args(["-ex", &symbols, "-ex", "thread apply all bt 10"])
        .stdin(Stdio::null())
        .output();
    let (text, err, status) = match out {
        Ok(o) => (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
            o.status,
        ),
        Err(e) => return format!("(no gdb: {e})"),
    };
    let quoted = format!("\"{name}\"");
    let Some(block) = text
        .split("\nThread ")
        .find(|b| b.lines().next().is_some_and(|l| l.contains(&quoted)))
    else {
        let why = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return format!("(gdb showed no thread {quoted}: {status}; {why})");
    };
    block
        .lines()
        .filter_map(|l| {
            let frame = l.trim_start().strip_prefix('#')?;
            let (n, rest) = frame.split_once(' ')?;
            let rest = rest.trim_start();
            let rest = rest.split_once(" in ").map_or(rest, |(_, f)| f);
            let func = rest.split(" (").next().unwrap_or(rest);
            // (Without rustc's hash suffix, and a generic's long tail.)
            let func = func.rsplit_once("::h").map_or(func, |(f, _)| f);
            Some(format!(
                "  #{n} {}",
                func.chars().take(100).collect::<String>()
            ))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

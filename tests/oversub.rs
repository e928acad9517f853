//! Memory oversubscription on the simulated GPU (docs/oversubscription.md):
//! admission when the card (not the quota) is full, an idle process
//! suspended whole and restored on its next call with its data intact, a
//! process killed while suspended, a restore that finds no room within its
//! bound, the watcher (the actor) gone, and the bound on host memory for
//! suspended state.
//!
//! Each "container" has its own region; they share the simulated card
//! (4 GiB, 256 MiB per context) and the node's board.

mod common;

use std::process::Child;
use std::time::{Duration, Instant};

use common::oversub::Node;
use common::*;

impl Node {
    /// b asks for 2 GiB (held 1.5 s), which the card has once a is
    /// suspended.
    fn crowd_out(&self, a: &mut Child) -> Child {
        self.crowd_out_by(a, &[], &["hold", "2147483648", "1.5"])
    }
}

/// A process with a checksummed 64 MiB buffer and 2 GiB beside it, idle
/// for `idle` seconds before it reads the buffer back.
fn keeper(idle: &str) -> Vec<String> {
    ["keep", "67108864", "2147483648", "7", idle]
        .map(String::from)
        .to_vec()
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn assert_intact(a: &Run) {
    assert_eq!(a.get("intact"), "1", "{}\n{}", a.stdout, a.stderr);
    assert_eq!(a.get("sum"), a.get("back_sum"));
}

#[test]
fn a_full_card_makes_an_allocation_wait_then_fail_saying_so_and_without_the_flag_it_fails_at_once()
{
    let _serial = serial();
    let node = Node::new();
    // The holder is never idle long enough to be suspended, and gives no
    // turns (tests/oversub_turns.rs has those). It keeps the card for
    // 10 s: b and c, slow to start on a loaded host, still find it full.
    let keep = keeper("10");
    let a = node.spawn(
        "a",
        &[
            ("VGPU_OVERSUBSCRIBE_IDLE_MS", "600000"),
            ("VGPU_OVERSUBSCRIBE_QUANTUM_MS", "0"),
        ],
        &args(&keep),
    );
    node.settle("a");
    let t = Instant::now();
    let b = node.run(
        "b",
        &[("VGPU_OVERSUBSCRIBE_WAIT_MS", "800")],
        &["hold", "2147483648", "0"],
    );
    let waited = t.elapsed();
    assert_eq!(b.get("hold_rc"), "2", "{}", b.stderr);
    assert!(waited >= Duration::from_millis(800), "{waited:?}");
    assert!(
        b.stderr.contains("the card is full (not the quota)"),
        "{}",
        b.stderr
    );
    // Without the flag: today's behaviour, the driver's answer at once
    // (timed from the allocation, not the process's start).
    let c = node.run(
        "c",
        &[("CUDA_OVERSUBSCRIBE", "false")],
        &["await", "2147483648", "0", "0"],
    );
    assert_eq!(c.get("await_rc"), "2", "{}", c.stderr);
    let alloc_ms: f64 = c.get("alloc_ms").parse().unwrap();
    assert!(alloc_ms < 700.0, "{alloc_ms} ms");
    assert!(!c.stderr.contains("card is full"), "{}", c.stderr);
    assert_intact(&finish(a));
}

#[test]
fn an_idle_process_is_suspended_for_a_waiting_one_and_restored_intact_on_its_next_call() {
    let _serial = serial();
    let node = Node::new();
    // (Idle 10 s: still suspended when the board and the copies are read
    // below, however late a loaded host shows the suspension.)
    let keep = keeper("10");
    // Here NVML answers a suspended process (the restore uses its figure);
    // in the other tests it blocks (the restore judges room from the board).
    let mut a = node.spawn("a", &[("SIM_GPU_NVML_LOCKED", "0")], &args(&keep));
    let b = node.crowd_out(&mut a);
    let board = node.board();
    assert!(board.contains("suspensions=1"), "{board}");
    assert!(!board.contains("host_bytes=0\n"), "{board}");
    assert_eq!(node.host_copies(), 1);
    let b = finish(b);
    assert_eq!(b.get("hold_rc"), "0", "{}", b.stderr);
    let a = finish(a);
    assert_intact(&a);
    assert!(a.stderr.contains("suspended this process"), "{}", a.stderr);
    assert!(a.stderr.contains("restored this process"), "{}", a.stderr);
    assert_eq!(a.stderr.matches("suspended this process").count(), 1);
    node.assert_no_copies_but_of(&[&b]);
}

#[test]
fn a_stuck_or_slow_nvml_child_gets_a_sibling_and_the_process_is_suspended_and_restored() {
    // Before it checkpoints, a process makes sure a child of its own can
    // read NVML (its restore needs one). A child cloned while another
    // thread held the allocator's lock waited for ever, and the process
    // kept the card (CI, once). Here the first child stalls; its sibling
    // answers.
    // And NVML starts slowly in the children (as on a node of many
    // cards): the restore trusted a figure while it was half a second
    // old, and one stamped when its child was made was stale on arrival, so
    // the process waited for room it had (run 116 on an H200: minutes).
    // Stamped when the child asks, the restore finds it at once.
    // And the answer reaches the process late, as a loaded host carries
    // it: counted fresh from the question, every figure was stale on
    // arrival again (CI, once: 13 s of waiting for room it had).
    let _serial = serial();
    let node = Node::new();
    let stalled = node.sim.dir.path().join("stalled");
    let keep = keeper("5");
    let mut a = node.spawn(
        "a",
        &[
            ("SIM_GPU_NVML_STALL_FIRST", stalled.to_str().unwrap()),
            ("SIM_GPU_NVML_INIT_MS", "800"),
            ("SIM_GPU_NVML_ANSWER_MS", "700"),
            ("VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS", "20000"),
        ],
        &args(&keep),
    );
    let b = node.crowd_out(&mut a);
    assert_eq!(finish(b).get("hold_rc"), "0");
    let a = finish(a);
    assert!(stalled.exists(), "no child stalled: {}", a.stderr);
    // The stalled child held none of the process's pipes (its stdout and
    // stderr are the test's): only its answer's, and /dev/null as its
    // standard streams. (One stuck for good would keep them open.)
    let held = std::fs::read_to_string(&stalled).unwrap();
    let pipes = held.lines().filter(|l| l.contains("pipe:")).count();
    assert_eq!(pipes, 1, "{held}");
    for std in ["0", "1", "2"] {
        assert!(
            held.lines().any(|l| l == format!("{std} /dev/null")),
            "{std}: {held}"
        );
    }
    assert_intact(&a);
    assert!(a.stderr.contains("suspended this process"), "{}", a.stderr);
    assert!(a.stderr.contains("restored this process"), "{}", a.stderr);
    assert!(!a.stderr.contains("still waiting for room"), "{}", a.stderr);
    assert!(!a.stderr.contains("could not read NVML"), "{}", a.stderr);
}

#[test]
fn a_checkpointed_process_on_several_cards_restores_where_nvml_children_are_slow() {
    // Its restore needs a fresh figure of each card, asked one at a time.
    // Where a child takes longer than a figure stands (NVML starting
    // slowly), the first card's figure had gone stale by the time the
    // next one's came, and the restore waited for room it had: two cards
    // never restored within 20 s. A claim's figures, one card after
    // another, stay within what others wait for the node's lock.
    let _serial = serial();
    for cards in [2u32, 4] {
        let node = Node::with_cards(cards, "4g", "3g");
        let keep = keeper("5");
        let others = (cards - 1).to_string();
        let mut a = node.spawn(
            "a",
            &[
                ("CUCLIENT_KEEP_DEVICE1", "67108864"),
                ("CUCLIENT_KEEP_CARDS", &others),
                ("SIM_GPU_NVML_INIT_MS", "800"),
                ("VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS", "30000"),
            ],
            &args(&keep),
        );
        let b = node.crowd_out(&mut a);
        assert_eq!(finish(b).get("hold_rc"), "0");
        let a = finish(a);
        assert_intact(&a);
        assert_eq!(a.get("device1_intact"), "1", "{}\n{}", a.stdout, a.stderr);
        assert!(a.stderr.contains("restored this process"), "{}", a.stderr);
        let by_card = a
            .stderr
            .split("; by card: ")
            .nth(1)
            .and_then(|l| l.lines().next())
            .unwrap_or_else(|| panic!("{cards} cards: no restore by card: {}", a.stderr));
        assert_eq!(by_card.split(", ").count(), cards as usize, "{by_card}");
        assert!(
            !a.stderr.contains("still waiting for room"),
            "{cards} cards: {}",
            a.stderr
        );
    }
}

#[test]
fn a_first_call_vgpu_does_not_hook_or_never_sees_restores_the_process_too() {
    // The driver's lock blocks every call of a suspended process. A PyTorch
    // job whose first call after its idle spell was one without a hook
    // waited in the driver for ever (run 21). Reached through
    // cuGetProcAddress (cudart) or dlsym on the driver (XLA), such a call
    // now restores the process. Linked directly (-lcuda), the call never
    // reaches vgpu: the watcher finds the thread waiting inside the driver.
    let _serial = serial();
    for path in [Path3::ProcAddr, Path3::Dlsym, Path3::Link] {
        let node = Node::new();
        // (Idle 8 s: b, slow to start on a loaded host, finds it idle.)
        let keep = keeper("8");
        let mut a = node.spawn_via(
            path,
            "a",
            &[("CUCLIENT_WAKE_WITH_EVENT_QUERY", "1")],
            &args(&keep),
        );
        let b = node.crowd_out(&mut a);
        let b = finish(b);
        assert_eq!(b.get("hold_rc"), "0", "{}", b.stderr);
        let a = finish_within(a, 20.0);
        assert_eq!(a.get("wake_rc"), "0", "{}\n{}", a.stdout, a.stderr);
        assert_intact(&a);
        assert!(a.stderr.contains("restored this process"), "{}", a.stderr);
        if matches!(path, Path3::Link) {
            assert!(a.stderr.contains("waits inside the driver"), "{}", a.stderr);
        }
    }
}

/// `finish`, but a child still running after `secs` is killed and the
/// test fails: it hung.
fn finish_within(mut child: Child, secs: f64) -> Run {
    let exited = wait_until(secs, || matches!(child.try_wait(), Ok(Some(_))));
    if !exited {
        let _ = child.kill();
        let r = finish(child);
        panic!(
            "still running after {secs} s (hung):\n{}\n{}",
            r.stdout, r.stderr
        );
    }
    finish(child)
}

#[test]
fn a_call_during_a_long_checkpoint_waits_for_it_and_the_data_comes_back() {
    // A 46.7 GiB checkpoint took 25 s on the H200; the process's next call
    // came meanwhile, took the watcher's silence for its death, restored a
    // half-checkpointed process and lost it (run 19).
    let _serial = serial();
    let node = Node::new();
    let keep = keeper("4");
    let a = node.spawn("a", &[("SIM_GPU_CKPT_MS", "5000")], &args(&keep));
    node.settle("a");
    let b = node.spawn(
        "b",
        &[("VGPU_OVERSUBSCRIBE_WAIT_MS", "20000")],
        &["hold", "2147483648", "1"],
    );
    let b = finish(b);
    assert_eq!(b.get("hold_rc"), "0", "{}", b.stderr);
    let a = finish(a);
    assert_intact(&a);
    assert!(!a.stderr.contains("watcher thread is gone"), "{}", a.stderr);
    assert!(a.stderr.contains("restored this process"), "{}", a.stderr);
}

/// A keeps 2 GiB, idle 8 s, its environment `env` (a checkpoint the
/// simulated driver fails); b waits up to 3 s for 2 GiB beside it. A's
/// run, which must end within 60 s, and the node.
fn with_a_failing_checkpoint(env: &[(&str, &str)]) -> (Node, Run) {
    let node = Node::new();
    let a = node.spawn("a", env, &args(&keeper("8")));
    node.settle("a");
    let b = node.spawn(
        "b",
        &[("VGPU_OVERSUBSCRIBE_WAIT_MS", "3000")],
        &["hold", "2147483648", "1"],
    );
    let _ = finish(b);
    let a = finish_within(a, 60.0);
    (node, a)
}

#[test]
fn a_checkpoint_that_fails_leaves_the_process_running_and_intact() {
    let _serial = serial();
    let (node, a) = with_a_failing_checkpoint(&[
        ("SIM_GPU_CKPT_FAIL", "checkpoint"),
        ("LIBCUDA_LOG_LEVEL", "4"),
    ]);
    assert_intact(&a);
    // A warning, the first time: a neighbour waits on it.
    assert!(
        a.stderr
            .contains("WARN: CUDA_OVERSUBSCRIBE: not suspended: the checkpoint failed ("),
        "{}",
        a.stderr
    );
    // Tried once, not again within 10 s (each try locks its calls).
    assert_eq!(
        a.stderr.matches("the checkpoint failed (").count(),
        1,
        "{}",
        a.stderr
    );
    // The watcher asked again meanwhile, and was held back.
    assert!(
        a.stderr
            .contains("not suspended: its last checkpoint failed"),
        "{}",
        a.stderr
    );
    assert!(!a.stderr.contains("suspended this process"), "{}", a.stderr);
    assert!(!a.stderr.contains("fail from now on"), "{}", a.stderr);
    assert_eq!(node.host_copies(), 0);
}

#[test]
fn a_checkpoint_that_fails_and_leaves_the_process_locked_fails_its_calls_rather_than_hang() {
    // The driver's lock outlives a failed checkpoint where the unlock
    // fails too: every call of the process would wait on it for good.
    let _serial = serial();
    let (_node, a) = with_a_failing_checkpoint(&[("SIM_GPU_CKPT_FAIL", "checkpoint-unlock")]);
    assert!(
        a.stderr.contains("the checkpoint failed (")
            && a.stderr.contains("could not be unlocked ("),
        "{}",
        a.stderr
    );
    assert!(a.stderr.contains("fail from now on"), "{}", a.stderr);
    // Its read back failed with CUDA_ERROR_ILLEGAL_STATE (401).
    assert_eq!(a.get("back_rc"), "401", "{}\n{}", a.stdout, a.stderr);
    assert_eq!(a.get("intact"), "0", "{}", a.stdout);
}

#[test]
fn a_suspended_process_keeps_its_region_slot_beating() {
    // In a pid namespace a slot whose heartbeat stops looks dead to its
    // neighbours after 3 s, and NVML lists no memory for a suspended
    // process: its memory would leave the quota. The slot beats through a
    // long checkpoint (5 s here) and while suspended.
    let _serial = serial();
    let node = Node::new();
    // A idles 20 s before its next call restores it: a loaded host
    // delays the checkpoint's start and stretches it (6.5 s once).
    let keep = keeper("20");
    let mut a = node.spawn("a", &[("SIM_GPU_CKPT_MS", "5000")], &args(&keep));
    let region = node.sim.dir.path().join("a.cache");
    let age = || node.sim.try_status(&region)?["processes"][0]["heartbeat_age_ms"].as_u64();
    node.settle("a");
    let mut b = node.spawn(
        "b",
        &[("VGPU_OVERSUBSCRIBE_WAIT_MS", "20000")],
        &["hold", "2147483648", "0.5"],
    );
    assert!(
        wait_until(10.0, || node.board().contains("state=suspending")),
        "{}",
        node.board()
    );
    // Watched through the checkpoint and a second into the suspension
    // (the state read on each round: the next call may restore A soon).
    let mut oldest = 0;
    let mut suspended_at: Option<Instant> = None;
    let mut board = String::new();
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until && suspended_at.is_none_or(|t| t.elapsed().as_secs() < 1) {
        oldest = oldest.max(age().unwrap_or(u64::MAX));
        board = node.board();
        if board.contains("state=suspended") || board.contains("state=restoring") {
            suspended_at.get_or_insert_with(Instant::now);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    if suspended_at.is_none() {
        // (Once A stayed "suspending" 32 s past a 5 s checkpoint on an
        // unloaded 2-core CI host: its log says where it stood.)
        let _ = b.kill();
        let _ = a.kill();
        let a = finish(a);
        panic!(
            "never seen suspended; the board last read:\n{board}\nA's log:\n{}",
            a.stderr
        );
    }
    // (Neighbours take a slot for dead after 3 s; without the beat it
    // aged 5.2 s. Under a loaded CI host the beating thread waited up to
    // 1.7 s for a CPU.)
    assert!(oldest < 2500, "the slot's heartbeat aged {oldest} ms");
    let b = finish(b);
    assert_eq!(b.get("hold_rc"), "0", "{}", b.stderr);
    let a = finish_within(a, 60.0);
    assert_intact(&a);
}

#[test]
fn a_restore_that_finds_no_room_within_its_bound_fails_the_call_and_a_later_call_restores_intact() {
    let _serial = serial();
    let node = Node::new();
    // A is suspended for B, then wants its 2 GiB back while B, never idle
    // long enough to be suspended itself, still holds the card for 6 s.
    let keep: Vec<String> = ["keep", "67108864", "2147483648", "7", "3", "20"]
        .map(String::from)
        .to_vec();
    let a = node.spawn(
        "a",
        &[("VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS", "1000")],
        &args(&keep),
    );
    node.settle("a");
    let b = node.spawn(
        "b",
        &[
            ("VGPU_OVERSUBSCRIBE_WAIT_MS", "10000"),
            ("VGPU_OVERSUBSCRIBE_IDLE_MS", "600000"),
        ],
        &["hold", "2147483648", "6"],
    );
    assert!(
        wait_until(10.0, || node.board().contains("suspensions=1")),
        "{}",
        node.board()
    );
    let b = finish(b);
    assert_eq!(b.get("hold_rc"), "0", "{}", b.stderr);
    let a = finish(a);
    // The first read back gave up after the bound, with out of memory.
    assert_eq!(a.get("first_back_rc"), "2", "{}\n{}", a.stdout, a.stderr);
    let first_ms: f64 = a.get("first_back_ms").parse().unwrap();
    assert!((1000.0..4000.0).contains(&first_ms), "{first_ms}");
    assert!(
        a.stderr
            .contains("the card had no room to restore this process ("),
        "{}",
        a.stderr
    );
    assert!(
        a.stderr
            .contains("within 1000 ms (VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS)"),
        "{}",
        a.stderr
    );
    // It stayed suspended with its host copy, and a later call restored it.
    assert_eq!(a.get("back_rc"), "0", "{}", a.stderr);
    assert!(a.u64("back_tries") >= 2, "{}", a.stdout);
    assert_intact(&a);
    assert_eq!(a.stderr.matches("suspended this process").count(), 1);
    assert_eq!(a.stderr.matches("restored this process").count(), 1);
    assert!(!a.stderr.contains("fail from now on"), "{}", a.stderr);
    assert_eq!(node.host_copies(), 0);
}

#[test]
fn a_process_killed_while_suspended_frees_its_host_copy() {
    let _serial = serial();
    let node = Node::new();
    let keep = keeper("60");
    let mut a = node.spawn("a", &[], &args(&keep));
    node.settle("a");
    let b = node.spawn(
        "b",
        &[("VGPU_OVERSUBSCRIBE_WAIT_MS", "10000")],
        &["hold", "2147483648", "1"],
    );
    assert!(wait_until(10.0, || node
        .board()
        .contains("state=suspended")));
    assert_eq!(node.host_copies(), 1);
    let _ = a.kill();
    let _ = a.wait();
    assert_eq!(finish(b).get("hold_rc"), "0");
    // The board no longer counts it; the driver frees its copy.
    assert!(node.board().contains("host_bytes=0\n"), "{}", node.board());
    let c = node.run("c", &[], &["hold", "2684354560", "0"]);
    assert_eq!(c.get("hold_rc"), "0", "{}", c.stderr);
    assert_eq!(node.host_copies(), 0);
}

#[test]
fn with_its_watcher_gone_a_suspended_process_restores_itself_on_its_next_call() {
    let _serial = serial();
    let node = Node::new();
    let keep = keeper("8");
    let a = node.spawn("a", &[("VGPU_TEST_WATCHER_STOP", "1")], &args(&keep));
    node.settle("a");
    let b = node.run(
        "b",
        &[("VGPU_OVERSUBSCRIBE_WAIT_MS", "10000")],
        &["hold", "2147483648", "0.5"],
    );
    assert_eq!(b.get("hold_rc"), "0", "{}", b.stderr);
    let a = finish(a);
    assert_intact(&a);
    assert!(a.stderr.contains("the watcher thread ends"), "{}", a.stderr);
    assert!(
        a.stderr.contains("the watcher thread is gone"),
        "{}",
        a.stderr
    );
    assert!(a.stderr.contains("restored this process"), "{}", a.stderr);
}

#[test]
fn past_the_host_memory_bound_nobody_is_suspended() {
    let _serial = serial();
    let node = Node::new();
    // (Idle 8 s: b's wait, and its start on a loaded host, end before.)
    let keep = keeper("8");
    let a = node.spawn(
        "a",
        &[("VGPU_OVERSUBSCRIBE_HOST_LIMIT", "1g")],
        &args(&keep),
    );
    node.settle("a");
    let b = node.run(
        "b",
        &[("VGPU_OVERSUBSCRIBE_WAIT_MS", "1500")],
        &["hold", "2147483648", "0"],
    );
    assert_eq!(b.get("hold_rc"), "2");
    assert!(b.stderr.contains("the card is full"), "{}", b.stderr);
    let a = finish(a);
    assert_intact(&a);
    assert!(a.stderr.contains("no more suspensions"), "{}", a.stderr);
    assert!(!a.stderr.contains("suspended this process"), "{}", a.stderr);
    assert_eq!(node.host_copies(), 0);
}

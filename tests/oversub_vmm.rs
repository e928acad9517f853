//! Oversubscription with VMM backing (`VGPU_OVERSUBSCRIBE_VMM=true`,
//! docs/oversubscription.md 2b) on the simulated GPU: large `cuMemAlloc_v2`
//! blocks are served from the driver's virtual memory API, and a
//! suspension copies them to host memory, unmaps and releases them itself,
//! then maps fresh memory at the same addresses and copies them back. The
//! simulated card keeps VMM contents with the physical handle, so a block
//! that was not copied back reads zeros: the pattern checks would see it.
//!
//! Each "container" has its own region; they share the simulated card
//! (4 GiB, 256 MiB per context) and the node's board.

mod common;

use std::process::Child;

use common::oversub::Node;
use common::*;

const VMM: (&str, &str) = ("VGPU_OVERSUBSCRIBE_VMM", "true");

impl Node {
    /// b asks for 2.5 GiB, which the card has once a is suspended.
    fn crowd_out(&self) -> Child {
        self.crowd_out_with(2684354560, "suspensions=1", 30.0)
    }
}

/// A process with a checksummed `data`-byte buffer and 1 GiB beside it,
/// idle for 8 s before it reads the buffer back.
fn keeper(data: &str) -> [&str; 6] {
    ["keep", data, "1073741824", "7", "8", "0"]
}

fn assert_intact(a: &Run) {
    assert_eq!(a.get("intact"), "1", "{}\n{}", a.stdout, a.stderr);
    assert_eq!(a.get("sum"), a.get("back_sum"));
}

/// a (VMM-backed when `env` says so) is crowded out by b; returns a's run
/// and how many checkpoint-API copies existed while a was suspended.
fn crowd(env: &[(&str, &str)], data: &str) -> (Run, usize) {
    let node = Node::new();
    let a = node.spawn("a", env, &keeper(data));
    let b = node.crowd_out();
    let board = node.board();
    assert!(board.contains("suspensions=1"), "{board}");
    let copies = node.host_copies();
    let b = finish(b);
    assert_eq!(b.get("hold_rc"), "0", "{}", b.stderr);
    let a = finish(a);
    assert_intact(&a);
    assert_eq!(
        a.stderr.matches("suspended this process").count(),
        1,
        "{}",
        a.stderr
    );
    assert!(
        a.stderr.contains("restored this process"),
        "{}\n{}",
        a.stdout,
        a.stderr
    );
    assert_eq!(node.host_copies(), 0);
    (a, copies)
}

#[test]
fn with_vmm_an_idle_process_is_moved_by_its_own_copies_and_restored_intact() {
    let _serial = serial();
    // 64 MiB of pattern and 1 GiB beside it, both VMM-backed: nothing else
    // is worth the checkpoint API, so the context stays on the card, and
    // no child process reads NVML for a checkpointed restore (the
    // simulator's first such child would make `child`).
    let dir = tempfile::tempdir().unwrap();
    let child = dir.path().join("child-nvml");
    let (a, copies) = crowd(
        &[VMM, ("SIM_GPU_NVML_STALL_FIRST", child.to_str().unwrap())],
        "67108864",
    );
    assert_eq!(copies, 0, "the checkpoint API was used:\n{}", a.stderr);
    assert!(a.stderr.contains("VMM"), "{}", a.stderr);
    assert!(!child.exists(), "a child read NVML:\n{}", a.stderr);
}

#[test]
fn with_vmm_a_small_block_stays_on_the_card_with_the_context_and_is_intact() {
    let _serial = serial();
    // 1 MiB (below 2 MiB: today's cuMemAlloc) stays with the context; the
    // 1 GiB beside it leaves by VMM copies.
    let (a, copies) = crowd(&[VMM], "1048576");
    assert_eq!(copies, 0, "the checkpoint API was used:\n{}", a.stderr);
}

#[test]
fn without_the_setting_the_checkpoint_api_moves_the_process_as_before() {
    let _serial = serial();
    let (a, copies) = crowd(&[], "67108864");
    assert_eq!(copies, 1, "{}", a.stderr);
    assert!(!a.stderr.contains("VMM"), "{}", a.stderr);
}

#[test]
fn with_vmm_and_more_than_vmm_holds_the_checkpoint_api_moves_the_rest_after_the_copies() {
    let _serial = serial();
    // 512 MiB by cuMemAllocPitch beside the VMM-backed blocks: worth the
    // checkpoint API, which follows the VMM copies.
    let (a, copies) = crowd(&[VMM, ("CUCLIENT_KEEP_PITCH", "536870912")], "67108864");
    assert_eq!(a.get("pitch_rc"), "0", "{}", a.stderr);
    assert_eq!(copies, 1, "{}", a.stderr);
    assert!(a.stderr.contains("of it by VMM copies"), "{}", a.stderr);
}

#[test]
fn with_vmm_an_ipc_exported_block_and_an_array_move_by_the_checkpoint_api_intact() {
    let _serial = serial();
    // A 64 MiB block exported by legacy IPC (its first try, on a
    // VMM-backed block, fails as the driver's would; the block after it is
    // an ordinary one) and a 256 MiB array beside the VMM-backed blocks:
    // the VMM copies move those, the checkpoint API the rest.
    let (a, copies) = crowd(
        &[
            VMM,
            ("CUCLIENT_KEEP_IPC", "67108864"),
            ("CUCLIENT_KEEP_ARRAY", "268435456"),
        ],
        "67108864",
    );
    assert_eq!(a.get("array_rc"), "0", "{}", a.stderr);
    assert_eq!(a.get("ipc_first_rc"), "1", "{}", a.stderr);
    assert_eq!(a.get("ipc_rc"), "0", "{}", a.stderr);
    assert_eq!(a.get("ipc_intact"), "1", "{}\n{}", a.stdout, a.stderr);
    assert_eq!(a.get("array_destroy_rc"), "0", "{}", a.stderr);
    assert_eq!(copies, 1, "{}", a.stderr);
    assert!(a.stderr.contains("of it by VMM copies"), "{}", a.stderr);
}

#[test]
fn with_vmm_a_process_on_two_cards_moves_both_cards_blocks_and_gets_them_back_intact() {
    // a holds 64 MiB + 1 GiB on card 0 and 64 MiB on card 1, all
    // VMM-backed; b wants card 0. The whole process is suspended: every
    // block of both cards goes by copies (each in its own card's context),
    // and comes back at its address.
    let _serial = serial();
    let node = Node::with_cards(2, "4g", "3g");
    let a = node.spawn(
        "a",
        &[
            VMM,
            // (The simulated card keeps contents up to 256 MiB a block.)
            ("CUCLIENT_KEEP_DEVICE1", "67108864"),
            ("LIBCUDA_LOG_LEVEL", "2"),
        ],
        &keeper("67108864"),
    );
    let b = node.crowd_out();
    let b = finish(b);
    assert_eq!(b.get("hold_rc"), "0", "{}", b.stderr);
    let a = finish(a);
    assert_intact(&a);
    assert_eq!(a.get("device1_intact"), "1", "{}\n{}", a.stdout, a.stderr);
    assert!(a.stderr.contains("VMM move out: 3 blocks"), "{}", a.stderr);
    assert!(a.stderr.contains("VMM move back: 3 blocks"), "{}", a.stderr);
    // Each card waits for room for its own blocks (not all of them on the
    // card that was wanted).
    let by_card = a
        .stderr
        .split("; by card: ")
        .nth(1)
        .and_then(|l| l.lines().next())
        .unwrap_or_else(|| panic!("no restore by card: {}", a.stderr));
    let each: Vec<&str> = by_card.split(", ").collect();
    assert_eq!(each.len(), 2, "{by_card}");
    assert!(
        each.iter().any(|c| c.starts_with("1.06 GiB on ")),
        "{by_card}"
    );
    assert!(
        each.iter().any(|c| c.starts_with("64.0 MiB on ")),
        "{by_card}"
    );
    assert_eq!(node.host_copies(), 0);
}

#[test]
fn with_vmm_the_host_arena_is_given_back_once_nobody_asks_for_room() {
    // a's arena (pinned when b wants room on its card, or by the move
    // itself) carries a's blocks out and back, and is unpinned once nobody
    // has asked for room for the keep time (500 ms here, 30 s otherwise)
    // while a lingers.
    let _serial = serial();
    let node = Node::new();
    let a = node.spawn(
        "a",
        &[
            VMM,
            ("VGPU_TEST_ARENA_KEEP_MS", "500"),
            ("LIBCUDA_LOG_LEVEL", "2"),
        ],
        &["keep", "67108864", "1073741824", "7", "8", "0", "3"],
    );
    let b = finish(node.crowd_out());
    assert_eq!(b.get("hold_rc"), "0", "{}", b.stderr);
    let a = finish(a);
    assert_intact(&a);
    let moved_back = a.stderr.find("VMM move back: 2 blocks");
    let given_back = a.stderr.find("host arena of 1.25 GiB given back");
    assert!(
        moved_back.is_some() && given_back > moved_back,
        "moved back, then the arena given back:\n{}",
        a.stderr
    );
}

#[test]
fn with_vmm_past_the_host_memory_bound_no_arena_is_pinned() {
    // a's blocks (1.06 GiB) are more than the host bound lets a suspension
    // take: a is never suspended, so pinning 1.25 GiB for it would only
    // take the host's memory.
    let _serial = serial();
    let node = Node::new();
    let a = node.spawn(
        "a",
        &[
            VMM,
            ("VGPU_OVERSUBSCRIBE_HOST_LIMIT", "1g"),
            ("LIBCUDA_LOG_LEVEL", "2"),
        ],
        &keeper("67108864"),
    );
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let b = node.run(
        "b",
        &[("VGPU_OVERSUBSCRIBE_WAIT_MS", "3000")],
        &["hold", "2684354560", "0"],
    );
    assert_eq!(b.get("hold_rc"), "2", "{}", b.stderr);
    let a = finish(a);
    assert_intact(&a);
    assert!(a.stderr.contains("no more suspensions"), "{}", a.stderr);
    assert!(!a.stderr.contains("host arena"), "{}", a.stderr);
}

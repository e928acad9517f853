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
    /// b asks for 2.5 GiB (held 1.5 s), which the card has once a is
    /// suspended.
    fn crowd_out(&self, a: &mut Child) -> Child {
        self.crowd_out_by(a, &[], &["hold", "2684354560", "1.5"])
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
    let mut a = node.spawn("a", env, &keeper(data));
    let b = node.crowd_out(&mut a);
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
    node.assert_no_copies_but_of(&[&b]);
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
fn with_vmm_a_block_exported_by_legacy_ipc_and_an_array_stay_on_the_card_intact() {
    let _serial = serial();
    // A 64 MiB block exported by legacy IPC (shared by its file
    // descriptor, oversub/shared.rs) and a 256 MiB array beside the
    // VMM-backed blocks: the copies move those; the shared block stays (a
    // peer may map it), and so does the array: a process that shares
    // memory is never checkpointed.
    let (a, copies) = crowd(
        &[
            VMM,
            ("CUCLIENT_KEEP_IPC", "67108864"),
            ("CUCLIENT_KEEP_ARRAY", "268435456"),
        ],
        "67108864",
    );
    assert_eq!(a.get("array_rc"), "0", "{}", a.stderr);
    assert_eq!(a.get("ipc_first_rc"), "0", "{}", a.stderr);
    assert_eq!(a.get("ipc_intact"), "1", "{}\n{}", a.stdout, a.stderr);
    assert_eq!(a.get("array_destroy_rc"), "0", "{}", a.stderr);
    assert_eq!(copies, 0, "{}", a.stderr);
    assert!(a.stderr.contains("(VMM copies alone)"), "{}", a.stderr);
}

#[test]
fn with_vmm_a_peer_maps_a_shared_block_while_its_exporter_is_suspended_and_each_sees_the_other() {
    use std::io::Read;
    let _serial = serial();
    let node = Node::new();
    let done = node.sim.dir.path().join("peer-done");
    let done = done.to_str().unwrap();
    // a shares 64 MiB by legacy IPC and holds 1 GiB beside it; it idles
    // until its peer is done.
    let mut a = node.spawn(
        "a",
        &[VMM, ("CUCLIENT_SHARE_BESIDE", "1073741824")],
        &["share", "67108864", "40", done],
    );
    let (mut out, head, hex) = shared_handle(&mut a);
    assert!(head.contains("share_rc=0"), "{head}");
    // b crowds a out: its 1 GiB goes to the host; the shared block stays.
    let b = node.crowd_out(&mut a);
    assert!(node.board().contains("suspensions=1"));
    // c, another container, maps the block while a is suspended: a's
    // pattern is there, and c writes its own.
    let c = node.run("c", &[VMM], &["open", &hex, "67108864", done]);
    assert_eq!(c.get("open_rc"), "0", "{}", c.stderr);
    assert_eq!(c.get("open_intact"), "1", "{}", c.stderr);
    assert_eq!(c.get("write_rc"), "0", "{}", c.stderr);
    // Opened again: the same address, and the mapping stays until the
    // last close.
    assert_eq!(c.get("reopen_rc"), "0", "{}", c.stderr);
    assert_eq!(c.get("reopen_same"), "1", "{}", c.stderr);
    assert_eq!(c.get("first_close_rc"), "0", "{}", c.stderr);
    assert_eq!(c.get("still_mapped"), "1", "{}", c.stderr);
    assert_eq!(c.get("close_rc"), "0", "{}", c.stderr);
    let b = finish(b);
    assert_eq!(b.get("hold_rc"), "0", "{}", b.stderr);
    let status = a.wait().unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    a.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let kv = |k: &str| {
        rest.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k}:\n{rest}\n{err}"))
            .to_string()
    };
    assert!(status.success(), "{rest}\n{err}");
    assert_eq!(kv("peer_done"), "1", "{rest}\n{err}\n{}", c.stdout);
    // After its restore a reads c's pattern (the block never moved, so
    // both mapped the same memory throughout) and its own other block.
    assert_eq!(kv("peer_wrote"), "1", "{err}");
    assert_eq!(kv("beside_intact"), "1", "{err}");
    assert_eq!(kv("free_rc"), "0", "{err}");
    // (a moved its other block alone; b, idle once granted, may then be
    // checkpointed for a's restore.)
    assert!(err.contains("(VMM copies alone)"), "{err}");
    assert!(err.contains("restored this process"), "{err}");
}

#[test]
fn a_handle_that_names_no_shared_block_fails_cleanly() {
    let _serial = serial();
    let node = Node::new();
    // Our magic, but no exporter answers by that id.
    let mut hex = hex_of(b"vgpuIPC1");
    hex.push_str(&"ab".repeat(56));
    let c = node.run("c", &[VMM], &["open", &hex, "67108864", "/dev/null"]);
    assert!(c.status.success(), "{}", c.stderr);
    assert_eq!(c.get("open_rc"), "1", "{}", c.stderr);
    assert!(
        c.stderr.contains("the exporting process does not answer"),
        "{}",
        c.stderr
    );
}

#[test]
fn a_block_freed_after_its_export_is_shared_no_more() {
    let _serial = serial();
    let node = Node::new();
    let mut a = node.spawn(
        "a",
        &[VMM, ("CUCLIENT_SHARE_FREE_FIRST", "1")],
        &["share", "67108864", "10", "/dev/null/never"],
    );
    let (_out, head, hex) = shared_handle(&mut a);
    assert!(head.contains("share_rc=0"), "{head}");
    assert!(head.contains("first_free_rc=0"), "{head}");
    // a still runs (and answers), but no longer shares that block.
    let c = node.run("c", &[VMM], &["open", &hex, "67108864", "/dev/null"]);
    let _ = a.kill();
    let _ = a.wait();
    assert!(c.status.success(), "{}", c.stderr);
    assert_eq!(c.get("open_rc"), "1", "{}", c.stderr);
    assert!(
        c.stderr.contains("no longer shares that block"),
        "{}",
        c.stderr
    );
}

/// Reads a `share` process's output up to its `ready=1`: the reader (for
/// the rest), what came before, and the handle it printed.
fn shared_handle(
    a: &mut Child,
) -> (
    std::io::BufReader<std::process::ChildStdout>,
    String,
    String,
) {
    use std::io::BufRead;
    let mut out = std::io::BufReader::new(a.stdout.take().unwrap());
    let mut head = String::new();
    while !head.contains("ready=1") {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
        head.push_str(&line);
    }
    let hex = head
        .lines()
        .find_map(|l| l.strip_prefix("handle="))
        .unwrap_or_else(|| panic!("no handle:\n{head}"))
        .to_string();
    (out, head, hex)
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn with_vmm_a_process_on_two_cards_moves_both_cards_blocks_and_gets_them_back_intact() {
    // a holds 64 MiB + 1 GiB on card 0 and 64 MiB on card 1, all
    // VMM-backed; b wants card 0. The whole process is suspended: every
    // block of both cards goes by copies (each in its own card's context),
    // and comes back at its address.
    let _serial = serial();
    let node = Node::with_cards(2, "4g", "3g");
    let mut a = node.spawn(
        "a",
        &[
            VMM,
            // (The simulated card keeps contents up to 256 MiB a block.)
            ("CUCLIENT_KEEP_DEVICE1", "67108864"),
            ("LIBCUDA_LOG_LEVEL", "2"),
        ],
        &keeper("67108864"),
    );
    let b = node.crowd_out(&mut a);
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
    // (b may have exited suspended on a loaded host: its copy stays.)
    node.assert_no_copies_but_of(&[&b, &a]);
}

#[test]
fn with_vmm_the_host_arena_is_given_back_once_nobody_asks_for_room() {
    // a's arena (pinned when b wants room on its card, or by the move
    // itself) carries a's blocks out and back, and is unpinned once nobody
    // has asked for room for the keep time (500 ms here, 30 s otherwise)
    // while a lingers.
    let _serial = serial();
    let node = Node::new();
    let mut a = node.spawn(
        "a",
        &[
            VMM,
            ("VGPU_TEST_ARENA_KEEP_MS", "500"),
            ("LIBCUDA_LOG_LEVEL", "2"),
        ],
        &["keep", "67108864", "1073741824", "7", "8", "0", "3"],
    );
    let b = finish(node.crowd_out(&mut a));
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
    node.settle("a");
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

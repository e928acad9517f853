//! VGPU_OVERSUBSCRIBE_VMM stays invisible to the program (issue 27 part 1,
//! step 2): a VMM-backed cuMemAlloc_v2 block answers its asked size to
//! cuMemGetAddressRange and to `cuPointerGetAttribute(s)`'s range and
//! context (the driver says the mapped, rounded size and NULL), and
//! legacy IPC of one works (vgpu shares it by its file descriptor,
//! oversub/shared.rs); where the driver makes no VMM memory exportable,
//! it fails as the driver says, after which the process's blocks are
//! ordinary ones that can be exported.

mod common;

use common::oversub::Node;
use common::*;

#[test]
fn a_vmm_backed_block_answers_its_asked_size_and_is_shared_by_ipc_or_falls_back_to_ordinary_blocks()
{
    let _serial = serial();
    let node = Node::new();
    // 3 MiB + 5 bytes: the mapping is 4 MiB.
    let r = node.run(
        "a",
        &[("VGPU_OVERSUBSCRIBE_VMM", "true")],
        &["vmmhide", "3145733"],
    );
    assert_eq!(r.get("range_rc"), "0", "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.get("range_base_ok"), "1");
    assert_eq!(r.get("range_size"), "3145733", "{}", r.stderr);
    assert_eq!(r.get("attr_rc"), "0", "{}", r.stderr);
    assert_eq!(r.get("attr_start_ok"), "1", "{}", r.stdout);
    assert_eq!(r.get("attr_size"), "3145733", "{}", r.stdout);
    // The plural (cudart's cudaPointerGetAttributes) answers the same
    // (the driver says the mapping's 4 MiB).
    assert_eq!(r.get("attrs_rc"), "0", "{}", r.stderr);
    assert_eq!(r.get("attrs_size"), "3145733", "{}", r.stdout);
    assert_eq!(r.get("attrs_start_ok"), "1", "{}", r.stdout);
    assert_eq!(r.get("attrs_ctx_ok"), "1", "{}", r.stdout);
    assert_eq!(r.get("ctx_rc"), "0", "{}", r.stderr);
    assert_eq!(r.get("ctx_ok"), "1", "{}", r.stdout);
    // Legacy IPC can export it (vgpu's export; the driver says 0), written
    // as the int it is.
    assert_eq!(r.get("capable_rc"), "0", "{}", r.stderr);
    assert_eq!(r.get("capable"), "1", "{}", r.stdout);
    assert_eq!(r.get("capable_next_kept"), "1", "{}", r.stdout);
    assert_eq!(r.get("ipc_rc"), "0", "{}", r.stderr);
    assert_eq!(r.get("ipc_after_rc"), "0", "{}", r.stderr);
    // A driver that makes no VMM memory exportable as a descriptor: the
    // first export fails as the driver's would, with a warning; the next
    // block is an ordinary one, exported at once.
    let r = node.run(
        "c",
        &[
            ("VGPU_OVERSUBSCRIBE_VMM", "true"),
            ("SIM_GPU_NO_FD_HANDLES", "1"),
        ],
        &["vmmhide", "3145733"],
    );
    assert_eq!(r.get("range_size"), "3145733", "{}", r.stderr);
    assert_eq!(r.get("capable"), "0", "{}", r.stdout);
    assert_eq!(r.get("ipc_rc"), "1", "{}", r.stderr);
    assert!(
        r.stderr
            .contains("its memory cannot be exported as a file descriptor"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("VGPU_OVERSUBSCRIBE_VMM=false"),
        "{}",
        r.stderr
    );
    assert_eq!(r.get("ipc_after_rc"), "0", "{}", r.stderr);
    // Off (as the node sets it): ordinary blocks, exported at once.
    let r = node.run("b", &[], &["vmmhide", "3145733"]);
    assert_eq!(r.get("range_size"), "3145733");
    assert_eq!(r.get("attr_size"), "3145733");
    assert_eq!(r.get("attrs_size"), "3145733");
    assert_eq!(r.get("attrs_ctx_ok"), "1");
    assert_eq!(r.get("ctx_ok"), "1");
    assert_eq!(r.get("capable"), "1");
    assert_eq!(r.get("ipc_rc"), "0");
    assert_eq!(r.get("ipc_after_rc"), "0");
    assert!(!r.stderr.contains("VGPU_OVERSUBSCRIBE_VMM"), "{}", r.stderr);
}

/// `VGPU_OVERSUBSCRIBE_VMM=auto`, the default: blocks are VMM-backed
/// where every GPU the process sees supports virtual memory management,
/// one card or two; where one does not, they are ordinary ones. A driver
/// that makes no VMM memory exportable tells them apart: the export of a
/// VMM-backed block fails there, an ordinary one's works.
#[test]
fn on_auto_the_blocks_are_vmm_backed_where_every_card_supports_it() {
    let _serial = serial();
    let auto = [
        ("VGPU_OVERSUBSCRIBE_VMM", "auto"),
        ("SIM_GPU_NO_FD_HANDLES", "1"),
        ("LIBCUDA_LOG_LEVEL", "2"),
    ];
    for cards in [1, 2] {
        let r = Node::with_cards(cards, "4g", "3g").run("a", &auto, &["vmmhide", "3145733"]);
        assert_eq!(r.get("range_size"), "3145733", "{}", r.stderr);
        assert_eq!(r.get("ipc_rc"), "1", "VMM-backed on {cards}: {}", r.stderr);
        assert_eq!(r.get("ipc_after_rc"), "0", "{}", r.stderr);
        let line = format!(
            "{cards} GPU(s), each with virtual memory management: large blocks are VMM-backed"
        );
        assert!(r.stderr.contains(&line), "{}", r.stderr);
    }
    let mut lacking = auto.to_vec();
    lacking.push(("SIM_GPU_NO_VMM", "1"));
    let r = Node::new().run("b", &lacking, &["vmmhide", "3145733"]);
    assert_eq!(r.get("range_size"), "3145733", "{}", r.stderr);
    assert_eq!(r.get("ipc_rc"), "0", "ordinary: {}", r.stderr);
    assert!(
        r.stderr
            .contains("GPU 0 has no virtual memory management: large blocks are ordinary ones"),
        "{}",
        r.stderr
    );
}

/// A VMM-backed block is mapped for every GPU that can reach its own:
/// peer access (`cuCtxEnablePeerAccess`) covers cuMemAlloc's blocks, not
/// VMM memory, so without it a kernel or copy of the other GPU would
/// fault there.
#[test]
fn a_vmm_backed_block_is_reachable_from_every_peer_gpu() {
    let _serial = serial();
    let node = Node::with_cards(2, "4g", "3g");
    let r = node.run(
        "a",
        &[("VGPU_OVERSUBSCRIBE_VMM", "true")],
        &["vmmhide", "3145733"],
    );
    assert_eq!(r.get("range_size"), "3145733", "{}", r.stderr);
    assert_eq!(r.get("access_dev0"), "0/3", "{}", r.stdout);
    assert_eq!(r.get("access_dev1"), "0/3", "{}", r.stdout);
    // A driver that refuses the peers' mapping: the block is mapped for
    // its own GPU alone, as before, with a warning; the allocation stands.
    let r = node.run(
        "b",
        &[
            ("VGPU_OVERSUBSCRIBE_VMM", "true"),
            ("SIM_GPU_ONE_ACCESS", "1"),
        ],
        &["vmmhide", "3145733"],
    );
    assert_eq!(r.get("range_size"), "3145733", "{}", r.stderr);
    assert_eq!(r.get("access_dev0"), "0/3", "{}", r.stdout);
    assert_eq!(r.get("access_dev1"), "0/0", "{}", r.stdout);
    assert!(
        r.stderr.contains("mapped for their own GPU only"),
        "{}",
        r.stderr
    );
}

//! Turns for busy processes whose memory is VMM-backed
//! (`VGPU_OVERSUBSCRIBE_VMM=true`) on the simulated GPU
//! (docs/oversubscription.md, "Turns"): each turn moves the blocks by the
//! process's own copies through its pinned host arena, and the context
//! goes too unless the next holder fits beside it. (Apart from
//! tests/oversub_turns.rs so that the two run in separate lanes.)

mod common;

use common::oversub::Node;
use common::turns::*;
use common::*;

#[test]
fn with_vmm_busy_jobs_take_turns_by_their_own_copies_and_the_context_goes_too() {
    let (a, b) = take_turns(VMM_BURSTS, &[("VGPU_OVERSUBSCRIBE_VMM", "true")]);
    for r in [&a, &b] {
        // Every turn given moved the VMM blocks by copies, and the
        // checkpoint API took the context: the next holder's working set
        // is not known, and a context left behind kept a busy job from
        // its workspace on the H100 (run 98).
        let given = r.stderr.matches("its turn was over").count();
        assert!(given >= 1, "{}", r.stderr);
        assert_eq!(
            r.stderr.matches("of it by VMM copies").count(),
            given,
            "{}",
            r.stderr
        );
        assert!(r.stderr.contains("VMM move back"), "{}", r.stderr);
    }
    // b waited for its first turn: its host arena was pinned then, not
    // during its turn (where it took 0.03-0.08 of its throughput on an
    // H100, runs 104-106).
    assert!(
        b.stderr.contains("while an allocation waits for its turn"),
        "{}",
        b.stderr
    );
}

#[test]
fn with_vmm_a_context_stays_on_the_card_where_the_next_holder_fits_beside_it() {
    // 3.25 GiB jobs on a 6.5 GiB card (256 MiB a context): one at a
    // time, but the waiter's 3.2 GiB, a restore's margin and 2 GiB to
    // spare fit beside a context left behind, so each turn moves the VMM
    // blocks alone and the context's checkpoint (about 3 s of a 4 s
    // switch on an H100, run 102) is skipped.
    // (b may wait 20 s: a's first turn also grows its arena, and each
    // move copies 3.25 GiB of this machine's memory.)
    let (a, b) = take_turns_on(
        Node::with_card("6656m", "4g"),
        13 * GIB / 4,
        VMM_BURSTS,
        &[
            ("VGPU_OVERSUBSCRIBE_VMM", "true"),
            ("VGPU_OVERSUBSCRIBE_WAIT_MS", "20000"),
        ],
    );
    for r in [&a, &b] {
        assert!(r.stderr.contains("its turn was over"), "{}", r.stderr);
        // Its suspensions (a turn given, or, on a loaded machine, one
        // that looked idle) left the context on the card, all but at
        // most one: in one loaded CI run a's first switch, after 8.7 s of
        // pinning its arena past its quantum, took the context too (the
        // room beside it is judged on NVML's free bytes then, against
        // what the waiters ask for with a restore's margin and 2 GiB to
        // spare: close here by design).
        let alone = r.stderr.matches("(VMM copies alone)").count();
        let suspensions = r.stderr.matches("suspended this process").count();
        assert!(
            alone >= 1 && suspensions - alone <= 1,
            "{alone} of {suspensions} left the context\n{}",
            r.stderr
        );
    }
}

#[test]
fn with_vmm_a_turn_ends_once_the_host_arena_is_pinned() {
    // Pinning takes 1 s a GiB here (0.15-0.3 s on an H100), so a's arena
    // for its 2.3 GiB is not ready when its 2 s quantum ends: a keeps the
    // card until it is, and its switch copies through the ready arena
    // instead of pinning with the card idle (run 111: a first 33 GiB
    // suspension took 11.2 s, most of it pinning).
    let (a, _) = take_turns_on(
        Node::new(),
        23 * GIB / 10,
        VMM_BURSTS,
        &[
            ("VGPU_OVERSUBSCRIBE_VMM", "true"),
            ("SIM_GPU_PIN_MS_PER_GIB", "1000"),
            ("VGPU_OVERSUBSCRIBE_WAIT_MS", "30000"),
        ],
    );
    assert!(
        a.stderr.contains("keeps the card until the arena is ready"),
        "{}",
        a.stderr
    );
    // b's want came while a ran: a's arena was pinned ahead, and a's
    // first turn given moved its blocks without pinning any itself.
    let first_out = a
        .stderr
        .lines()
        .find(|l| l.contains("VMM move out"))
        .unwrap_or_else(|| panic!("no move out: {}", a.stderr));
    assert!(!first_out.contains("pinning"), "{first_out}\n{}", a.stderr);
    assert!(a.stderr.contains("ahead of a suspension"), "{}", a.stderr);
}

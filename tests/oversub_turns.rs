//! Turns for busy processes on the simulated GPU (docs/oversubscription.md,
//! "Turns"): two containers, each busy with 2.3 GiB on a 4 GiB card, the
//! second allowed to wait 8 s for memory. Neither is ever idle, so before
//! turns the second's allocation failed ("the card is full (not the
//! quota)"); with a quantum of 2 s they take turns, and both finish with
//! their data checked after every burst of work.

mod common;

use std::process::Child;
use std::time::{Duration, Instant};

use common::oversub::Node;
use common::turns::*;
use common::*;

#[test]
fn two_busy_jobs_the_card_cannot_hold_together_take_turns_and_keep_their_data() {
    let (a, _) = take_turns(BURSTS, &[]);
    assert!(!a.stderr.contains("VMM"), "{}", a.stderr);
}

#[test]
fn an_allocation_the_card_could_never_hold_fails_at_once_saying_so() {
    // Within a 6 GiB quota, 5 GiB on a 4 GiB card: no turn makes room for
    // it, so it does not wait its 20 s.
    let _serial = serial();
    let node = Node::new();
    let t = Instant::now();
    let r = node.run(
        "a",
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "6g"),
            ("VGPU_OVERSUBSCRIBE_WAIT_MS", "20000"),
        ],
        &["hold", &(5 * GIB).to_string(), "0"],
    );
    assert_eq!(r.get("hold_rc"), "2", "{}", r.stderr);
    assert!(
        r.stderr.contains("the card can never hold this"),
        "{}",
        r.stderr
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[test]
fn waiters_that_turns_could_never_make_room_for_fail_at_their_own_bound() {
    // A plain process (no oversubscription: it gives no turns) holds
    // 2.5 GiB of the 4 GiB card; two busy containers then each ask for
    // 1.5 GiB, where about 0.75 GiB is free. Each one's reservation is on
    // the board while it waits, its context all it holds on the card:
    // taken for a holder in turns, it kept the other waiting for turns
    // that could never make the room (an H100, run 120: minutes, not the
    // waits' own bound).
    let _serial = serial();
    let node = Node::new();
    let mut ballast = node.spawn(
        "plain",
        &[("CUDA_OVERSUBSCRIBE", "false")],
        &["hold", &(5 * GIB / 2).to_string(), "60"],
    );
    // (Its output is read while it lives: a closed pipe would kill it at
    // its next line, and free the card.)
    let mut out = std::io::BufReader::new(ballast.stdout.take().expect("piped"));
    let held = {
        use std::io::BufRead;
        (&mut out)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("hold_rc="))
    };
    assert_eq!(held.as_deref(), Some("hold_rc=0"));
    let t = Instant::now();
    let waiters: Vec<Child> = ["a", "b"]
        .map(|name| {
            node.spawn(
                name,
                &[("VGPU_OVERSUBSCRIBE_WAIT_MS", "3000")],
                &["hold", &(3 * GIB / 2).to_string(), "0"],
            )
        })
        .into_iter()
        .collect();
    let runs: Vec<Run> = waiters.into_iter().map(finish).collect();
    let elapsed = t.elapsed();
    let still_held = matches!(ballast.try_wait(), Ok(None));
    let _ = ballast.kill();
    let _ = ballast.wait();
    drop(out);
    for r in &runs {
        assert_eq!(r.get("hold_rc"), "2", "{}", r.stderr);
        assert!(
            r.stderr.contains("the card is full (not the quota)")
                && !r.stderr.contains("and for its turn"),
            "{}",
            r.stderr
        );
    }
    // Each waited its own 3 s; a turn of the other's would add minutes.
    assert!(
        elapsed < Duration::from_secs(30),
        "{elapsed:?}: {}\n{}",
        runs[0].stderr,
        runs[1].stderr
    );
    assert!(still_held, "the plain holder ended early");
}

//! `fork`: the child inherits our memory but not our threads. Every lock of
//! ours is listed here, outermost first ([`each_lock`], from each module's
//! own list, `locks()`): the `prepare`
//! handler takes them all in that order, so no lock is held by another
//! thread at the fork (the one order keeps that free of deadlock: a thread
//! holding one of them waits only for those listed after it). The parent
//! gives them back; the child replaces each with a fresh lock holding what
//! it should see (`lock.rs`), and [`process::reset_in_child`] and the
//! attachment reset the rest: the child claims its own slot, its tables
//! start empty, and the watcher restarts on first use.
//!
//! `VGPU_TEST_HOLD_LOCK=<name>` (tests only, ignored in secure execution)
//! has a thread hold one lock from `cuInit` until a fork is under way, so
//! that a test can fork while each lock is held
//! (`tests/fork.rs`).

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

use crate::attach::Attach;
use crate::limiter::{events, probes};
use crate::lock::{ForkLock, Held, Name};
use crate::nvml::{client, fresh};
use crate::quota::tracker;
use crate::{hostpid, oversub, process, watcher};

/// The attachment, if the runtime has one (a function `init.rs` gives, so
/// that this file need not start the runtime).
static ATTACH: OnceLock<fn() -> Option<&'static Attach>> = OnceLock::new();

/// Installs the handlers, once; `attach` finds the attachment.
pub fn install(attach: fn() -> Option<&'static Attach>) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = ATTACH.set(attach);
        // SAFETY: the three handlers are extern "C" fns with no arguments
        // that never unwind (each body is wrapped in catch_unwind).
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if rc != 0 {
            log::warn!("pthread_atfork failed ({rc}): forked children may not be counted");
        }
    });
}

fn attach() -> Option<&'static Attach> {
    ATTACH.get().and_then(|f| f())
}

/// Every lock of ours, outermost first, as each module lists its own:
/// the attachment's (a claim takes the region's lock and starts the
/// watcher), then those no code holds while it takes another, but for
/// `oversub.restore_done`, held while the watcher is kicked, so the
/// watcher's lock comes last.
fn each_lock(mut f: impl FnMut(Name, &'static dyn ForkLock)) {
    let all = attach()
        .map(Attach::locks)
        .into_iter()
        .flatten()
        .chain(process::locks())
        .chain(tracker::locks())
        .chain(events::locks())
        .chain(probes::locks())
        .chain(client::locks())
        .chain(hostpid::locks())
        .chain(oversub::locks())
        .chain(fresh::locks())
        .chain(watcher::locks());
    for (name, lock) in all {
        f(name, lock);
    }
}

/// Forks under way in this process (the test hook waits for one).
static FORKING: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// The locks `prepare` took, on the thread that forks.
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
}

extern "C" fn prepare() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        FORKING.fetch_add(1, Ordering::AcqRel);
        let _ = HELD.try_with(|held| {
            let mut held = held.borrow_mut();
            each_lock(|_, lock| held.push(lock.hold()));
        });
    }));
}

extern "C" fn parent() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let _ = HELD.try_with(|held| held.borrow_mut().clear());
        FORKING.fetch_sub(1, Ordering::AcqRel);
    }));
}

extern "C" fn child() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // The guards belong to the locks being replaced: never dropped.
        let _ = HELD.try_with(|held| std::mem::forget(held.take()));
        // SAFETY: this is the forked child's handler, on its only thread,
        // before anything else runs; every guard was just forgotten.
        each_lock(|_, lock| unsafe { lock.reset_in_child() });
        process::reset_in_child();
        crate::hami::reset_in_child();
        if let Some(a) = attach() {
            a.reset_in_child();
        }
        FORKING.store(0, Ordering::Release);
        if let Some(&name) = HELD_FOR_TEST.get() {
            check_free_in_child(name);
        }
    }));
}

/// The lock a test holds (`VGPU_TEST_HOLD_LOCK`).
static HELD_FOR_TEST: OnceLock<Name> = OnceLock::new();

/// Has a thread hold lock `name` from now until a fork has waited for it
/// (or 10 s), so that a test forks while it is held. An unknown name is
/// reported with the list of names.
pub fn hold_for_test(name: &str) {
    let mut found = None;
    let mut names = Vec::new();
    each_lock(|n, lock| {
        let text = n.to_string();
        if text == name {
            found = Some((n, lock));
        }
        names.push(text);
    });
    let Some((n, lock)) = found else {
        log::error!(
            "VGPU_TEST_HOLD_LOCK={name}: no such lock; locks: {}",
            names.join(" ")
        );
        return;
    };
    if HELD_FOR_TEST.set(n).is_err() {
        return;
    }
    let (held, is_held) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("vgpu-test-hold".into())
        .spawn(move || {
            let holding = lock.hold();
            let _ = held.send(());
            let until = Instant::now() + Duration::from_secs(10);
            while FORKING.load(Ordering::Acquire) == 0 && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            // The fork is under way: its prepare handler waits for this lock.
            std::thread::sleep(Duration::from_millis(50));
            drop(holding);
        });
    if spawned.is_ok() && is_held.recv_timeout(Duration::from_secs(5)).is_ok() {
        log::warn!("VGPU_TEST_HOLD_LOCK: a thread holds {name} until a fork");
    }
}

/// In a forked child: the lock a test held at the fork must be free.
fn check_free_in_child(name: Name) {
    each_lock(|n, lock| {
        if n == name && lock.try_hold().is_none() {
            log::error!("VGPU_TEST_HOLD_LOCK: {name} is still held in the forked child");
        }
    });
}

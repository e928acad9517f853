//! `fork`: the child inherits our memory but not our threads. Every lock of
//! ours is held across the fork (so none is inherited mid-update); the
//! child then gets its own slot, an empty allocation table, and restarts
//! the watcher on first use.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

use crate::cuda::{context, events};
use crate::nvml::client;
use crate::quota::tracker;
use crate::{hostpid, init, process, watcher};

pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: the three handlers are extern "C" fns with no arguments
        // that never unwind (each body is wrapped in catch_unwind).
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if rc != 0 {
            log::warn!("pthread_atfork failed ({rc}): forked children may not be counted");
        }
    });
}

fn region_mutex() -> Option<&'static parking_lot::Mutex<()>> {
    init::started()?
        .attach
        .as_ref()
        .map(|a| a.region.fork_mutex())
}

extern "C" fn prepare() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Some(m) = region_mutex() {
            std::mem::forget(m.lock());
        }
        tracker::lock_all();
        context::fork_prepare();
        events::fork_prepare();
    }));
}

fn unlock_region() {
    if let Some(m) = region_mutex() {
        // SAFETY: prepare() locked it on the forking thread and forgot the
        // guard; in the child that thread is the only one.
        unsafe { m.force_unlock() };
    }
}

extern "C" fn parent() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        events::fork_parent();
        context::fork_parent();
        tracker::unlock_all();
        unlock_region();
    }));
}

extern "C" fn child() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        events::fork_child();
        context::fork_child();
        tracker::reset_in_child();
        unlock_region();
        process::reset_in_child();
        hostpid::after_fork_child();
        client::after_fork_child();
        watcher::after_fork_child();
        if let Some(a) = init::attach() {
            a.after_fork_child();
        }
    }));
}

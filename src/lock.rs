//! Our mutexes, made safe across `fork`. A forked child has one thread: a
//! lock another thread held at the fork would stay held there forever. So
//! the `pthread_atfork` handlers (`fork.rs`) take every lock of ours
//! before the fork, in one order, and give each back after it; in the
//! child each [`Lock`] is replaced by a fresh one, holding its value as
//! the child should see it (the parent's contexts, allocations and events
//! are not the child's). None is ever held across a call into the driver
//! or NVML. Each module that owns locks lists them (its `locks()`), and
//! `fork.rs` joins the lists; no mutex, condition variable or rwlock lives
//! anywhere else (`tests/layers.rs` checks).
//!
//! They are std's mutexes, whose waiters the kernel queues (a futex), not
//! parking_lot's: parking_lot queues waiters in the process's own memory,
//! so a child would inherit the parent's waiting threads and could hand
//! the lock to one of those ghosts when it gives it back (a child stuck
//! that way was seen under a fork storm).

use std::any::Any;
use std::cell::UnsafeCell;
use std::fmt;
use std::hash::{BuildHasherDefault, DefaultHasher};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::Duration;

/// The hasher of our tables: fixed keys (their keys are the driver's
/// handles, not an attacker's strings), so a table can be a `static`.
pub type Hasher = BuildHasherDefault<DefaultHasher>;

/// A map of ours, constant-initialised.
pub type Map<K, V> = std::collections::HashMap<K, V, Hasher>;

/// An empty [`Map`], in a `const` context.
pub const fn map<K, V>() -> Map<K, V> {
    Map::with_hasher(BuildHasherDefault::new())
}

/// A mutex, and what a forked child makes of the value it guards.
pub struct Lock<T> {
    /// Written only by [`ForkLock::reset_in_child`].
    cell: UnsafeCell<Mutex<T>>,
    in_child: fn(&mut T),
}

// SAFETY: as `Mutex<T>`, which is Sync for T: Send. The cell is written
// only in a forked child before anything else runs there (one thread, no
// guard alive: see `reset_in_child`); otherwise it is only read.
unsafe impl<T: Send> Sync for Lock<T> {}

impl<T> Lock<T> {
    /// A lock of `value`; `in_child` adjusts the value in a forked child
    /// (use [`keep`] to leave it as it was).
    pub const fn new(value: T, in_child: fn(&mut T)) -> Lock<T> {
        Lock {
            cell: UnsafeCell::new(Mutex::new(value)),
            in_child,
        }
    }

    fn mutex(&self) -> &Mutex<T> {
        // SAFETY: only `reset_in_child` writes the cell, when no reference
        // to the mutex is alive (see there).
        unsafe { &*self.cell.get() }
    }

    /// Waits for the lock. (A panic while it was held leaves the value as
    /// it was: vgpu never leaves a value half-changed across a panic.)
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.mutex().lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock if no one holds it now.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.mutex().try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// What a forked child makes of a value that stays valid there.
pub fn keep<T>(_: &mut T) {}

/// A [`Lock`] with a condition variable, for threads that wait for its
/// value to change. A forked child gets both fresh.
pub struct CondLock<T> {
    lock: Lock<T>,
    /// Written only by [`ForkLock::reset_in_child`].
    cv: UnsafeCell<Condvar>,
}

// SAFETY: as `Lock<T>` and `Condvar` (Sync); the cell is written only in
// a forked child before anything else runs there, as `Lock`'s is.
unsafe impl<T: Send> Sync for CondLock<T> {}

impl<T> CondLock<T> {
    /// As [`Lock::new`].
    pub const fn new(value: T, in_child: fn(&mut T)) -> CondLock<T> {
        CondLock {
            lock: Lock::new(value, in_child),
            cv: UnsafeCell::new(Condvar::new()),
        }
    }

    fn cv(&self) -> &Condvar {
        // SAFETY: only `reset_in_child` writes the cell, when no reference
        // to it is alive (see there).
        unsafe { &*self.cv.get() }
    }

    /// Waits for the lock.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.lock.lock()
    }

    /// Gives the lock back until notified or `timeout` passed, then waits
    /// for it again.
    pub fn wait_timeout<'a>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> MutexGuard<'a, T> {
        match self.cv().wait_timeout(guard, timeout) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        }
    }

    /// Wakes every thread waiting.
    pub fn notify_all(&self) {
        self.cv().notify_all();
    }
}

/// A lock's name, as the fork list and `VGPU_TEST_HOLD_LOCK` know it:
/// `contexts`, or `tracker.3` for one of an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Name {
    base: &'static str,
    index: Option<usize>,
}

impl Name {
    /// The lock called `base`.
    pub const fn of(base: &'static str) -> Name {
        Name { base, index: None }
    }

    /// Lock `index` of the array called `base`.
    pub const fn at(base: &'static str, index: usize) -> Name {
        Name {
            base,
            index: Some(index),
        }
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "{}.{i}", self.base),
            None => f.write_str(self.base),
        }
    }
}

/// A lock as a module lists it for the fork handlers (`fork.rs`).
pub type Listed = (Name, &'static dyn ForkLock);

/// A lock taken for a fork: given back when dropped (the parent), or
/// forgotten (the child, which replaces the lock).
pub struct Held {
    _guard: Box<dyn Any>,
}

impl Held {
    fn new(guard: impl Any) -> Held {
        Held {
            _guard: Box::new(guard),
        }
    }
}

/// A lock as the fork handlers see it.
pub trait ForkLock: Sync {
    /// Waits for the lock and holds it until the result is dropped.
    fn hold(&'static self) -> Held;

    /// Holds the lock, if it is free now.
    fn try_hold(&'static self) -> Option<Held>;

    /// In a forked child: a fresh, unlocked lock replaces this one, with
    /// the value the child should see.
    ///
    /// # Safety
    /// Only in a forked child's `pthread_atfork` handler, before anything
    /// else runs there, with every guard of this lock forgotten, never
    /// dropped afterwards.
    unsafe fn reset_in_child(&self);
}

impl<T: Send + 'static> ForkLock for Lock<T> {
    fn hold(&'static self) -> Held {
        Held::new(self.lock())
    }

    fn try_hold(&'static self) -> Option<Held> {
        match self.mutex().try_lock() {
            Ok(g) => Some(Held::new(g)),
            Err(TryLockError::Poisoned(p)) => Some(Held::new(p.into_inner())),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    unsafe fn reset_in_child(&self) {
        // SAFETY: the caller guarantees one thread and no live guard, so
        // the mutex is this thread's alone. The value is adjusted in place,
        // then moved bitwise into a fresh mutex written over the old one,
        // which is never dropped (std's mutex is a futex word: nothing to
        // release).
        unsafe {
            let mutex = &mut *self.cell.get();
            let data: *mut T = mutex.get_mut().unwrap_or_else(PoisonError::into_inner);
            (self.in_child)(&mut *data);
            let value = data.read();
            self.cell.get().write(Mutex::new(value));
        }
    }
}

impl<T: Send + 'static> ForkLock for CondLock<T> {
    fn hold(&'static self) -> Held {
        self.lock.hold()
    }

    fn try_hold(&'static self) -> Option<Held> {
        self.lock.try_hold()
    }

    unsafe fn reset_in_child(&self) {
        // SAFETY: the caller's guarantees: one thread, no guard alive, so
        // no thread waits on the condition variable either. The old one is
        // never dropped (a futex word: nothing to release).
        unsafe {
            self.lock.reset_in_child();
            self.cv.get().write(Condvar::new());
        }
    }
}

/// The in-process half of a region's lock (`vgpu_shm::Region::fork_lock`).
impl ForkLock for vgpu_shm::LocalLock {
    fn hold(&'static self) -> Held {
        Held::new(self.lock())
    }

    fn try_hold(&'static self) -> Option<Held> {
        self.try_lock().map(Held::new)
    }

    unsafe fn reset_in_child(&self) {
        // SAFETY: the caller's guarantees are `LocalLock::reset_in_child`'s.
        unsafe { vgpu_shm::LocalLock::reset_in_child(self) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TABLE: Lock<Map<u32, u32>> = Lock::new(map(), |m| m.clear());

    #[test]
    fn a_held_lock_comes_back_and_a_child_gets_a_fresh_one() {
        TABLE.lock().insert(1, 2);
        let held = TABLE.hold();
        assert!(TABLE.try_hold().is_none());
        drop(held);
        assert!(TABLE.try_hold().is_some());
        // As in a child: held, forgotten, replaced.
        std::mem::forget(TABLE.hold());
        // SAFETY: no guard is alive (forgotten above) and the test's other
        // threads do not use TABLE.
        unsafe { TABLE.reset_in_child() };
        assert!(TABLE.lock().is_empty());
        assert!(TABLE.try_hold().is_some());
    }

    static WAITED: CondLock<u32> = CondLock::new(0, |n| *n = 7);

    #[test]
    fn a_cond_lock_wakes_its_waiter_and_a_child_gets_a_fresh_one() {
        let waiter = std::thread::spawn(|| {
            let mut g = WAITED.lock();
            while *g == 0 {
                g = WAITED.wait_timeout(g, Duration::from_secs(10));
            }
            *g
        });
        std::thread::sleep(Duration::from_millis(20));
        *WAITED.lock() = 1;
        WAITED.notify_all();
        assert_eq!(waiter.join().unwrap(), 1);
        std::mem::forget(WAITED.hold());
        assert!(WAITED.try_hold().is_none());
        // SAFETY: no guard is alive (forgotten above), no thread waits.
        unsafe { WAITED.reset_in_child() };
        assert_eq!(*WAITED.lock(), 7);
        assert!(WAITED.try_hold().is_some());
    }

    #[test]
    fn names_read_as_the_test_hook_writes_them() {
        assert_eq!(Name::of("contexts").to_string(), "contexts");
        assert_eq!(Name::at("tracker", 3).to_string(), "tracker.3");
        assert_ne!(Name::at("tracker", 3), Name::at("tracker", 4));
    }
}

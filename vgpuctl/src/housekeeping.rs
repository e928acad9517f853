//! Removing the region directories of pods that are gone (`vgpuctl serve`,
//! unless `--no-housekeeping`). Every container leaves
//! `{root}/containers/{podUID}_{container}/` (about 3 MB) behind; HAMi 2.10's
//! monitor removes a directory whose pod UID its node's pod list no longer
//! holds once the directory is older than its resync period (5 min).
//!
//! Here a directory is removed only when all of these hold:
//! - no process on the node maps a file in it (`/proc/*/maps`, by device
//!   and inode: the exporter runs in the host's pid namespace);
//! - no slot of its region belongs to a process known to live;
//! - the API server's pod list is current and its pod is not listed, and
//!   nothing in it changed for `grace` (5 min).
//!
//! Without a current pod list nothing is removed: a pod whose processes
//! are idle looks the same as a gone one from here, and removing a live
//! pod's directory loses its region's limits.
//! A process whose `/proc/PID/maps` the exporter may not read is said
//! once and skipped.
//!
//! The decision is [`decide`], a pure function; the rest gathers its inputs
//! and removes the directory.
#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::serve::pods::PodNames;
use crate::snapshot::Alive;

/// When the pod list counts as current: it was complete this recently.
const FRESH: Duration = Duration::from_secs(15 * 60);

/// The grace periods.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Untouched this long, a directory of a pod the list lacks goes.
    pub grace: Duration,
}

/// What is known of one container directory.
#[derive(Clone, Copy, Debug, Default)]
pub struct Facts {
    /// Its pod is listed (Some(true)), not listed (Some(false)), or there
    /// is no current pod list (None).
    pub pod_listed: Option<bool>,
    /// A process maps a file in it.
    pub mapped: bool,
    /// A slot's owner lives, as far as this machine can tell.
    pub alive_slot: bool,
    /// A slot's owner may live (alive or unknown).
    pub maybe_alive_slot: bool,
    /// Since its newest change (the directory's and its files' mtimes).
    pub untouched_for: Duration,
}

/// Whether to remove a directory, and why not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Remove,
    Keep(&'static str),
}

/// The rule of the module docs.
pub fn decide(f: &Facts, p: &Policy) -> Verdict {
    if f.mapped {
        return Verdict::Keep("a process maps it");
    }
    if f.alive_slot {
        return Verdict::Keep("a process of its region lives");
    }
    match f.pod_listed {
        Some(true) => Verdict::Keep("its pod is listed"),
        Some(false) if f.untouched_for >= p.grace => Verdict::Remove,
        Some(false) => Verdict::Keep("changed within the grace period"),
        None => Verdict::Keep("no current pod list"),
    }
}

/// Starts a thread that goes over `dirs` (containers directories) every
/// `period`.
pub fn start(dirs: Vec<PathBuf>, names: Option<PodNames>, policy: Policy, period: Duration) {
    std::thread::spawn(move || {
        loop {
            for (dir, why) in pass(&dirs, names.as_ref(), &policy) {
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => eprintln!("vgpuctl serve: removed {} ({why})", dir.display()),
                    Err(e) => eprintln!("vgpuctl serve: cannot remove {}: {e}", dir.display()),
                }
            }
            std::thread::sleep(period);
        }
    });
}

/// The directories to remove now, with why.
pub fn pass(
    dirs: &[PathBuf],
    names: Option<&PodNames>,
    policy: &Policy,
) -> Vec<(PathBuf, &'static str)> {
    let mapped = mapped_files();
    let mut out = Vec::new();
    for root in dirs {
        let Ok(entries) = std::fs::read_dir(root) else {
            continue;
        };
        for e in entries.flatten() {
            let Some(owner) = e.file_name().to_str().and_then(crate::scan::owner_of) else {
                continue;
            };
            // A link planted as a container directory is never followed.
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let Some(mut f) = facts(&e.path(), &mapped) else {
                continue;
            };
            f.pod_listed = names.and_then(|n| n.listed(&owner.pod_uid, FRESH));
            if decide(&f, policy) == Verdict::Remove {
                out.push((e.path(), "its pod is gone"));
            }
        }
    }
    out
}

/// What a directory shows (None: it could not be read, leave it).
fn facts(dir: &Path, mapped: &HashSet<(u64, u64)>) -> Option<Facts> {
    let now = SystemTime::now();
    let age = |m: &std::fs::Metadata| {
        m.modified()
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .unwrap_or_default()
    };
    let meta = std::fs::symlink_metadata(dir).ok()?;
    let mut f = Facts {
        untouched_for: age(&meta),
        ..Facts::default()
    };
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let m = e.metadata().ok()?;
        f.untouched_for = f.untouched_for.min(age(&m));
        if !m.is_file() {
            continue;
        }
        f.mapped |= mapped.contains(&(m.dev(), m.ino()));
        if let Ok(s) = crate::read::read(&e.path()) {
            for p in &s.processes {
                f.alive_slot |= p.alive == Alive::Yes;
                f.maybe_alive_slot |= p.alive != Alive::No;
            }
        }
    }
    Some(f)
}

/// (device, inode) of every file some process maps, from `/proc/*/maps`.
/// A process whose maps this exporter may not read is said once and
/// skipped: the pod list (a gone pod) and the region's slots still guard
/// its directory.
fn mapped_files() -> HashSet<(u64, u64)> {
    static SAID: std::sync::Once = std::sync::Once::new();
    let mut out = HashSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let name = p.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        match std::fs::read_to_string(p.path().join("maps")) {
            Ok(maps) => out.extend(maps.lines().filter_map(parse_maps_line)),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => SAID.call_once(|| {
                eprintln!(
                    "vgpuctl serve: housekeeping cannot read {}: {e}; such processes' mappings are not seen (give the exporter CAP_SYS_PTRACE)",
                    p.path().join("maps").display()
                );
            }),
            Err(_) => {}
        }
    }
    out
}

/// (device, inode) of one `/proc/PID/maps` line that maps a file.
fn parse_maps_line(line: &str) -> Option<(u64, u64)> {
    let mut f = line.split_ascii_whitespace();
    let dev = f.nth(3)?;
    let inode: u64 = f.next()?.parse().ok()?;
    if inode == 0 {
        return None;
    }
    let (major, minor) = dev.split_once(':')?;
    let (major, minor) = (
        u64::from_str_radix(major, 16).ok()?,
        u64::from_str_radix(minor, 16).ok()?,
    );
    // glibc's makedev: what stat's st_dev holds.
    let dev = ((major & 0xfff) << 8)
        | ((major & !0xfff) << 32)
        | (minor & 0xff)
        | ((minor & !0xff) << 12);
    Some((dev, inode))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Policy = Policy {
        grace: Duration::from_secs(300),
    };

    fn f(listed: Option<bool>, mapped: bool, alive: bool, maybe: bool, age: u64) -> Facts {
        Facts {
            pod_listed: listed,
            mapped,
            alive_slot: alive,
            maybe_alive_slot: maybe,
            untouched_for: Duration::from_secs(age),
        }
    }

    #[test]
    fn only_gone_unmapped_and_quiet_directories_go() {
        let old = 100_000;
        assert_eq!(
            decide(&f(Some(false), false, false, true, 301), &P),
            Verdict::Remove
        );
        assert_ne!(
            decide(&f(Some(false), false, false, false, 299), &P),
            Verdict::Remove
        );
        assert_ne!(
            decide(&f(Some(true), false, false, false, old), &P),
            Verdict::Remove
        );
        assert_ne!(
            decide(&f(Some(false), true, false, false, old), &P),
            Verdict::Remove
        );
        assert_ne!(
            decide(&f(Some(false), false, true, true, old), &P),
            Verdict::Remove
        );
        // No current pod list: nothing goes, however old and quiet.
        assert_ne!(
            decide(&f(None, false, false, false, old), &P),
            Verdict::Remove
        );
        assert_ne!(
            decide(&f(None, false, false, true, old), &P),
            Verdict::Remove
        );
        assert_ne!(
            decide(&f(None, false, false, false, 3600), &P),
            Verdict::Remove
        );
        assert_ne!(
            decide(&f(None, true, false, false, old), &P),
            Verdict::Remove
        );
    }

    #[test]
    fn a_mapped_file_is_seen_by_device_and_inode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.cache");
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let m = file.metadata().unwrap();
        assert!(!mapped_files().contains(&(m.dev(), m.ino())));
        // Mapping it through a program: std has no mmap; `tail -f` does not
        // map. Read this process's own maps line format instead.
        let line = format!(
            "7f00-7f01 rw-s 00000000 {:02x}:{:02x} {} {}",
            (m.dev() >> 8) & 0xfff,
            m.dev() & 0xff,
            m.ino(),
            path.display()
        );
        assert_eq!(parse_maps_line(&line), Some((m.dev(), m.ino())));
        assert_eq!(parse_maps_line("7f00-7f01 rw-p 00000000 00:00 0"), None);
    }
}

//! Who a process is, and whether it is still alive, across pid namespaces.
//!
//! A slot records the owner's pid *in its own namespace*, its start time,
//! the inode of that namespace, and (when known) its host pid. The rules,
//! for a reclaimer that reads the `/proc` mounted where it runs:
//!
//! 1. A pid is looked up only in a `/proc` of its own namespace: the slot's
//!    pid when the slot's namespace is the one `/proc` shows, the host pid
//!    when `/proc` shows the initial namespace and the host pid came from
//!    the kernel (not inferred from NVML). Then pid + start time decide.
//! 2. A slot of our own namespace whose pid does not exist there (`kill`
//!    works in our namespace whatever `/proc` shows) is dead.
//! 3. Anything else is [`Liveness::Unknown`]: the caller decides by the
//!    owner's heartbeat and the driver (see `slots.rs`).
//!
//! Which namespace `/proc` shows: `NSpid` in `/proc/self/status` lists our
//! pid from the namespace of that `/proc` down to ours, so one entry means
//! it is ours. With more (`unshare -pf` without `--mount-proc`), an
//! ancestor listed with one entry lives in the namespace `/proc` shows.
//!
//! A reused pid has another start time; a zombie holds no GPU memory (the
//! driver freed it when its files closed).

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Identifies one process for its whole life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcId {
    /// The pid in its own namespace.
    pub pid: i32,
    /// Field 22 of `/proc/<pid>/stat`, in clock ticks since boot.
    pub start_time: u64,
    /// Inode of `/proc/<pid>/ns/pid`; 0 when unreadable.
    pub pidns: u64,
}

/// The inode of the initial pid namespace (`PROC_PID_INIT_INO`).
pub const INIT_PIDNS: u64 = 0xEFFF_FFFC;

impl ProcId {
    /// This process.
    pub fn current() -> ProcId {
        ProcId {
            pid: std::process::id() as i32,
            start_time: stat_of("self").map_or(0, |s| s.start_time),
            pidns: my_pidns(),
        }
    }
}

/// The inode of our pid namespace, cached per pid (a forked child of a
/// process that called `unshare(CLONE_NEWPID)` lives in another one).
pub fn my_pidns() -> u64 {
    static CACHE: AtomicU64 = AtomicU64::new(0);
    let pid = u64::from(std::process::id());
    let cached = CACHE.load(Ordering::Acquire);
    if cached != 0 && cached >> 32 == pid {
        return cached & 0xffff_ffff;
    }
    let ns = fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino());
    // Namespace inodes are 32-bit (proc_inum); keep the pid beside it.
    if ns >> 32 == 0 {
        CACHE.store(pid << 32 | ns, Ordering::Release);
    }
    ns
}

/// What this process's `/proc` can tell about pids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcView {
    /// Our pid namespace.
    pub my_ns: u64,
    /// The pid namespace whose pids `/proc` shows; 0 when unknown.
    pub procfs_ns: u64,
    /// Our pid in the initial namespace, when the kernel said so.
    pub host_pid: Option<i32>,
}

impl ProcView {
    /// What this process's `/proc` shows.
    pub fn current() -> ProcView {
        let my_ns = my_pidns();
        let Some(status) = fs::read_to_string("/proc/self/status").ok() else {
            return ProcView {
                my_ns,
                procfs_ns: 0,
                host_pid: None,
            };
        };
        let nspid = status_field(&status, "NSpid:").unwrap_or_default();
        let procfs_ns = match nspid.len() {
            1 => my_ns,
            0 => 0,
            _ => status_field(&status, "PPid:")
                .and_then(|p| p.first().copied())
                .map_or(0, procfs_ns_from_ancestors),
        };
        let host_pid = (procfs_ns == INIT_PIDNS).then(|| nspid[0]);
        ProcView {
            my_ns,
            procfs_ns,
            host_pid,
        }
    }
}

/// The namespace `/proc` shows: that of the nearest ancestor (pids as
/// `/proc` shows them) that lives in it, i.e. has a one-entry `NSpid`.
fn procfs_ns_from_ancestors(mut pid: i32) -> u64 {
    for _ in 0..64 {
        if pid <= 0 {
            return 0;
        }
        let Some(status) = fs::read_to_string(format!("/proc/{pid}/status")).ok() else {
            return 0;
        };
        if status_field(&status, "NSpid:").is_some_and(|n| n.len() == 1) {
            return fs::metadata(format!("/proc/{pid}/ns/pid")).map_or(0, |m| m.ino());
        }
        pid = status_field(&status, "PPid:")
            .and_then(|p| p.first().copied())
            .unwrap_or(0);
    }
    0
}

/// The numbers of a `/proc/<pid>/status` line such as `NSpid:\t835\t2`.
pub fn status_field(status: &str, key: &str) -> Option<Vec<i32>> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..]
        .split_ascii_whitespace()
        .map(|t| t.parse().ok())
        .collect()
}

/// What vgpu reads from `/proc/<pid>/stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Field 3: `R`, `S`, `Z` (zombie), `X` (dead), ...
    pub state: char,
    /// Field 22, in clock ticks since boot.
    pub start_time: u64,
}

/// Parses the state and start time out of a `/proc/<pid>/stat` line. The
/// command name may hold spaces and parentheses, so fields are counted from
/// the last `)`.
pub fn parse_stat(line: &str) -> Option<Stat> {
    let rest = &line[line.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // After the state (field 3), start time is field 22: 18 more to skip.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(Stat { state, start_time })
}

fn stat_of(pid: &str) -> Option<Stat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// What a slot's owner is now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Running, as `/proc` shows it.
    Alive,
    /// Gone, a zombie, or its pid now belongs to another process.
    Dead,
    /// Not visible from here: heartbeat and driver decide.
    Unknown,
}

/// A slot's owner as the slot records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// [`ProcId::pid`].
    pub pid: i32,
    /// [`ProcId::start_time`].
    pub start_time: u64,
    /// [`ProcId::pidns`].
    pub pidns: u64,
    /// 0 while unknown.
    pub host_pid: i32,
    /// The host pid came from the kernel, not from NVML.
    pub host_pid_verified: bool,
}

impl Owner {
    /// NVML gave the owner its pid in its own namespace (driver 580 shows
    /// a caller in a pid namespace its own processes by their pids there),
    /// so only NVML asked from that namespace could list it.
    pub fn nvml_pid_is_local(&self) -> bool {
        !self.host_pid_verified && self.host_pid > 0 && self.host_pid == self.pid
    }

    /// Whether NVML asked from here would list this owner by `host_pid`:
    /// a host pid, yes; a pid in the owner's own namespace only when that
    /// namespace is ours and the pid is nobody's now. A restarted
    /// container's namespace may get its dead predecessor's inode (the
    /// kernel reuses them), and its new pid 1 is then listed by the pid
    /// the dead one had: that listing says nothing about the dead one.
    pub fn nvml_lists_here(&self, view: &ProcView) -> bool {
        !self.nvml_pid_is_local()
            || (self.pidns != 0 && self.pidns == view.my_ns && !pid_exists(self.pid))
    }
}

/// Judges `owner` by the rules in the module docs.
pub fn liveness(owner: &Owner, view: &ProcView) -> Liveness {
    if owner.pid <= 0 {
        return Liveness::Dead;
    }
    let ours = owner.pidns != 0 && owner.pidns == view.my_ns;
    if view.procfs_ns != 0 && owner.pidns == view.procfs_ns {
        return by_proc(owner.pid, owner.start_time, ours);
    }
    if view.procfs_ns == INIT_PIDNS && owner.host_pid_verified && owner.host_pid > 0 {
        return by_proc(owner.host_pid, owner.start_time, false);
    }
    if ours && !pid_exists(owner.pid) {
        return Liveness::Dead;
    }
    Liveness::Unknown
}

/// Pid + start time in the `/proc` we read. `in_our_ns`: the pid is also
/// valid for `kill`, which tells a hidden process (`hidepid`) from a gone one.
fn by_proc(pid: i32, start_time: u64, in_our_ns: bool) -> Liveness {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(line) => match parse_stat(&line) {
            Some(s) if s.state == 'Z' || s.state == 'X' => Liveness::Dead,
            Some(s) if start_time != 0 && s.start_time != start_time => Liveness::Dead,
            Some(_) => Liveness::Alive,
            None => Liveness::Unknown,
        },
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if in_our_ns && pid_exists(pid) {
                Liveness::Unknown
            } else {
                Liveness::Dead
            }
        }
        Err(_) => Liveness::Unknown,
    }
}

/// Does `pid` exist in our pid namespace?
pub fn pid_exists(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 performs only the existence and permission
    // checks; it sends nothing.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// `CLOCK_MONOTONIC` in milliseconds.
pub fn monotonic_ms() -> u64 {
    monotonic_ns() / 1_000_000
}

/// `CLOCK_MONOTONIC` in nanoseconds: the board's clock, one for the node.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `/proc/sys/kernel/random/boot_id` as two words; None when unreadable.
pub fn boot_id() -> Option<[u64; 2]> {
    parse_boot_id(&std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?)
}

/// Parses a boot id (`364d7662-5658-4ea3-994f-679d53d3f26c`).
pub fn parse_boot_id(text: &str) -> Option<[u64; 2]> {
    let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let hi = u64::from_str_radix(hex.get(..16)?, 16).ok()?;
    let lo = u64::from_str_radix(hex.get(16..)?, 16).ok()?;
    Some([hi, lo])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernel_boot_id() {
        assert_eq!(
            parse_boot_id("364d7662-5658-4ea3-994f-679d53d3f26c\n"),
            Some([0x364d_7662_5658_4ea3, 0x994f_679d_53d3_f26c])
        );
        assert_eq!(parse_boot_id("nonsense"), None);
        assert!(boot_id().is_some());
    }

    #[test]
    fn parses_stat_with_hostile_comm() {
        let line =
            "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 50";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.state, 'S');
        assert_eq!(s.start_time, 987654);
    }

    #[test]
    fn parses_nspid() {
        let status = "Name:\tx\nPPid:\t7\nNSpid:\t835\t2\n";
        assert_eq!(status_field(status, "NSpid:"), Some(vec![835, 2]));
        assert_eq!(status_field(status, "PPid:"), Some(vec![7]));
        assert_eq!(status_field(status, "Tgid:"), None);
    }

    fn owner(me: &ProcId) -> Owner {
        Owner {
            pid: me.pid,
            start_time: me.start_time,
            pidns: me.pidns,
            host_pid: 0,
            host_pid_verified: false,
        }
    }

    #[test]
    fn own_process_is_alive_and_a_fake_start_time_is_not() {
        let me = ProcId::current();
        let view = ProcView::current();
        assert!(me.start_time > 0);
        assert_eq!(view.procfs_ns, me.pidns, "tests run with their own /proc");
        assert_eq!(liveness(&owner(&me), &view), Liveness::Alive);
        let reused = Owner {
            start_time: me.start_time + 1,
            ..owner(&me)
        };
        assert_eq!(liveness(&reused, &view), Liveness::Dead);
        // Another namespace, not visible here: never judged by its pid.
        let foreign = Owner {
            pidns: me.pidns + 1,
            ..owner(&me)
        };
        assert_eq!(liveness(&foreign, &view), Liveness::Unknown);
    }

    #[test]
    fn a_verified_host_pid_is_looked_up_only_in_the_initial_namespace() {
        let me = ProcId::current();
        let foreign = Owner {
            pid: 1,
            start_time: me.start_time,
            pidns: 12345,
            host_pid: me.pid,
            host_pid_verified: true,
        };
        let view = ProcView {
            my_ns: 999,
            procfs_ns: INIT_PIDNS,
            host_pid: None,
        };
        // (Our /proc shows our own pid either way.)
        assert_eq!(liveness(&foreign, &view), Liveness::Alive);
        let gone = Owner {
            start_time: me.start_time + 1,
            ..foreign
        };
        assert_eq!(liveness(&gone, &view), Liveness::Dead);
        let inferred = Owner {
            host_pid_verified: false,
            ..foreign
        };
        assert_eq!(liveness(&inferred, &view), Liveness::Unknown);
    }
}

//! Who a process is, and whether it is still alive: pid, start time and pid
//! namespace, read from /proc. A reused pid has another start time; a zombie
//! holds no GPU memory (the driver freed it when its files closed).

use std::fs;
use std::os::unix::fs::MetadataExt;

/// Identifies one process for its whole life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcId {
    pub pid: i32,
    /// Field 22 of `/proc/<pid>/stat`, in clock ticks since boot.
    pub start_time: u64,
    /// Inode of `/proc/<pid>/ns/pid`; 0 when unreadable.
    pub pidns: u64,
}

/// The inode of the initial pid namespace (`PROC_PID_INIT_INO`).
pub const INIT_PIDNS: u64 = 0xEFFF_FFFC;

impl ProcId {
    pub fn current() -> ProcId {
        let pid = std::process::id() as i32;
        let start_time = stat_of("self").map_or(0, |s| s.start_time);
        let pidns = fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino());
        ProcId {
            pid,
            start_time,
            pidns,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub state: char,
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
    Alive,
    /// Gone, a zombie, or its pid now belongs to another process.
    Dead,
    /// In another pid namespace: we cannot see it, so we leave it alone.
    Unknown,
}

/// Checks the owner of a slot from our pid namespace `my_ns`.
pub fn liveness(pid: i32, start_time: u64, pidns: u64, my_ns: u64) -> Liveness {
    if pid <= 0 {
        return Liveness::Dead;
    }
    if pidns != my_ns {
        return Liveness::Unknown;
    }
    match stat_of(&pid.to_string()) {
        None => Liveness::Dead,
        Some(s) if s.state == 'Z' || s.state == 'X' => Liveness::Dead,
        Some(s) if start_time != 0 && s.start_time != start_time => Liveness::Dead,
        Some(_) => Liveness::Alive,
    }
}

/// A cheaper check for read-only views: does the pid exist at all?
pub fn pid_exists(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 performs only the existence and permission
    // checks; it sends nothing.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_hostile_comm() {
        let line =
            "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 50";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.state, 'S');
        assert_eq!(s.start_time, 987654);
    }

    #[test]
    fn own_process_is_alive_and_a_fake_start_time_is_not() {
        let me = ProcId::current();
        assert!(me.start_time > 0);
        assert_eq!(
            liveness(me.pid, me.start_time, me.pidns, me.pidns),
            Liveness::Alive
        );
        assert_eq!(
            liveness(me.pid, me.start_time + 1, me.pidns, me.pidns),
            Liveness::Dead
        );
        assert_eq!(
            liveness(me.pid, me.start_time, me.pidns + 1, me.pidns),
            Liveness::Unknown
        );
    }
}

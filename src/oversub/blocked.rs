//! Threads that wait inside the driver while this process is suspended.
//!
//! The checkpoint lock blocks every driver call, and the process is
//! restored when one of its calls reaches vgpu (a hook or a trampoline).
//! Calls that never do exist: cudart's private export tables, functions a
//! program linked directly. On the H200, a PyTorch job suspended during its
//! idle spell then waited in the driver for ever, nothing logged (runs 21
//! and 23). So while the process is suspended the watcher also looks at its
//! threads: one that has moved since the suspension began and whose stack
//! holds return addresses into the driver's code is waiting on the lock,
//! and the process is restored for it.
//!
//! Read from `/proc/self`: each thread's name and stack pointer (`syscall`)
//! and the words above that pointer (`mem`), never through a pointer.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;

/// Bytes of a thread's stack read above its stack pointer: a blocked
/// driver call's frames sit well within this.
const STACK_BYTES: usize = 16 << 10;
/// Return addresses into the driver needed to call a thread "inside" it:
/// a call blocked on the lock has several frames there, a stale word in a
/// frame of other code rarely makes two.
const MIN_DRIVER_WORDS: usize = 2;

/// Where each thread's stack pointer was when the suspension began.
pub struct Baseline {
    driver: Vec<Range<u64>>,
    sp: HashMap<u32, u64>,
}

impl Baseline {
    /// The threads as they are now (the process is idle); the driver is
    /// the library that holds `driver_fn`, one of its functions.
    pub fn take(driver_fn: Option<u64>) -> Baseline {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        Baseline {
            driver: driver_fn.map_or_else(Vec::new, |f| driver_code(&maps, f)),
            sp: threads().map(|t| (t.tid, t.sp)).collect(),
        }
    }

    /// A thread (id and name) that has moved since and now waits inside
    /// the driver, if there is one.
    pub fn waiting_in_driver(&self) -> Option<(u32, String)> {
        let scan = self.scan();
        log::trace!("{scan}");
        scan.found
    }

    fn scan(&self) -> Scan {
        let mut scan = Scan {
            driver_ranges: self.driver.len(),
            ..Scan::default()
        };
        if self.driver.is_empty() {
            return scan;
        }
        let me = this_thread_id();
        let Ok(mem) = File::open("/proc/self/mem") else {
            return scan;
        };
        let mut maps: Option<String> = None;
        for t in threads() {
            scan.threads += 1;
            if t.tid == me || driver_or_vgpu_thread(&t.name) || self.sp.get(&t.tid) == Some(&t.sp) {
                continue;
            }
            scan.moved += 1;
            // Within the stack's own mapping: a shallow thread's pointer is
            // near its end, and the next mapping is not its stack.
            let maps = maps.get_or_insert_with(|| {
                std::fs::read_to_string("/proc/self/maps").unwrap_or_default()
            });
            let room = mapping_end(maps, t.sp).map_or(0, |end| end - t.sp);
            let mut buf = vec![0u8; STACK_BYTES.min(room as usize)];
            let n = mem.read_at(&mut buf, t.sp).unwrap_or(0);
            let words = in_driver(&buf[..n], &self.driver);
            scan.most = scan.most.max(words);
            if words >= MIN_DRIVER_WORDS && scan.found.is_none() {
                scan.found = Some((t.tid, t.name));
            }
        }
        scan
    }
}

/// What one look at the threads saw (logged at trace level).
#[derive(Default)]
struct Scan {
    driver_ranges: usize,
    threads: usize,
    moved: usize,
    most: usize,
    found: Option<(u32, String)>,
}

impl std::fmt::Display for Scan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "suspended: {} threads blocked, {} moved since the suspension began, at most {} driver return addresses on one stack ({} code ranges of the driver); waiting in the driver: {:?}",
            self.threads, self.moved, self.most, self.driver_ranges, self.found
        )
    }
}

struct Thread {
    tid: u32,
    name: String,
    sp: u64,
}

/// The process's threads that are blocked (in a system call or not
/// running), with their stack pointers.
fn threads() -> impl Iterator<Item = Thread> {
    std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let tid: u32 = e.file_name().to_str()?.parse().ok()?;
            let dir = e.path();
            let syscall = std::fs::read_to_string(dir.join("syscall")).ok()?;
            let sp = stack_pointer(&syscall)?;
            let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            Some(Thread {
                tid,
                name: name.trim().to_string(),
                sp,
            })
        })
}

/// The stack pointer in a `/proc/<pid>/task/<tid>/syscall` line: the
/// second last field ("running" has none).
fn stack_pointer(line: &str) -> Option<u64> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 3 {
        return None;
    }
    let sp = fields[fields.len() - 2];
    u64::from_str_radix(sp.strip_prefix("0x")?, 16).ok()
}

/// The driver's own threads (which live in it) and vgpu's.
fn driver_or_vgpu_thread(name: &str) -> bool {
    name.starts_with("cuda") || name.starts_with("vgpu")
}

/// The executable mappings, in a `/proc/self/maps`, of the file whose code
/// holds `addr`.
fn driver_code(maps: &str, addr: u64) -> Vec<Range<u64>> {
    let code: Vec<(Range<u64>, &str)> = maps
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let range = f.next()?;
            let perms = f.next()?;
            let path = f.nth(3)?;
            let (a, b) = range.split_once('-')?;
            let r = u64::from_str_radix(a, 16).ok()?..u64::from_str_radix(b, 16).ok()?;
            (perms.contains('x') && path.starts_with('/')).then_some((r, path))
        })
        .collect();
    let Some((_, file)) = code.iter().find(|(r, _)| r.contains(&addr)) else {
        return Vec::new();
    };
    code.iter()
        .filter(|(_, p)| p == file)
        .map(|(r, _)| r.clone())
        .collect()
}

/// The end of the mapping, in a `/proc/self/maps`, that holds `addr`.
fn mapping_end(maps: &str, addr: u64) -> Option<u64> {
    maps.lines().find_map(|l| {
        let (a, b) = l.split_whitespace().next()?.split_once('-')?;
        let r = u64::from_str_radix(a, 16).ok()?..u64::from_str_radix(b, 16).ok()?;
        r.contains(&addr).then_some(r.end)
    })
}

/// How many aligned words of `stack` point into `code`.
fn in_driver(stack: &[u8], code: &[Range<u64>]) -> usize {
    stack
        .chunks_exact(8)
        .map(|w| u64::from_ne_bytes(w.try_into().unwrap_or([0; 8])))
        .filter(|v| code.iter().any(|r| r.contains(v)))
        .count()
}

/// This thread's id, from the kernel's `/proc/thread-self` (0 if unreadable).
fn this_thread_id() -> u32 {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_pointers_come_from_the_syscall_line() {
        let blocked = "202 0x7f3c 0x80 0x0 0x0 0x0 0x0 0x7ffd5a3c1e38 0x7f3c1a2b";
        assert_eq!(stack_pointer(blocked), Some(0x7ffd5a3c1e38));
        assert_eq!(
            stack_pointer("-1 0x7ffd00001000 0x7f0000000010"),
            Some(0x7ffd00001000)
        );
        assert_eq!(stack_pointer("running"), None);
    }

    #[test]
    fn the_driver_is_found_in_the_maps_and_on_a_stack() {
        let maps = "\
7f0000000000-7f0000100000 r--p 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05
7f0000100000-7f0002000000 r-xp 00100000 08:01 12 /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05
7f0003000000-7f0003100000 r-xp 00000000 08:01 13 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]";
        assert_eq!(mapping_end(maps, 0x7ffd_0000_0040), Some(0x7ffd_0002_1000));
        assert_eq!(mapping_end(maps, 0x10), None);
        let code = driver_code(maps, 0x7f00_0010_4000);
        assert_eq!(code, vec![0x7f00_0010_0000..0x7f00_0200_0000]);
        assert!(driver_code(maps, 0x7f00_0000_4000).is_empty(), "not code");
        let mut stack = Vec::new();
        for w in [
            1u64,
            0x7f00_0010_1234,
            0x7f00_0300_0010,
            0x7f00_01ff_fff0,
            0x7f00_0000_0010,
        ] {
            stack.extend_from_slice(&w.to_ne_bytes());
        }
        assert_eq!(in_driver(&stack, &code), 2);
    }

    /// This test program's own code, in the driver's place.
    fn own_code() -> Vec<Range<u64>> {
        let exe = std::env::current_exe().unwrap().display().to_string();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .filter(|l| {
                l.ends_with(exe.as_str()) && l.split_whitespace().nth(1).unwrap().contains('x')
            })
            .map(|l| {
                let (a, b) = l
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .split_once('-')
                    .unwrap();
                u64::from_str_radix(a, 16).unwrap()..u64::from_str_radix(b, 16).unwrap()
            })
            .collect()
    }

    fn parked(name: &str) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _ = rx.recv();
            })
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        (tx, t)
    }

    #[test]
    fn a_thread_that_blocks_in_the_code_after_the_baseline_is_found_and_one_from_before_is_not() {
        assert_ne!(this_thread_id(), 0);
        let code = own_code();
        assert!(!code.is_empty());
        // Blocked in this program's code (std's channel) before the
        // suspension: part of the baseline, not counted.
        let (tx_old, old) = parked("before");
        let base = Baseline {
            driver: code.clone(),
            sp: threads().map(|t| (t.tid, t.sp)).collect(),
        };
        // (Other tests' threads run beside this one and may be found too:
        // each check looks a few times for a scan without them.)
        let found = |want: Option<&str>| {
            (0..50).any(|_| {
                let got = base.waiting_in_driver().map(|(_, n)| n);
                if got.as_deref() == want {
                    return true;
                }
                // Never this test's own threads where they must not count.
                assert!(
                    !matches!(got.as_deref(), Some("before" | "cuda-EvtHandlr"))
                        && (want.is_some() || got.as_deref() != Some("after")),
                    "found {got:?}"
                );
                std::thread::sleep(std::time::Duration::from_millis(100));
                false
            })
        };
        assert!(found(None));
        // One that blocks there afterwards is found, by name.
        let (tx_new, new) = parked("after");
        assert!(found(Some("after")));
        // The driver's own threads never count.
        let (tx_drv, drv) = parked("cuda-EvtHandlr");
        tx_new.send(()).unwrap();
        new.join().unwrap();
        assert!(found(None));
        for (tx, t) in [(tx_old, old), (tx_drv, drv)] {
            tx.send(()).unwrap();
            t.join().unwrap();
        }
    }
}

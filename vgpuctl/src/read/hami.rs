//! HAMi-core's layout 1.2 (magic 19920718), as its monitors read it: a
//! header, 1024 process slots of which the first `proc_num` are in use,
//! and a tail of feedback fields. Offsets are in ../shared/HAMI-REGION.md.
//! Read with `pread` from a read-only descriptor: the file is never
//! changed, and a file cut short is an error, never a signal.
#![forbid(unsafe_code)]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::snapshot::{Alive, Device, Format, HamiFields, Process, ProcessDevice, Snapshot};

/// `initialized_flag` once HAMi-core has set the file up.
pub const MAGIC: i32 = 19920718;
/// The whole file, version 1.2.
pub const SIZE: u64 = 2_008_952;
const MAX_DEVICES: usize = 16;
const MAX_PROCS: usize = 1024;
const UUID_LEN: usize = 96;
const UUIDS_AT: usize = 64;
const LIMIT_AT: usize = 1600;
const SM_LIMIT_AT: usize = 1728;
const PROCS_AT: usize = 1856;
const PROC_SIZE: usize = 1960;
const TAIL_AT: usize = 2_008_896;
const TAIL_LEN: usize = 24;
// In a slot:
const USED_AT: usize = 8;
const USED_SIZE: usize = 64;
const MONITORUSED_AT: usize = 1032;
const UTIL_AT: usize = 1160;
const UTIL_SIZE: usize = 48;

/// Whether the first bytes of a file are HAMi's magic.
pub fn is_hami(head: &[u8]) -> bool {
    head.get(..4)
        .is_some_and(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) == MAGIC)
}

/// Reads the HAMi region `file` (at `path`) without writing to it.
pub fn read(path: &Path, file: &File) -> Result<Snapshot, String> {
    let len = file
        .metadata()
        .map_err(|e| format!("{}: stat failed: {e}", path.display()))?
        .len();
    let at = |buf: &mut [u8], off: usize| {
        file.read_exact_at(buf, off as u64)
            .map_err(|e| format!("{}: read at {off} failed: {e}", path.display()))
    };
    let mut head = vec![0u8; PROCS_AT];
    at(&mut head, 0)?;
    let major = u32_at(&head, 4);
    let minor = u32_at(&head, 8);
    if major != 1 || len < SIZE {
        return Err(format!(
            "{}: HAMi layout {major}.{minor} of {len} bytes; only 1.x of {SIZE} bytes or more is read",
            path.display()
        ));
    }
    let mut tail = [0u8; TAIL_LEN];
    at(&mut tail, TAIL_AT)?;
    let proc_num = usize::try_from(i32_at(&tail, 0))
        .unwrap_or(0)
        .min(MAX_PROCS);
    let mut procs = vec![0u8; proc_num * PROC_SIZE];
    at(&mut procs, PROCS_AT)?;

    let device_num = (u64_at(&head, 56) as usize).min(MAX_DEVICES);
    let procs: Vec<&[u8]> = procs.chunks_exact(PROC_SIZE).collect();
    let processes: Vec<Process> = procs
        .iter()
        .enumerate()
        .filter(|(_, p)| i32_at(p, 0) != 0)
        .map(|(i, p)| process(i, p, device_num))
        .collect();
    let devices = (0..device_num)
        .map(|d| {
            let uuid = &head[UUIDS_AT + d * UUID_LEN..UUIDS_AT + (d + 1) * UUID_LEN];
            let uuid_len = uuid.iter().position(|&b| b == 0).unwrap_or(UUID_LEN);
            let in_use = processes
                .iter()
                .flat_map(|p| &p.devices)
                .filter(|x| x.index == d);
            let (used, util) = in_use.fold((0u64, 0u32), |(u, s), x| {
                (
                    u.saturating_add(x.used_bytes),
                    s.saturating_add(x.sm_util_percent),
                )
            });
            Device {
                index: d,
                uuid: String::from_utf8_lossy(&uuid[..uuid_len]).into_owned(),
                memory_limit_bytes: u64_at(&head, LIMIT_AT + 8 * d),
                sm_limit_percent: u32::try_from(u64_at(&head, SM_LIMIT_AT + 8 * d))
                    .unwrap_or(u32::MAX),
                policy: None,
                total_memory_bytes: None,
                used_bytes: used,
                counted_bytes: None,
                utilization_percent: f64::from(util),
                bucket_scale: None,
                leader_pid: None,
                launches_throttled: None,
                throttled_seconds: None,
                oom_denials: None,
                context_estimate_bytes: None,
            }
        })
        .collect();
    Ok(Snapshot {
        path: path.display().to_string(),
        format: Format::Hami,
        layout_version: format!("{major}.{minor}"),
        owner: None,
        slots_reclaimed: None,
        hami: Some(HamiFields {
            utilization_switch: i32_at(&tail, 4),
            recent_kernel: i32_at(&tail, 8),
            priority: i32_at(&tail, 12),
            last_kernel_time: u64_at(&tail, 16),
        }),
        devices,
        processes,
    })
}

fn process(slot: usize, p: &[u8], device_num: usize) -> Process {
    let pid = i32_at(p, 0);
    let host_pid = i32_at(p, 4);
    Process {
        slot,
        pid,
        host_pid: (host_pid > 0).then_some(host_pid),
        host_pid_verified: None,
        // HAMi-core keeps only live processes in 0..proc_num, by its own
        // bookkeeping; nothing here can check it (another pid namespace).
        alive: Alive::Unknown,
        heartbeat_age_ms: None,
        devices: (0..device_num)
            .filter_map(|d| {
                let used = USED_AT + d * USED_SIZE;
                let util = UTIL_AT + d * UTIL_SIZE;
                let pd = ProcessDevice {
                    index: d,
                    context_bytes: u64_at(p, used),
                    module_bytes: u64_at(p, used + 8),
                    buffer_bytes: u64_at(p, used + 16),
                    used_bytes: u64_at(p, used + 32),
                    by_kind: None,
                    nvml_used_bytes: Some(u64_at(p, MONITORUSED_AT + 8 * d)),
                    sm_util_percent: u32::try_from(u64_at(p, util + 16)).unwrap_or(u32::MAX),
                };
                (pd.used_bytes > 0 || pd.sm_util_percent > 0 || pd.nvml_used_bytes > Some(0))
                    .then_some(pd)
            })
            .collect(),
    }
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

fn i32_at(b: &[u8], o: usize) -> i32 {
    i32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

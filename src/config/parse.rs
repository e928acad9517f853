//! The values of vgpu's variables, parsed: each function takes the text
//! and answers None for anything it does not accept, and each constant
//! says, for the error message, what was expected instead.
#![forbid(unsafe_code)]

use log::LevelFilter;

use vgpu_shm::{CorePolicy, MAX_DEVICES as DEVICE_NUMBERS};

pub(super) const BYTES: &str = "bytes with an optional k/m/g suffix, e.g. 4g, 4096m, 1073741824";
pub(super) const PERCENT: &str = "a whole percentage from 0 to 100";
pub(super) const NUMBER: &str =
    "a device number from 0 to 15 after the underscore in the name (_0 ... _15, no leading zeros)";
const _: () = assert!(DEVICE_NUMBERS == 16, "NUMBER names the range");
pub(super) const ABSOLUTE: &str =
    "an absolute path (a relative one would give every working directory a region of its own)";
pub(super) const MODE: &str = "an octal file mode from 0600 to 0666, e.g. 0660";

/// The variables with a device-number suffix.
pub(super) const PER_DEVICE: [&str; 2] = ["CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_"];

/// The number in a `_N` suffix: canonical decimal below DEVICE_NUMBERS.
pub(super) fn parse_number(suffix: &str) -> Option<usize> {
    let canonical = suffix == "0" || (!suffix.starts_with('0') && !suffix.is_empty());
    if !canonical || !suffix.bytes().all(|b| b.is_ascii_digit()) || suffix.len() > 2 {
        return None;
    }
    suffix.parse().ok().filter(|&n| n < DEVICE_NUMBERS)
}

/// `NVIDIA_VISIBLE_DEVICES` as a list of GPU UUIDs; None for anything
/// else (`all`, `none`, indices, MIG devices), which leaves the order to
/// NVML.
pub(super) fn parse_uuid_list(text: &str) -> Option<Vec<[u8; 16]>> {
    text.split(',')
        .map(|t| vgpu_shm::parse_uuid(t.trim()))
        .collect::<Option<Vec<_>>>()
        .filter(|l| !l.is_empty())
}

/// `CUDA_TASK_PRIORITY`: 0 or 1.
pub(super) fn parse_priority(text: &str) -> Option<i32> {
    match text.trim() {
        "0" => Some(0),
        "1" => Some(1),
        _ => None,
    }
}

/// A region file mode: octal, owner read-write at least, nothing beyond
/// read-write for anyone (no execute, setuid or sticky bits).
pub(super) fn parse_mode(text: &str) -> Option<u32> {
    let m = u32::from_str_radix(text.trim(), 8).ok()?;
    (m & !0o666 == 0 && m & 0o600 == 0o600).then_some(m)
}

/// Parses a memory limit: plain bytes, or a number with `k`, `m` or `g`
/// (powers of 1024, any case). `0` means no limit.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let (digits, shift) = match t.as_bytes().last()?.to_ascii_lowercase() {
        b'k' => (&t[..t.len() - 1], 10),
        b'm' => (&t[..t.len() - 1], 20),
        b'g' => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// Parses an SM limit; 0 and 100 mean no limit (`Some(None)`).
pub fn parse_percent(text: &str) -> Option<Option<u32>> {
    let t = text.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match t.parse::<u32>().ok()? {
        0 | 100 => Some(None),
        p if p < 100 => Some(Some(p)),
        _ => None,
    }
}

pub(super) fn parse_bool(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "" | "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

pub(super) fn parse_policy(text: &str) -> Option<CorePolicy> {
    match text.trim().to_ascii_lowercase().as_str() {
        "" | "default" => Some(CorePolicy::Default),
        "force" => Some(CorePolicy::Force),
        "disable" => Some(CorePolicy::Disable),
        _ => None,
    }
}

/// HAMi-core's levels: 0 errors, 1 warnings (our default), 2-3 info, 4 debug.
pub(super) fn parse_level(text: &str) -> Option<LevelFilter> {
    Some(match text.trim().parse::<u32>().ok()? {
        0 => LevelFilter::Error,
        1 => LevelFilter::Warn,
        2 | 3 => LevelFilter::Info,
        4 => LevelFilter::Debug,
        _ => LevelFilter::Trace,
    })
}

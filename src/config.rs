//! The environment, parsed into a typed [`Config`].
//!
//! HAMi-core's variables are the contract: `CUDA_DEVICE_MEMORY_LIMIT[_N]`
//! (bytes with an optional k/m/g suffix, case-insensitive),
//! `CUDA_DEVICE_SM_LIMIT[_N]` (percent), `CUDA_DEVICE_MEMORY_SHARED_CACHE`,
//! `GPU_CORE_UTILIZATION_POLICY`, `CUDA_DISABLE_CONTROL`,
//! `CUDA_OVERSUBSCRIBE`, `LIBCUDA_LOG_LEVEL`. `N` is the container's N-th
//! device ([`DeviceNumber`], assigned in `numbering.rs`), never a process's
//! CUDA ordinal; `NVIDIA_VISIBLE_DEVICES`, when it lists GPU UUIDs, gives
//! that order. vgpu's own: `VGPU_REGION_MODE`, `VGPU_REGION_ANY_OWNER` (how
//! region files are made and trusted).
//!
//! In a secure-execution process (setuid, setgid, file capabilities:
//! `AT_SECURE`), whoever started it may not be the user it runs as, so
//! only the limits are read, and they bind that process alone (see
//! init.rs): no path, log level, switch or region setting.
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use log::LevelFilter;
use vgpu_shm::Limits;

/// How many `_N` suffixes are read.
pub const DEVICE_NUMBERS: usize = vgpu_shm::MAX_DEVICES;

/// The container's N-th device: what the `_N` of
/// `CUDA_DEVICE_MEMORY_LIMIT_N` and `CUDA_DEVICE_SM_LIMIT_N` names. Not a
/// CUDA ordinal (renumbered by `CUDA_VISIBLE_DEVICES`), not a region
/// entry; `numbering.rs` says how a device gets its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceNumber(usize);

impl DeviceNumber {
    /// The container's device `n` (counting from 0).
    pub const fn new(n: usize) -> DeviceNumber {
        DeviceNumber(n)
    }

    /// The number, as `_N` writes it.
    pub const fn get(self) -> usize {
        self.0
    }
}

/// `GPU_CORE_UTILIZATION_POLICY`: the region stores it per device.
pub use vgpu_shm::CorePolicy;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub mem_limit: Option<u64>,
    pub mem_limit_n: [Option<u64>; DEVICE_NUMBERS],
    pub sm_limit: Option<u32>,
    pub sm_limit_n: [Option<u32>; DEVICE_NUMBERS],
    pub shared_cache: Option<PathBuf>,
    /// `NVIDIA_VISIBLE_DEVICES`, when it lists GPU UUIDs (`GPU-...`): the
    /// container's devices in `_N` order.
    pub visible_uuids: Option<Vec<[u8; 16]>>,
    pub policy: CorePolicy,
    pub disable_control: bool,
    pub oversubscribe: bool,
    pub log_level: LevelFilter,
    /// Mode of a region file this process creates (`VGPU_REGION_MODE`).
    pub region_mode: u32,
    /// Accept a region owned by any user (`VGPU_REGION_ANY_OWNER`).
    pub region_any_owner: bool,
    /// Read in a secure-execution process: the environment is untrusted.
    pub secure: bool,
    /// `VGPU_TEST_PANIC`: the hook that panics (tests only).
    pub test_panic: Option<String>,
    /// `VGPU_TEST_HOLD_LOCK`: the lock a thread holds from `cuInit` until
    /// a fork (tests only, `fork.rs`).
    pub test_hold_lock: Option<String>,
    /// Bad values of variables that cannot weaken a limit (log level,
    /// switches): reported, and the default used.
    pub warnings: Vec<ConfigError>,
}

/// A variable with a value we cannot use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub var: String,
    pub value: String,
    pub expected: &'static str,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={:?}: expected {}",
            self.var, self.value, self.expected
        )
    }
}

impl std::error::Error for ConfigError {}

const BYTES: &str = "bytes with an optional k/m/g suffix, e.g. 4g, 4096m, 1073741824";
const PERCENT: &str = "a whole percentage from 0 to 100";
const NUMBER: &str =
    "a device number from 0 to 15 after the underscore in the name (_0 ... _15, no leading zeros)";
const _: () = assert!(DEVICE_NUMBERS == 16, "NUMBER names the range");
const ABSOLUTE: &str =
    "an absolute path (a relative one would give every working directory a region of its own)";
const MODE: &str = "an octal file mode from 0600 to 0666, e.g. 0660";

/// The variables with a device-number suffix.
const PER_DEVICE: [&str; 2] = ["CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_"];

/// The number in a `_N` suffix: canonical decimal below DEVICE_NUMBERS.
fn parse_number(suffix: &str) -> Option<usize> {
    let canonical = suffix == "0" || (!suffix.starts_with('0') && !suffix.is_empty());
    if !canonical || !suffix.bytes().all(|b| b.is_ascii_digit()) || suffix.len() > 2 {
        return None;
    }
    suffix.parse().ok().filter(|&n| n < DEVICE_NUMBERS)
}

/// `NVIDIA_VISIBLE_DEVICES` as a list of GPU UUIDs; None for anything
/// else (`all`, `none`, indices, MIG devices), which leaves the order to
/// NVML.
fn parse_uuid_list(text: &str) -> Option<Vec<[u8; 16]>> {
    text.split(',')
        .map(|t| vgpu_shm::parse_uuid(t.trim()))
        .collect::<Option<Vec<_>>>()
        .filter(|l| !l.is_empty())
}

/// The least limit among the global one and the per-device ones (0 when
/// none is set).
fn least<T: Copy + Ord + Default>(global: Option<T>, per_device: &[Option<T>]) -> T {
    per_device
        .iter()
        .chain([&global])
        .flatten()
        .copied()
        .min()
        .unwrap_or_default()
}

/// A region file mode: octal, owner read-write at least, nothing beyond
/// read-write for anyone (no execute, setuid or sticky bits).
fn parse_mode(text: &str) -> Option<u32> {
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

fn parse_bool(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "" | "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

fn parse_policy(text: &str) -> Option<CorePolicy> {
    match text.trim().to_ascii_lowercase().as_str() {
        "" | "default" => Some(CorePolicy::Default),
        "force" => Some(CorePolicy::Force),
        "disable" => Some(CorePolicy::Disable),
        _ => None,
    }
}

/// HAMi-core's levels: 0 errors, 1 warnings (our default), 2-3 info, 4 debug.
fn parse_level(text: &str) -> Option<LevelFilter> {
    Some(match text.trim().parse::<u32>().ok()? {
        0 => LevelFilter::Error,
        1 => LevelFilter::Warn,
        2 | 3 => LevelFilter::Info,
        4 => LevelFilter::Debug,
        _ => LevelFilter::Trace,
    })
}

impl Default for Config {
    /// No limits, nothing disabled: what an empty environment gives.
    fn default() -> Config {
        Config {
            mem_limit: None,
            mem_limit_n: [None; DEVICE_NUMBERS],
            sm_limit: None,
            sm_limit_n: [None; DEVICE_NUMBERS],
            shared_cache: None,
            visible_uuids: None,
            policy: CorePolicy::Default,
            disable_control: false,
            oversubscribe: false,
            log_level: LevelFilter::Warn,
            region_mode: vgpu_shm::DEFAULT_CREATE_MODE,
            region_any_owner: false,
            secure: false,
            test_panic: None,
            test_hold_lock: None,
            warnings: Vec::new(),
        }
    }
}

impl Config {
    /// The process's environment; `secure`: a secure-execution process.
    pub fn from_env(secure: bool) -> Result<Config, ConfigError> {
        let vars: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        Config::from_vars(
            vars.iter().filter_map(|(k, _)| k.to_str()),
            |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
            secure,
        )
    }

    /// Reads every variable through `get`, not in secure-execution mode,
    /// without checking the names of `_N` variables.
    pub fn from_lookup(get: impl Fn(&str) -> Option<OsString>) -> Result<Config, ConfigError> {
        Config::from_vars(std::iter::empty(), get, false)
    }

    /// Reads every variable through `get`; `names` are every variable's
    /// name, to find `_N` suffixes that are out of range or malformed. A
    /// bad limit is an error: a quota enforcer must not guess what the
    /// limit was meant to be.
    pub fn from_vars<'a>(
        names: impl Iterator<Item = &'a str>,
        get: impl Fn(&str) -> Option<OsString>,
        secure: bool,
    ) -> Result<Config, ConfigError> {
        // Secure execution: only the limits are read (module docs).
        let trusted = |var: &str| if secure { None } else { get(var) };
        let text = |var: &str| get(var).map(|v| v.to_string_lossy().into_owned());
        let trusted_text = |var: &str| trusted(var).map(|v| v.to_string_lossy().into_owned());
        for name in names {
            if let Some(suffix) = PER_DEVICE.iter().find_map(|p| name.strip_prefix(p))
                && parse_number(suffix).is_none()
            {
                return Err(ConfigError {
                    var: name.to_string(),
                    value: text(name).unwrap_or_default(),
                    expected: NUMBER,
                });
            }
        }
        let mut warnings = Vec::new();
        let bad = |var: &str, value: String, expected| ConfigError {
            var: var.to_string(),
            value,
            expected,
        };
        let bytes = |var: &str| -> Result<Option<u64>, ConfigError> {
            match text(var) {
                None => Ok(None),
                Some(v) => match parse_bytes(&v) {
                    Some(0) => Ok(None),
                    Some(b) => Ok(Some(b)),
                    None => Err(bad(var, v, BYTES)),
                },
            }
        };
        let percent = |var: &str| -> Result<Option<u32>, ConfigError> {
            match text(var) {
                None => Ok(None),
                Some(v) => parse_percent(&v).ok_or_else(|| bad(var, v, PERCENT)),
            }
        };
        let mut soft = |var: &str, expected, parse: &dyn Fn(&str) -> bool| {
            if let Some(v) = trusted_text(var).filter(|v| !parse(v)) {
                warnings.push(bad(var, v, expected));
            }
        };
        soft("CUDA_DISABLE_CONTROL", "true or false", &|v| {
            parse_bool(v).is_some()
        });
        soft("CUDA_OVERSUBSCRIBE", "true or false", &|v| {
            parse_bool(v).is_some()
        });
        soft("LIBCUDA_LOG_LEVEL", "a level from 0 to 4", &|v| {
            parse_level(v).is_some()
        });
        soft("VGPU_REGION_ANY_OWNER", "true or false", &|v| {
            parse_bool(v).is_some()
        });
        let region_mode = match trusted_text("VGPU_REGION_MODE") {
            None => vgpu_shm::DEFAULT_CREATE_MODE,
            Some(v) => parse_mode(&v).ok_or_else(|| bad("VGPU_REGION_MODE", v, MODE))?,
        };
        let shared_cache =
            match trusted("CUDA_DEVICE_MEMORY_SHARED_CACHE").filter(|v| !v.is_empty()) {
                Some(p) if !std::path::Path::new(&p).is_absolute() => {
                    return Err(bad(
                        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                        p.to_string_lossy().into_owned(),
                        ABSOLUTE,
                    ));
                }
                p => p.map(PathBuf::from),
            };
        let policy = match trusted_text("GPU_CORE_UTILIZATION_POLICY") {
            None => CorePolicy::Default,
            Some(v) => parse_policy(&v).ok_or_else(|| {
                bad(
                    "GPU_CORE_UTILIZATION_POLICY",
                    v,
                    "default, force or disable",
                )
            })?,
        };

        let mut mem_limit_n = [None; DEVICE_NUMBERS];
        let mut sm_limit_n = [None; DEVICE_NUMBERS];
        for n in 0..DEVICE_NUMBERS {
            mem_limit_n[n] = bytes(&format!("CUDA_DEVICE_MEMORY_LIMIT_{n}"))?;
            sm_limit_n[n] = percent(&format!("CUDA_DEVICE_SM_LIMIT_{n}"))?;
        }
        Ok(Config {
            mem_limit: bytes("CUDA_DEVICE_MEMORY_LIMIT")?,
            mem_limit_n,
            sm_limit: percent("CUDA_DEVICE_SM_LIMIT")?,
            sm_limit_n,
            shared_cache,
            visible_uuids: text("NVIDIA_VISIBLE_DEVICES")
                .as_deref()
                .and_then(parse_uuid_list),
            policy,
            disable_control: trusted_text("CUDA_DISABLE_CONTROL")
                .and_then(|v| parse_bool(&v))
                .unwrap_or(false),
            oversubscribe: trusted_text("CUDA_OVERSUBSCRIBE")
                .and_then(|v| parse_bool(&v))
                .unwrap_or(false),
            log_level: trusted_text("LIBCUDA_LOG_LEVEL")
                .and_then(|v| parse_level(&v))
                .unwrap_or(LevelFilter::Warn),
            region_mode,
            region_any_owner: trusted_text("VGPU_REGION_ANY_OWNER")
                .and_then(|v| parse_bool(&v))
                .unwrap_or(false),
            secure,
            test_panic: trusted_text("VGPU_TEST_PANIC"),
            test_hold_lock: trusted_text("VGPU_TEST_HOLD_LOCK"),
            warnings,
        })
    }

    /// This configuration with no limits: what a secure-execution process
    /// registers in a shared region (its environment may not widen them).
    pub fn without_limits(&self) -> Config {
        Config {
            mem_limit: None,
            mem_limit_n: [None; DEVICE_NUMBERS],
            sm_limit: None,
            sm_limit_n: [None; DEVICE_NUMBERS],
            visible_uuids: None,
            ..self.clone()
        }
    }

    /// The memory limit for the container's device `n` (0 = none): `_N`
    /// wins over the variable without a suffix.
    pub fn mem_limit_for(&self, n: DeviceNumber) -> u64 {
        self.mem_limit_n
            .get(n.0)
            .copied()
            .flatten()
            .or(self.mem_limit)
            .unwrap_or(0)
    }

    /// The SM limit for the container's device `n` (0 = none): `_N` wins.
    pub fn sm_limit_for(&self, n: DeviceNumber) -> u32 {
        self.sm_limit_n
            .get(n.0)
            .copied()
            .flatten()
            .or(self.sm_limit)
            .unwrap_or(0)
    }

    /// The limits for the container's device `number`. A device whose
    /// number is unknown (None) gets the least of the limits set for any
    /// device: fail closed, never more than some `_N` meant.
    pub fn limits_for(&self, number: Option<DeviceNumber>) -> Limits {
        let (mem, sm) = match number {
            Some(n) => (self.mem_limit_for(n), self.sm_limit_for(n)),
            None => (
                least(self.mem_limit, &self.mem_limit_n),
                least(self.sm_limit, &self.sm_limit_n),
            ),
        };
        Limits {
            mem,
            sm,
            policy: self.policy,
        }
    }

    /// Whether some device has a limit of its own (`_N`): only then does
    /// a device's number change its limits.
    pub fn has_per_device_limits(&self) -> bool {
        self.mem_limit_n.iter().any(Option::is_some) || self.sm_limit_n.iter().any(Option::is_some)
    }

    /// Whether the environment asks for any limit at all.
    pub fn has_limits(&self) -> bool {
        self.mem_limit.is_some()
            || self.sm_limit.is_some()
            || self.mem_limit_n.iter().any(Option::is_some)
            || self.sm_limit_n.iter().any(Option::is_some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| {
            vars.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| OsString::from(v))
        })
    }

    #[test]
    fn memory_units_follow_hami_core() {
        assert_eq!(parse_bytes("1073741824"), Some(1 << 30));
        assert_eq!(parse_bytes("1048576k"), Some(1 << 30));
        assert_eq!(parse_bytes("1024M"), Some(1 << 30));
        assert_eq!(parse_bytes(" 4g "), Some(4 << 30));
        assert_eq!(parse_bytes("4G"), Some(4 << 30));
        for bad in [
            "",
            "g",
            "4q",
            "-1g",
            "4.5g",
            "4gb",
            "99999999999999999999",
            "18014398509481984g",
        ] {
            assert_eq!(parse_bytes(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn per_ordinal_limits_override_the_global_one() {
        let c = cfg(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "2g"),
            ("CUDA_DEVICE_SM_LIMIT_1", "30"),
        ])
        .unwrap();
        let (n0, n1) = (DeviceNumber::new(0), DeviceNumber::new(1));
        assert_eq!(c.mem_limit_for(n0), 4 << 30);
        assert_eq!(c.mem_limit_for(n1), 2 << 30);
        assert_eq!((c.sm_limit_for(n0), c.sm_limit_for(n1)), (0, 30));
        assert!(c.has_limits() && c.has_per_device_limits());
        assert!(!cfg(&[]).unwrap().has_limits());
        assert!(
            !cfg(&[("CUDA_DEVICE_MEMORY_LIMIT", "4g")])
                .unwrap()
                .has_per_device_limits()
        );
    }

    #[test]
    fn a_device_of_unknown_number_gets_the_least_limit() {
        let c = cfg(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "2g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_2", "6g"),
            ("CUDA_DEVICE_SM_LIMIT_3", "30"),
        ])
        .unwrap();
        let unknown = c.limits_for(None);
        assert_eq!((unknown.mem, unknown.sm), (2 << 30, 30));
        let two = c.limits_for(Some(DeviceNumber::new(2)));
        assert_eq!((two.mem, two.sm), (6 << 30, 0));
        // Numbers past the last suffix get the variable without one.
        assert_eq!(c.limits_for(Some(DeviceNumber::new(40))).mem, 4 << 30);
        assert_eq!(cfg(&[]).unwrap().limits_for(None), Limits::default());
    }

    #[test]
    fn nvidia_visible_devices_counts_only_as_a_uuid_list() {
        let a = "GPU-51516d67-9000-0000-0000-000000000001";
        let b = "GPU-51516d67-9000-0000-0000-000000000000";
        let c = cfg(&[("NVIDIA_VISIBLE_DEVICES", &format!("{a}, {b}"))]).unwrap();
        let list = c.visible_uuids.unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0][15], 1);
        for other in ["all", "none", "void", "0,1", "", &format!("{a},1")] {
            let c = cfg(&[("NVIDIA_VISIBLE_DEVICES", other)]).unwrap();
            assert_eq!(c.visible_uuids, None, "{other:?}");
        }
    }

    #[test]
    fn bad_limits_are_errors_that_name_the_variable() {
        let e = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT_1", "4q")]).unwrap_err();
        assert_eq!(e.var, "CUDA_DEVICE_MEMORY_LIMIT_1");
        assert!(
            e.to_string()
                .starts_with("CUDA_DEVICE_MEMORY_LIMIT_1=\"4q\": expected bytes"),
            "{e}"
        );
        assert_eq!(
            cfg(&[("CUDA_DEVICE_SM_LIMIT", "130")]).unwrap_err().var,
            "CUDA_DEVICE_SM_LIMIT"
        );
        assert_eq!(
            cfg(&[("CUDA_DEVICE_SM_LIMIT", "3O")]).unwrap_err().var,
            "CUDA_DEVICE_SM_LIMIT"
        );
        assert_eq!(
            cfg(&[("GPU_CORE_UTILIZATION_POLICY", "strict")])
                .unwrap_err()
                .var,
            "GPU_CORE_UTILIZATION_POLICY"
        );
    }

    fn cfg_named(vars: &[(&str, &str)], secure: bool) -> Result<Config, ConfigError> {
        Config::from_vars(
            vars.iter().map(|(k, _)| *k),
            |k| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| OsString::from(v))
            },
            secure,
        )
    }

    #[test]
    fn number_suffixes_must_be_canonical_and_in_range() {
        for good in ["0", "7", "15"] {
            assert!(parse_number(good).is_some(), "{good}");
        }
        for bad in ["", "16", "99999", "00", "07", "-1", "+1", "x", "1 "] {
            assert_eq!(parse_number(bad), None, "{bad:?}");
        }
        let e = cfg_named(&[("CUDA_DEVICE_SM_LIMIT_00", "30")], false).unwrap_err();
        assert_eq!(e.var, "CUDA_DEVICE_SM_LIMIT_00");
        assert!(cfg_named(&[("CUDA_DEVICE_MEMORY_LIMIT_15", "1g")], false).is_ok());
        // Names that only share a prefix are not ours.
        assert!(cfg_named(&[("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/r")], false).is_ok());
    }

    #[test]
    fn region_settings_parse_and_relative_paths_are_refused() {
        let c = cfg(&[("VGPU_REGION_MODE", "0660"), ("VGPU_REGION_ANY_OWNER", "1")]).unwrap();
        assert_eq!((c.region_mode, c.region_any_owner), (0o660, true));
        assert_eq!(cfg(&[]).unwrap().region_mode, 0o666);
        for bad in ["0777", "4666", "0066", "rw", ""] {
            assert_eq!(
                cfg(&[("VGPU_REGION_MODE", bad)]).unwrap_err().var,
                "VGPU_REGION_MODE"
            );
        }
        let e = cfg(&[("CUDA_DEVICE_MEMORY_SHARED_CACHE", "vgpu.cache")]).unwrap_err();
        assert_eq!(e.var, "CUDA_DEVICE_MEMORY_SHARED_CACHE");
    }

    #[test]
    fn secure_execution_reads_limits_only() {
        let vars = [
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/root/x.cache"),
            ("LIBCUDA_LOG_LEVEL", "4"),
            ("CUDA_DISABLE_CONTROL", "1"),
            ("GPU_CORE_UTILIZATION_POLICY", "disable"),
            ("VGPU_REGION_MODE", "0600"),
            ("VGPU_REGION_ANY_OWNER", "1"),
            ("VGPU_TEST_PANIC", "cuInit"),
            ("VGPU_TEST_HOLD_LOCK", "contexts"),
        ];
        let c = cfg_named(&vars, true).unwrap();
        assert_eq!(c.mem_limit, Some(1 << 30));
        assert!(c.secure && c.shared_cache.is_none() && !c.disable_control);
        assert_eq!(c.log_level, LevelFilter::Warn);
        assert_eq!(c.policy, CorePolicy::Default);
        assert_eq!((c.region_mode, c.region_any_owner), (0o666, false));
        assert!(c.test_panic.is_none() && c.test_hold_lock.is_none() && c.warnings.is_empty());
        // A bad limit is still an error: it can only narrow.
        assert!(cfg_named(&[("CUDA_DEVICE_MEMORY_LIMIT", "4q")], true).is_err());
        assert!(!c.without_limits().has_limits());
    }

    #[test]
    fn zero_and_hundred_percent_mean_unlimited() {
        assert_eq!(
            cfg(&[("CUDA_DEVICE_SM_LIMIT", "0")]).unwrap().sm_limit,
            None
        );
        assert_eq!(
            cfg(&[("CUDA_DEVICE_SM_LIMIT", "100")]).unwrap().sm_limit,
            None
        );
        assert_eq!(
            cfg(&[("CUDA_DEVICE_SM_LIMIT", "30")]).unwrap().sm_limit,
            Some(30)
        );
    }

    #[test]
    fn soft_variables_warn_and_keep_defaults() {
        let c = cfg(&[
            ("LIBCUDA_LOG_LEVEL", "loud"),
            ("CUDA_DISABLE_CONTROL", "maybe"),
        ])
        .unwrap();
        assert_eq!(c.log_level, LevelFilter::Warn);
        assert!(!c.disable_control);
        assert_eq!(c.warnings.len(), 2);
        assert!(
            cfg(&[("CUDA_DISABLE_CONTROL", "TRUE")])
                .unwrap()
                .disable_control
        );
        assert_eq!(
            cfg(&[("GPU_CORE_UTILIZATION_POLICY", "FORCE")])
                .unwrap()
                .policy,
            CorePolicy::Force
        );
    }
}

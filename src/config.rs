//! The environment, parsed into a typed [`Config`].
//!
//! HAMi-core's variables are the contract: `CUDA_DEVICE_MEMORY_LIMIT[_N]`
//! (bytes with an optional k/m/g suffix, case-insensitive),
//! `CUDA_DEVICE_SM_LIMIT[_N]` (percent), `CUDA_DEVICE_MEMORY_SHARED_CACHE`,
//! `GPU_CORE_UTILIZATION_POLICY`, `CUDA_DISABLE_CONTROL`,
//! `CUDA_OVERSUBSCRIBE`, `LIBCUDA_LOG_LEVEL`, `CUDA_TASK_PRIORITY` (0 high,
//! 1 normal: what HAMi's monitor reads for its priority time-sharing). `N` is the container's N-th
//! device ([`DeviceNumber`], assigned in `numbering.rs`), never a process's
//! CUDA ordinal; `NVIDIA_VISIBLE_DEVICES`, when it lists GPU UUIDs, gives
//! that order. vgpu's own: `VGPU_REGION_MODE`, `VGPU_REGION_ANY_OWNER` (how
//! region files are made and trusted), `VGPU_OVERSUBSCRIBE_*` (how
//! oversubscription behaves, docs/oversubscription.md).
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

mod parse;
mod policy;

use parse::*;
pub use parse::{parse_bytes, parse_percent};
pub use policy::{
    DEFAULT_QUANTUM_MS, DEFAULT_VMM_QUANTUM_MS, Oversub, Turns, Vmm, default_quantum_ms,
};

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
    /// `CUDA_TASK_PRIORITY`: 0 high, 1 (default) normal; written into a
    /// region this process creates.
    pub task_priority: i32,
    pub disable_control: bool,
    pub oversubscribe: bool,
    /// How oversubscription behaves (`VGPU_OVERSUBSCRIBE_*`), read only
    /// with `CUDA_OVERSUBSCRIBE=true`.
    pub oversub: Oversub,
    /// `VGPU_SM_PERIOD_MS`: the period of the turns beside other
    /// containers (`limiter/turns.rs`; None: the default, 100 ms).
    pub sm_period_ms: Option<u64>,
    /// `VGPU_SM_TURNS`: whether a limited container beside others takes
    /// turns (`limiter/pacing.rs`; default auto).
    pub sm_turns: Turns,
    /// `VGPU_SM_YIELD`: whether a container without an SM limit takes
    /// only what the limits of busy limited containers on its GPU leave
    /// (`limiter/rest.rs`; default true).
    pub sm_yield: bool,
    /// `VGPU_SM_BOARD_DIR`: the node's SM board's directory (None: the
    /// default, `/tmp/vgpulock` where it is a mount point).
    pub sm_board_dir: Option<PathBuf>,
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
            task_priority: 1,
            disable_control: false,
            oversubscribe: false,
            oversub: Oversub::default(),
            sm_period_ms: None,
            sm_turns: Turns::Auto,
            sm_yield: true,
            sm_board_dir: None,
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
        // HAMi's monitor indexes a two-entry table with it: 0 or 1 only.
        soft("CUDA_TASK_PRIORITY", "0 (high) or 1 (normal)", &|v| {
            parse_priority(v).is_some()
        });
        let mut oversub = Oversub::default();
        if let Some(v) = trusted_text("VGPU_OVERSUBSCRIBE_VMM") {
            match Vmm::parse(&v) {
                Some(m) => oversub.vmm = m,
                None => warnings.push(bad("VGPU_OVERSUBSCRIBE_VMM", v, "auto, true or false")),
            }
        }
        let mut number = |var: &str, default: u64| match trusted_text(var) {
            None => default,
            Some(v) => v.trim().parse::<u64>().unwrap_or_else(|_| {
                warnings.push(bad(var, v, "a whole number of milliseconds"));
                default
            }),
        };
        oversub.wait_ms = number("VGPU_OVERSUBSCRIBE_WAIT_MS", oversub.wait_ms);
        oversub.restore_wait_ms = number(
            "VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS",
            oversub.restore_wait_ms,
        );
        oversub.idle_ms = number("VGPU_OVERSUBSCRIBE_IDLE_MS", oversub.idle_ms);
        // (A bad quantum keeps the default, which depends on how the
        // process's switches move its memory.)
        oversub.quantum_ms = trusted_text("VGPU_OVERSUBSCRIBE_QUANTUM_MS").and_then(|v| {
            v.trim().parse::<u64>().ok().or_else(|| {
                let why = "a whole number of milliseconds";
                warnings.push(bad("VGPU_OVERSUBSCRIBE_QUANTUM_MS", v, why));
                None
            })
        });
        let sm_period_ms = trusted_text("VGPU_SM_PERIOD_MS").and_then(|v| {
            let ms = v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|ms| (10..=1000).contains(ms));
            if ms.is_none() {
                warnings.push(bad("VGPU_SM_PERIOD_MS", v, "milliseconds from 10 to 1000"));
            }
            ms
        });
        let sm_turns = match trusted_text("VGPU_SM_TURNS") {
            None => Turns::Auto,
            Some(v) => Turns::parse(&v).unwrap_or_else(|| {
                warnings.push(bad("VGPU_SM_TURNS", v, "auto, true or false"));
                Turns::Auto
            }),
        };
        let sm_yield = match trusted_text("VGPU_SM_YIELD") {
            None => true,
            Some(v) => parse_bool(&v).unwrap_or_else(|| {
                warnings.push(bad("VGPU_SM_YIELD", v, "true or false"));
                true
            }),
        };
        let sm_board_dir = trusted("VGPU_SM_BOARD_DIR")
            .filter(|v| !v.is_empty())
            .and_then(|v| {
                if std::path::Path::new(&v).is_absolute() {
                    return Some(PathBuf::from(v));
                }
                let v = v.to_string_lossy().into_owned();
                warnings.push(bad("VGPU_SM_BOARD_DIR", v, ABSOLUTE));
                None
            });
        if let Some(v) = trusted_text("VGPU_OVERSUBSCRIBE_HOST_LIMIT") {
            match parse_bytes(&v) {
                Some(0) | None => warnings.push(bad("VGPU_OVERSUBSCRIBE_HOST_LIMIT", v, BYTES)),
                Some(b) => oversub.host_limit = Some(b),
            }
        }
        if let Some(v) = trusted("VGPU_OVERSUBSCRIBE_DIR").filter(|v| !v.is_empty()) {
            if std::path::Path::new(&v).is_absolute() {
                oversub.dir = PathBuf::from(v);
            } else {
                warnings.push(bad(
                    "VGPU_OVERSUBSCRIBE_DIR",
                    v.to_string_lossy().into_owned(),
                    ABSOLUTE,
                ));
            }
        }
        oversub.test_watcher_stop = trusted_text("VGPU_TEST_WATCHER_STOP").as_deref() == Some("1");
        oversub.test_claim_bound_ms =
            trusted_text("VGPU_TEST_CLAIM_BOUND_MS").and_then(|v| v.trim().parse().ok());
        oversub.test_arena_keep_ms =
            trusted_text("VGPU_TEST_ARENA_KEEP_MS").and_then(|v| v.trim().parse().ok());
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
            task_priority: trusted_text("CUDA_TASK_PRIORITY")
                .and_then(|v| parse_priority(&v))
                .unwrap_or(1),
            disable_control: trusted_text("CUDA_DISABLE_CONTROL")
                .and_then(|v| parse_bool(&v))
                .unwrap_or(false),
            oversubscribe: trusted_text("CUDA_OVERSUBSCRIBE")
                .and_then(|v| parse_bool(&v))
                .unwrap_or(false),
            oversub,
            sm_period_ms,
            sm_turns,
            sm_yield,
            sm_board_dir,
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
mod tests;

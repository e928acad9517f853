//! Environment configuration of the simulated GPU.

use std::path::PathBuf;

pub struct Config {
    pub state: PathBuf,
    pub count: u32,
    pub memory: u64,
    pub sms: u32,
    pub ctx_overhead: u64,
    pub block_ns: u64,
    pub slice_ns: u64,
    pub switch_ns: u64,
    pub nvml_period_us: u64,
    pub pid_offset: u32,
    pub nvml_delay_us: u64,
    pub jitter_pct: u64,
    pub wander_pct: u64,
}

pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()?.to_ascii_lowercase() {
        'k' => (&s[..s.len() - 1], 1u64 << 10),
        'm' => (&s[..s.len() - 1], 1 << 20),
        'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

fn var<T>(name: &str, default: T, parse: impl Fn(&str) -> Option<T>) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| parse(&v))
        .unwrap_or(default)
}

impl Config {
    pub fn from_env() -> Config {
        let uid = unsafe_free_uid();
        Config {
            state: std::env::var_os("SIM_GPU_STATE")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(format!("/tmp/sim-gpu-{uid}.v6.state"))),
            count: var("SIM_GPU_COUNT", 1, |v| v.parse().ok())
                .clamp(1, crate::state::MAX_DEV as u32),
            memory: var("SIM_GPU_MEMORY", 16 << 30, parse_bytes),
            sms: var("SIM_GPU_SMS", 132, |v| v.parse().ok()).max(1),
            ctx_overhead: var("SIM_GPU_CTX_OVERHEAD", 300 << 20, parse_bytes),
            block_ns: var("SIM_GPU_BLOCK_NS", 10_000, |v| v.parse().ok()),
            slice_ns: var("SIM_GPU_TIMESLICE_NS", 2_000_000, |v| v.parse().ok()).max(1_000),
            switch_ns: var("SIM_GPU_SWITCH_NS", 200_000, |v| v.parse().ok()),
            nvml_period_us: var("SIM_GPU_NVML_PERIOD_US", 166_667, |v| v.parse().ok()).max(1_000),
            pid_offset: var("SIM_GPU_PID_OFFSET", 0, |v| v.parse().ok()),
            nvml_delay_us: var("SIM_GPU_NVML_DELAY_US", 0, |v| v.parse().ok()),
            jitter_pct: var("SIM_GPU_JITTER_PCT", 0, |v| v.parse().ok()).min(100),
            wander_pct: var("SIM_GPU_WANDER_PCT", 0, |v| v.parse().ok()).min(100),
        }
    }
}

fn unsafe_free_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map_or(0, |m| m.uid())
}

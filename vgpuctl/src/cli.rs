//! The command line, declared with clap: subcommands, `--help` for each,
//! and shell completion scripts generated from the same declaration.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Inspect and export vgpu's (and HAMi-core's) per-container GPU regions.
#[derive(Debug, Parser)]
#[command(name = "vgpuctl", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// vgpuctl's subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Devices, limits, usage and processes of regions (a table, or --json).
    Status(StatusArgs),
    /// The status table, redrawn every second until interrupted.
    Watch(WatchArgs),
    /// The bytes a container's live processes hold on one device entry.
    Usage {
        /// The region file.
        region: PathBuf,
        /// The device entry (0-15), as `status` numbers it.
        device: usize,
    },
    /// Frees the slots of dead processes, so their memory returns to the quota.
    Reclaim {
        /// The region file [default: $CUDA_DEVICE_MEMORY_SHARED_CACHE, else
        /// /tmp/cudevshr.cache].
        region: Option<PathBuf>,
    },
    /// A Prometheus exporter of every container's region on this node, with
    /// HAMi's metric names (a replacement for HAMi's vGPUmonitor).
    Serve(ServeArgs),
    /// The node's oversubscription board: every process of an oversubscribed
    /// container, its state and bytes (docs/oversubscription.md).
    Oversub {
        /// The board's directory [default: $VGPU_OVERSUBSCRIBE_DIR, else
        /// /run/vgpu-oversub for root, /tmp/vgpu-oversub for others].
        dir: Option<PathBuf>,
    },
    /// Prints a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Which regions to read.
#[derive(Debug, Args)]
pub struct Regions {
    /// Region files [default, without --root: $CUDA_DEVICE_MEMORY_SHARED_CACHE,
    /// else /tmp/cudevshr.cache].
    pub regions: Vec<PathBuf>,
    /// Also every container's region under ROOT/containers/{podUID}_{container}/
    /// (HAMi's layout) and ROOT/vgpu/containers/... (Volcano's);
    /// $HAMI_VGPU_CACHE_ROOT names the containers directory itself.
    #[arg(long, value_name = "ROOT")]
    pub root: Option<PathBuf>,
    /// Kubernetes API server for the pod names of regions under ROOT (in a
    /// cluster the pod's own service account is used without it).
    #[arg(long, value_name = "URL")]
    pub api_server: Option<String>,
}

/// `vgpuctl status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Which regions.
    #[command(flatten)]
    pub regions: Regions,
    /// JSON in the documented schema (docs/vgpuctl.md), not a table.
    #[arg(long)]
    pub json: bool,
}

/// `vgpuctl watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Which regions.
    #[command(flatten)]
    pub regions: Regions,
    /// Seconds between redraws.
    #[arg(long, default_value_t = 1.0, value_parser = positive_secs)]
    pub interval: f64,
    /// Stop after this many redraws [default: never].
    #[arg(long)]
    pub count: Option<u64>,
}

/// `vgpuctl serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// More region files to export, besides those found under ROOT.
    pub regions: Vec<PathBuf>,
    /// HAMi's hook path: regions are found under ROOT/containers/ (HAMi)
    /// and ROOT/vgpu/containers/ (Volcano), or $HAMI_VGPU_CACHE_ROOT,
    /// rescanned every --rescan seconds.
    #[arg(long, value_name = "ROOT", env = "HOOK_PATH", default_value = crate::scan::DEFAULT_ROOT)]
    pub root: PathBuf,
    /// Address to serve /metrics on (HAMi's monitor uses :9394).
    #[arg(long, default_value = "0.0.0.0:9394")]
    pub listen: SocketAddr,
    /// Seconds between scans of the containers directory.
    #[arg(long, default_value_t = 5.0, value_parser = positive_secs)]
    pub rescan: f64,
    /// Also the metric names of HAMi's monitor before 2.6 (vGPU_device_memory_usage_in_bytes, ...).
    #[arg(long, conflicts_with = "without_hami_families")]
    pub legacy_metrics: bool,
    /// Leave out HAMi's families (hami_*, hami_build_info): for a node where
    /// HAMi's own monitor exports them, so that no series is exported twice.
    /// vgpu's own families (vgpu_*) stay.
    #[arg(long)]
    pub without_hami_families: bool,
    /// The `node` label of the host families, as HAMi's monitor sets it
    /// [default: the host name].
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node: Option<String>,
    /// The `zone` label every series carries, as HAMi's monitor sets it.
    #[arg(long, default_value = "vGPU")]
    pub zone: String,
    /// The NVML library for the host families (hami_host_gpu_*).
    #[arg(long, default_value = "libnvidia-ml.so.1")]
    pub nvml: PathBuf,
    /// Run HAMi's priority feedback loop in place of HAMi's monitor's:
    /// block a normal-priority container's launches while a high-priority
    /// one (CUDA_TASK_PRIORITY=0) runs on its GPU, and set each region's
    /// utilization_switch. The only writes serve ever makes.
    #[arg(long)]
    pub feedback: bool,
    /// Seconds between feedback rounds (HAMi's monitor: 5).
    #[arg(long, default_value_t = 5.0, value_parser = positive_secs)]
    pub feedback_interval: f64,
    /// Kubernetes API server for pod names (e.g. `kubectl proxy`'s
    /// http://127.0.0.1:8001); in a cluster the pod's own service account
    /// is used without it.
    #[arg(long, value_name = "URL")]
    pub api_server: Option<String>,
    /// Directory of the node's oversubscription board, whose processes are
    /// exported as vgpu_oversub_* (none there: no such series) [default:
    /// $VGPU_OVERSUBSCRIBE_DIR, else /run/vgpu-oversub for root, /tmp/vgpu-oversub for others].
    #[arg(long, value_name = "DIR")]
    pub oversub_dir: Option<PathBuf>,
    /// Leave the regions of gone pods in place (by default serve removes
    /// a container's directory once its pod is gone: docs/vgpuctl.md).
    #[arg(long)]
    pub no_housekeeping: bool,
    /// Seconds a gone pod's directory must be untouched before removal.
    #[arg(long, default_value_t = 300.0, value_parser = grace_secs)]
    pub housekeeping_grace: f64,
    /// Seconds between housekeeping passes.
    #[arg(long, default_value_t = 60.0, value_parser = positive_secs)]
    pub housekeeping_interval: f64,
}

fn grace_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=30.0 * 86_400.0).contains(&v) => Ok(v),
        _ => Err(format!("{s}: expected seconds, 0 to 2592000")),
    }
}

fn positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() && v <= 3600.0 => Ok(v),
        _ => Err(format!(
            "{s}: expected seconds, more than 0 and at most 3600"
        )),
    }
}

/// The region a command means when none is named.
pub fn default_region() -> PathBuf {
    std::env::var_os("CUDA_DEVICE_MEMORY_SHARED_CACHE")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/tmp/cudevshr.cache"), PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_declaration_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bad_values_are_named() {
        let e = Cli::try_parse_from(["vgpuctl", "watch", "--interval", "0"]).unwrap_err();
        assert!(e.to_string().contains("0: expected seconds"), "{e}");
        let e = Cli::try_parse_from(["vgpuctl", "serve", "--listen", "nowhere"]).unwrap_err();
        assert!(e.to_string().contains("nowhere"), "{e}");
        let e = Cli::try_parse_from(["vgpuctl", "usage", "r", "x"]).unwrap_err();
        assert!(e.to_string().contains("'x'"), "{e}");
    }
}

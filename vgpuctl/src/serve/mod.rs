//! `vgpuctl serve`: a Prometheus exporter that can stand in for HAMi's
//! vGPUmonitor on a node.
//!
//! Regions are found the way HAMi's and Volcano's monitors find them
//! (`{root}/containers/...` and `{root}/vgpu/containers/...`, rescanned every few
//! seconds by a thread of their own) plus any named on the command line.
//! Each scrape reads every region afresh, read-only (`crate::read`), and
//! NVML's figures for the host, and encodes them (`metrics`). Nothing is
//! written to any region, unless `--feedback` runs HAMi's priority loop.
//!
//! - `http`: the HTTP server, its limits and timeouts (`deadline`)
//! - `targets`: the region files to read, rescanned on a thread
//! - `metrics`: the families and their labels (`family`: the helpers
//!   every family module shares)
//! - `host`: NVML, for the `hami_host_gpu_*` families
//! - `legacy`: HAMi's older metric names (`--legacy-metrics`)
//! - `feedback`: HAMi's priority loop, with `--feedback` (the one writer)
//! - `pods`: namespaces and pod names from the Kubernetes API's pod list
//! - `podwatch`: keeps them current with one LIST, then a WATCH
//! - `oversub`: the node's oversubscription board (`--oversub-dir`), as
//!   `vgpu_oversub_*` families

mod deadline;
mod family;
pub mod feedback;
pub mod host;
pub mod http;
mod legacy;
pub mod metrics;
mod oversub;
pub mod pods;
pub mod podwatch;
mod targets;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cli::ServeArgs;
use crate::scan::{self, Found};
use crate::snapshot::Snapshot;
pub use targets::Targets;

/// The exposition's content type (what `prometheus-client` encodes).
pub const CONTENT_TYPE: &str = http::CONTENT_TYPE_METRICS;

/// Runs the exporter until the process is stopped.
pub fn run(a: &ServeArgs) -> Result<(), String> {
    let listener = std::net::TcpListener::bind(a.listen)
        .map_err(|e| format!("cannot listen on {}: {e}", a.listen))?;
    let dirs = scan::containers_dirs(&a.root);
    let targets = Targets::new(dirs.clone(), a.regions.clone());
    let board_dir = a
        .oversub_dir
        .clone()
        .unwrap_or_else(crate::oversub::default_dir);
    let pods = match pods::Source::find(a.api_server.as_deref()) {
        Ok(source) => source,
        Err(e) => {
            eprintln!("vgpuctl serve: no pod names (namespace empty, pod = its UID): {e}");
            None
        }
    };
    let has_pods = pods.is_some();
    targets.watch(Duration::from_secs_f64(a.rescan), pods);
    if !a.no_housekeeping {
        crate::housekeeping::start(
            dirs.clone(),
            has_pods.then(|| targets.names()),
            crate::housekeeping::Policy {
                grace: Duration::from_secs_f64(a.housekeeping_grace),
            },
            Duration::from_secs_f64(a.housekeeping_interval),
        );
    }
    if a.feedback {
        feedback::start(
            targets.clone(),
            Duration::from_secs_f64(a.feedback_interval),
        );
    }
    let host = host::Host::open(&a.nvml);
    let opts = metrics::Options::from_args(a);
    let addr = listener
        .local_addr()
        .map_or_else(|_| a.listen.to_string(), |s| s.to_string());
    // One line on stdout, flushed: scripts and tests learn the port from it.
    println!(
        "vgpuctl serve: http://{addr}/metrics, regions under {}, oversubscription board in {}",
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(" and "),
        board_dir.display()
    );
    let mut warned = HashSet::new();
    let exposition = http::Coalesced::new(move || {
        scrape(
            &targets.current(),
            Some(&board_dir),
            &host,
            &opts,
            &mut warned,
        )
    });
    http::serve(listener, exposition)
}

/// Reads every target, and the oversubscription board in `board_dir`
/// when there is one, and encodes one exposition. A file that cannot be
/// read is counted (a region) or left out (the board), and named on
/// stderr the first time (`warned`).
pub fn scrape(
    targets: &[Found],
    board_dir: Option<&Path>,
    host: &host::Host,
    opts: &metrics::Options,
    warned: &mut HashSet<PathBuf>,
) -> String {
    let mut regions: Vec<Snapshot> = Vec::with_capacity(targets.len());
    let mut unreadable = 0;
    for t in targets {
        match crate::read::read(&t.path) {
            Ok(mut s) => {
                s.owner = Some(t.owner.clone());
                warned.remove(&t.path);
                regions.push(s);
            }
            Err(e) => {
                unreadable += 1;
                if warned.insert(t.path.clone()) {
                    eprintln!("vgpuctl serve: {e}");
                }
            }
        }
    }
    let board = board_dir.and_then(|dir| {
        let path = dir.join(vgpu_shm::board::BOARD_FILE);
        match vgpu_shm::board::Board::read_copy(dir) {
            Ok(b) => {
                warned.remove(&path);
                b
            }
            Err(e) => {
                if warned.insert(path) {
                    eprintln!("vgpuctl serve: {e}; its processes are left out");
                }
                None
            }
        }
    });
    metrics::encode(&regions, &host.read(), unreadable, board.as_ref(), opts)
}

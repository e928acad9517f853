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
//! - `metrics`: the families and their labels
//! - `host`: NVML, for the `hami_host_gpu_*` families
//! - `legacy`: HAMi's older metric names (`--legacy-metrics`)
//! - `feedback`: HAMi's priority loop, with `--feedback` (the one writer)
//! - `pods`: namespaces and pod names from the Kubernetes API's pod list
//! - `podwatch`: keeps them current with one LIST, then a WATCH
//! - `oversub`: the node's oversubscription board (`--oversub-dir`), as
//!   `vgpu_oversub_*` families

pub mod feedback;
pub mod host;
mod legacy;
pub mod metrics;
mod oversub;
pub mod pods;
pub mod podwatch;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::cli::ServeArgs;
use crate::scan::{self, Found};
use crate::snapshot::{Owner, Snapshot};

/// The exposition's content type (what `prometheus-client` encodes).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Runs the exporter until the process is stopped.
pub fn run(a: &ServeArgs) -> Result<(), String> {
    let server = tiny_http::Server::http(a.listen)
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
                grace_no_api: Duration::from_secs_f64(a.housekeeping_grace_no_api),
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
    let opts = metrics::Options {
        zone: a.zone.clone(),
        legacy: a.legacy_metrics,
    };
    let addr = server
        .server_addr()
        .to_ip()
        .map_or_else(|| a.listen.to_string(), |s| s.to_string());
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
    for request in server.incoming_requests() {
        let response = match (request.method(), request.url()) {
            (tiny_http::Method::Get, "/metrics") => {
                let body = scrape(
                    &targets.current(),
                    Some(&board_dir),
                    &host,
                    &opts,
                    &mut warned,
                );
                text(200, body, CONTENT_TYPE)
            }
            (tiny_http::Method::Get, "/healthz") => text(200, "ok\n".into(), "text/plain"),
            (tiny_http::Method::Get, "/") => text(
                200,
                "vgpuctl serve: metrics at /metrics\n".into(),
                "text/plain",
            ),
            _ => text(404, "not found\n".into(), "text/plain"),
        };
        // A client that went away is no error of ours.
        let _ = request.respond(response);
    }
    Ok(())
}

fn text(
    status: u16,
    body: String,
    content_type: &str,
) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let header = tiny_http::Header::from_bytes("Content-Type", content_type)
        .expect("a constant header is valid");
    tiny_http::Response::from_string(body)
        .with_status_code(status)
        .with_header(header)
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

/// The region files to export: the last scan of the containers directory
/// and the files named on the command line.
#[derive(Clone)]
pub struct Targets {
    dirs: Vec<PathBuf>,
    named: Vec<Found>,
    scanned: Arc<Mutex<Vec<Found>>>,
    names: pods::PodNames,
}

impl Targets {
    /// Scans `dirs` (containers directories) once now.
    pub fn new(dirs: Vec<PathBuf>, named: Vec<PathBuf>) -> Targets {
        let scanned = Arc::new(Mutex::new(scan::containers(&dirs)));
        Targets {
            dirs,
            named: named.into_iter().map(named_target).collect(),
            scanned,
            names: pods::PodNames::default(),
        }
    }

    /// Reads the pod list from `pods` (if any) now, so that the first
    /// scrape has the names, and keeps it current (`podwatch`); rescans
    /// the directories every `period` on a thread of its own.
    pub fn watch(&self, period: Duration, pods: Option<pods::Source>) {
        if let Some(source) = pods
            && let Err(e) = podwatch::start(source, self.names.clone())
        {
            eprintln!("vgpuctl serve: pod list unreadable, keeping the last names: {e}");
        }
        let me = self.clone();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(period);
                let found = scan::containers(&me.dirs);
                *me.scanned.lock().unwrap_or_else(PoisonError::into_inner) = found;
            }
        });
    }

    /// The pod names, as the watch keeps them.
    pub fn names(&self) -> pods::PodNames {
        self.names.clone()
    }

    /// Every target now; a file both named and found counts once.
    pub fn current(&self) -> Vec<Found> {
        let mut all = self
            .scanned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for n in &self.named {
            if !all.iter().any(|f| f.path == n.path) {
                all.push(n.clone());
            }
        }
        for f in &mut all {
            self.names.name(&mut f.owner);
        }
        all
    }
}

/// A file named on the command line: its owner from its directory's name
/// when that is `{podUID}_{container}`, else the file's name as the
/// container's.
fn named_target(path: PathBuf) -> Found {
    let parent = path
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .and_then(scan::owner_of);
    let owner = parent.unwrap_or_else(|| Owner {
        container: path
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned()),
        ..Owner::default()
    });
    Found { path, owner }
}

//! `vgpuctl`: inspect vgpu's per-container regions, and export them to
//! Prometheus.
//!
//! ```text
//! vgpuctl status [REGION...] [--root DIR] [--json]   devices, limits, usage, processes
//! vgpuctl watch  [REGION...] [--root DIR]            the same table, every second
//! vgpuctl usage  REGION DEV                          the container's bytes on device entry DEV
//! vgpuctl reclaim [REGION]                           free the slots of dead processes
//! vgpuctl serve  [REGION...] [--root DIR]            Prometheus exporter (HAMi's metric names)
//! vgpuctl oversub [DIR]                              the node's oversubscription board (oversub.rs)
//! vgpuctl completions SHELL                          shell completion script
//! ```
//!
//! Regions are read without writing to them (`read/`): a file opened
//! read-only, never through a symlink, copied with `pread`, of either
//! layout (vgpu's, or HAMi-core's 1.2). Only `reclaim` writes. A reader
//! that goes away early (`vgpuctl status | head -1`) ends it quietly.
//! Built on `vgpu-shm` alone: this binary exports no CUDA or NVML symbol.
//! The modules are in the library half of this crate (`lib.rs`).

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use vgpu_shm::hami::Opened;
use vgpu_shm::{EntryIndex, ProcView};

use vgpuctl::cli::{self, Cli, Command, Regions};
use vgpuctl::snapshot::{self, Report, SCHEMA_VERSION, Snapshot};
use vgpuctl::{oversub, read, scan, serve, table};

/// Why a command failed (printed after `vgpuctl: `).
type Failure = String;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut out = std::io::stdout().lock();
    match run(cli.command, &mut out) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader has what it wanted (`| head -1`).
        Err(Stop::Pipe) => ExitCode::SUCCESS,
        Err(Stop::Failed(e)) => {
            eprintln!("vgpuctl: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How a command ended early.
enum Stop {
    /// Stdout was closed by its reader.
    Pipe,
    /// An error to report.
    Failed(Failure),
}

impl From<Failure> for Stop {
    fn from(e: Failure) -> Stop {
        Stop::Failed(e)
    }
}

fn emit(out: &mut impl Write, text: &str) -> Result<(), Stop> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Stop::Pipe),
        Err(e) => Err(Stop::Failed(format!("writing the output failed: {e}"))),
    }
}

fn run(command: Command, out: &mut impl Write) -> Result<(), Stop> {
    match command {
        Command::Status(a) => {
            let (regions, errors) = collect(&a.regions)?;
            let text = if a.json {
                let report = Report {
                    schema_version: SCHEMA_VERSION,
                    regions,
                    errors,
                };
                serde_json::to_string_pretty(&report).map_err(|e| e.to_string())? + "\n"
            } else {
                table::render(&regions, &errors)
            };
            emit(out, &text)
        }
        Command::Watch(a) => watch(&a, out),
        Command::Usage { region, device } => {
            let dev = EntryIndex::new(device).ok_or_else(|| {
                format!(
                    "device entry {device} out of range: a region has entries 0 to {}",
                    vgpu_shm::MAX_DEVICES - 1
                )
            })?;
            let s = read::read(&region)?;
            let used = s
                .devices
                .iter()
                .find(|d| d.index == dev.get())
                .map_or(0, |d| d.used_bytes);
            emit(out, &format!("{used}\n"))
        }
        Command::Reclaim { region } => {
            let path = region.unwrap_or_else(cli::default_region);
            let n = reclaim(&path)?;
            emit(out, &format!("reclaimed {n} slots of dead processes\n"))
        }
        Command::Serve(a) => serve::run(&a).map_err(Stop::Failed),
        Command::Oversub { dir } => emit(out, &oversub::report(dir.as_deref())?),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "vgpuctl", &mut script);
            emit(out, &String::from_utf8_lossy(&script))
        }
    }
}

/// Reads the regions asked for: a named file that cannot be read is an
/// error; one found under --root is listed among `errors` (a container may
/// be starting or going away).
fn collect(which: &Regions) -> Result<(Vec<Snapshot>, Vec<snapshot::Unreadable>), Failure> {
    let mut named = which.regions.clone();
    if named.is_empty() && which.root.is_none() {
        named.push(cli::default_region());
    }
    let mut regions = Vec::new();
    for path in &named {
        regions.push(read::read(path)?);
    }
    let mut errors = Vec::new();
    if let Some(root) = &which.root {
        let names = pod_names(which.api_server.as_deref());
        for mut found in scan::containers(&scan::containers_dirs(root)) {
            if let Some(n) = &names {
                n.name(&mut found.owner);
            }
            match read::read(&found.path) {
                Ok(mut s) => {
                    s.owner = Some(found.owner);
                    regions.push(s);
                }
                Err(error) => errors.push(snapshot::Unreadable {
                    path: found.path.display().to_string(),
                    error,
                }),
            }
        }
    }
    Ok((regions, errors))
}

/// One pod list, when an API server is named or the command runs in a
/// cluster; None (names stay UIDs) otherwise, or when it cannot be read
/// (said on stderr).
fn pod_names(api_server: Option<&str>) -> Option<serve::pods::PodNames> {
    let source = match serve::pods::Source::find(api_server) {
        Ok(s) => s?,
        Err(e) => {
            eprintln!("vgpuctl: no pod names: {e}");
            return None;
        }
    };
    let names = serve::pods::PodNames::default();
    match names.refresh(&source) {
        Ok(_) => Some(names),
        Err(e) => {
            eprintln!("vgpuctl: no pod names: {e}");
            None
        }
    }
}

fn watch(a: &cli::WatchArgs, out: &mut impl Write) -> Result<(), Stop> {
    // On a terminal each frame replaces the last; in a pipe frames follow
    // one another, a blank line apart.
    let clear = std::io::stdout().is_terminal();
    let mut frame = 0u64;
    loop {
        let text = match collect(&a.regions) {
            Ok((regions, errors)) => table::render(&regions, &errors),
            Err(e) => format!("{e}\n"),
        };
        let sep = if clear {
            "\x1b[H\x1b[2J"
        } else if frame > 0 {
            "\n"
        } else {
            ""
        };
        emit(out, &format!("{sep}{text}"))?;
        frame += 1;
        if a.count.is_some_and(|n| frame >= n) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs_f64(a.interval));
    }
}

fn reclaim(path: &Path) -> Result<u32, Failure> {
    // A region of any owner (this tool only frees dead processes' slots),
    // never created, adopted or upgraded, never through a symlink.
    match vgpu_shm::hami::open_any(path, true).map_err(|e| e.to_string())? {
        Opened::Vgpu(r) => r
            .reclaim_dead(&ProcView::current(), None)
            .map_err(|e| e.to_string()),
        Opened::HamiCore(_) => Err(format!(
            "region {}: a HAMi-core file; its slots are HAMi-core's to free",
            path.display()
        )),
    }
}

//! The region files to export: the last scan of the containers
//! directories (HAMi's and Volcano's trees), rescanned on a thread of its
//! own while `podwatch` keeps the pod names, and the files named on the
//! command line.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::{pods, podwatch};
use crate::scan::{self, Found};
use crate::snapshot::Owner;

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

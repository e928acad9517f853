//! The region files to export: the last scan of the containers
//! directory, rescanned on a thread of its own with the pod list, and the
//! files named on the command line.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::pods;
use crate::scan::{self, Found};
use crate::snapshot::Owner;

/// The region files to export: the last scan of the containers directory
/// and the files named on the command line.
#[derive(Clone)]
pub struct Targets {
    dir: PathBuf,
    named: Vec<Found>,
    scanned: Arc<Mutex<Vec<Found>>>,
    names: pods::PodNames,
}

impl Targets {
    /// Scans `dir` once now.
    pub fn new(dir: PathBuf, named: Vec<PathBuf>) -> Targets {
        let scanned = Arc::new(Mutex::new(scan::containers(&dir)));
        Targets {
            dir,
            named: named.into_iter().map(named_target).collect(),
            scanned,
            names: pods::PodNames::default(),
        }
    }

    /// Reads the pod list from `pods` (if any) now, so that the first
    /// scrape has the names, then rescans the directory and the pod list
    /// every `period` on a thread of its own.
    pub fn watch(&self, period: Duration, pods: Option<pods::Source>) {
        let me = self.clone();
        let name_pods = move |said: &mut Option<String>| {
            let Some(source) = &pods else { return };
            let got = me.names.refresh(source).err();
            if got.is_some() && got != *said {
                eprintln!(
                    "vgpuctl serve: pod list unreadable, keeping the last names: {}",
                    got.as_deref().unwrap_or_default()
                );
            }
            *said = got;
        };
        let mut said = None;
        name_pods(&mut said);
        let me = self.clone();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(period);
                name_pods(&mut said);
                let found = scan::containers(&me.dir);
                *me.scanned.lock().unwrap_or_else(PoisonError::into_inner) = found;
            }
        });
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

//! Finding the regions of a node's containers the way HAMi's monitor does:
//! `{root}/containers/{podUID}_{container}/*.cache`. HAMi's device plugin
//! makes one such directory per container and mounts it into the
//! container, where the library creates its region file.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use crate::snapshot::Owner;

/// HAMi's default `HOOK_PATH`.
pub const DEFAULT_ROOT: &str = "/usr/local/vgpu";

/// A region file found under a containers directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The file.
    pub path: PathBuf,
    /// Whose it is, from its directory's name.
    pub owner: Owner,
}

/// The containers directory: `$HAMI_VGPU_CACHE_ROOT` when set (as HAMi's
/// monitor), else `{root}/containers`.
pub fn containers_dir(root: &Path) -> PathBuf {
    std::env::var_os("HAMI_VGPU_CACHE_ROOT")
        .filter(|v| !v.is_empty())
        .map_or_else(|| root.join("containers"), PathBuf::from)
}

/// Every `*.cache` file in `{dir}/*_*/`, sorted by path. A directory that
/// cannot be read is skipped (a container going away).
pub fn containers(dir: &Path) -> Vec<Found> {
    let Ok(dirs) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for dir in dirs.flatten() {
        let name = dir.file_name();
        let Some(owner) = name.to_str().and_then(owner_of) else {
            continue;
        };
        // (DirEntry::file_type does not follow a link: one planted as a
        // container directory or a region is skipped.)
        if !dir.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(dir.path()) else {
            continue;
        };
        for f in files.flatten() {
            let is_cache = f
                .file_name()
                .to_str()
                .is_some_and(|n| n.ends_with(".cache"));
            if is_cache && f.file_type().is_ok_and(|t| t.is_file()) {
                found.push(Found {
                    path: f.path(),
                    owner: owner.clone(),
                });
            }
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    found
}

/// `{podUID}_{container}`: a pod UID has no `_`, a container name cannot
/// have one (DNS-1123). Without a pod list the pod is named by its UID.
pub fn owner_of(dir_name: &str) -> Option<Owner> {
    let (uid, container) = dir_name.split_once('_')?;
    if uid.is_empty() || container.is_empty() {
        return None;
    }
    Some(Owner {
        namespace: String::new(),
        pod: uid.to_string(),
        pod_uid: uid.to_string(),
        container: container.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_names_split_into_pod_uid_and_container() {
        let o = owner_of("6f1c2d3e-aaaa-bbbb-cccc-0123456789ab_trainer").unwrap();
        assert_eq!(o.pod_uid, "6f1c2d3e-aaaa-bbbb-cccc-0123456789ab");
        assert_eq!(o.pod, o.pod_uid);
        assert_eq!(o.container, "trainer");
        assert_eq!(owner_of("no-underscore"), None);
        assert_eq!(owner_of("_c"), None);
        assert_eq!(owner_of("uid_"), None);
    }

    #[test]
    fn only_cache_files_in_container_dirs_are_found() {
        let root = tempfile::tempdir().unwrap();
        let c = root.path().join("containers");
        for d in ["u1_a", "u2_b", "stray"] {
            std::fs::create_dir_all(c.join(d)).unwrap();
        }
        std::fs::write(c.join("u1_a/x.cache"), b"").unwrap();
        std::fs::write(c.join("u1_a/notes.txt"), b"").unwrap();
        std::fs::write(c.join("u2_b/y.cache"), b"").unwrap();
        std::fs::write(c.join("stray/z.cache"), b"").unwrap();
        std::os::unix::fs::symlink(c.join("u2_b"), c.join("u3_link")).unwrap();
        std::os::unix::fs::symlink(c.join("u2_b/y.cache"), c.join("u1_a/l.cache")).unwrap();
        let found = containers(&c);
        let names: Vec<(String, String)> = found
            .iter()
            .map(|f| {
                (
                    f.path.strip_prefix(&c).unwrap().display().to_string(),
                    f.owner.container.clone(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("u1_a/x.cache".to_string(), "a".to_string()),
                ("u2_b/y.cache".to_string(), "b".to_string())
            ]
        );
        assert!(containers(&root.path().join("missing")).is_empty());
        assert_eq!(containers_dir(root.path()), c);
    }
}

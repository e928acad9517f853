//! Finding the regions of a node's containers the way the node monitors do,
//! in both layouts:
//! - HAMi's: `{root}/containers/{podUID}_{container}/*.cache` (its device
//!   plugin makes the directory and mounts it at the library's directory);
//! - Volcano's: `{root}/vgpu/containers/{podUID}_{container}/{uuid}.cache`
//!   (its plugin makes `{HOOK_PATH}/vgpu/containers/...` on the node and
//!   mounts it at `/tmp/vgpu` in the container; its monitor takes any name
//!   containing `.cache`).
//!
//! With `HOOK_PATH=/usr/local/vgpu` for both, one `--root` finds both.
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

/// The containers directories: `$HAMI_VGPU_CACHE_ROOT` when set (as HAMi's
/// monitor), else `{root}/containers` (HAMi's layout) and
/// `{root}/vgpu/containers` (Volcano's).
pub fn containers_dirs(root: &Path) -> Vec<PathBuf> {
    match std::env::var_os("HAMI_VGPU_CACHE_ROOT").filter(|v| !v.is_empty()) {
        Some(dir) => vec![PathBuf::from(dir)],
        None => vec![
            root.join("containers"),
            root.join("vgpu").join("containers"),
        ],
    }
}

/// Whether a file name is a region's, as the monitors take them: HAMi's
/// wants `*.cache`, Volcano's any name containing `.cache`.
fn is_region_name(name: &str) -> bool {
    name.contains(".cache")
}

/// Every region file in `{dir}/*_*/` for each of `dirs`, sorted by path. A
/// directory that cannot be read is skipped (missing, or a container going
/// away).
pub fn containers(dirs: &[PathBuf]) -> Vec<Found> {
    let mut found = Vec::new();
    for dir in dirs {
        in_dir(dir, &mut found);
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    found.dedup_by(|a, b| a.path == b.path);
    found
}

fn in_dir(dir: &Path, found: &mut Vec<Found>) {
    let Ok(dirs) = std::fs::read_dir(dir) else {
        return;
    };
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
            let is_cache = f.file_name().to_str().is_some_and(is_region_name);
            if is_cache && f.file_type().is_ok_and(|t| t.is_file()) {
                found.push(Found {
                    path: f.path(),
                    owner: owner.clone(),
                });
            }
        }
    }
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
        let found = containers(std::slice::from_ref(&c));
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
        assert!(containers(&[root.path().join("missing")]).is_empty());
        assert_eq!(containers_dirs(root.path())[0], c);
    }

    #[test]
    fn hami_and_volcano_layouts_are_found_under_one_root() {
        let root = tempfile::tempdir().unwrap();
        let hami = root.path().join("containers/u1_a");
        // Volcano: {HOOK_PATH}/vgpu/containers/{uid}_{ctr}/{uuid}.cache,
        // beside the library (which is no region).
        let volcano = root.path().join("vgpu/containers/u2_b");
        std::fs::create_dir_all(&hami).unwrap();
        std::fs::create_dir_all(&volcano).unwrap();
        std::fs::write(hami.join("x.cache"), b"").unwrap();
        std::fs::write(volcano.join("0b7e-42.cache"), b"").unwrap();
        std::fs::write(root.path().join("vgpu/libvgpu.so"), b"").unwrap();
        let found = containers(&containers_dirs(root.path()));
        let owners: Vec<(&str, &str)> = found
            .iter()
            .map(|f| (f.owner.pod_uid.as_str(), f.owner.container.as_str()))
            .collect();
        assert_eq!(owners, [("u1", "a"), ("u2", "b")]);
        assert_eq!(found[1].path, volcano.join("0b7e-42.cache"));
        // Volcano's root given itself still works.
        let v = containers(&containers_dirs(&root.path().join("vgpu")));
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].owner.container, "b");
    }
}

//! Pod names kept current without weighing on the API server: one LIST of
//! this node's pods (`fieldSelector=spec.nodeName`), then a WATCH from the
//! list's resourceVersion, renewed from the last version seen when the
//! server ends it (every `WATCH_S`). A new LIST happens only when the
//! version is gone (410) or the watch fails, with a backoff. On a
//! 1000-node cluster that is a few requests a second in all, where a LIST
//! every 5 s per node was 200. The token is read again for every request
//! (`pods::Source::get`).

use std::io::{BufRead, BufReader, Read};
use std::time::Duration;

use super::pods::{PodNames, Source, pod_entry};

/// How long the server keeps one watch open, seconds.
pub const WATCH_S: u64 = 300;
/// The most one watch stream may carry before it is renewed.
const MAX_STREAM: u64 = 256 << 20;
/// The longest pause between attempts after failures.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How a watch ended.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// The server closed it: watch again from the last version.
    Closed,
    /// The version is too old (410): list again.
    Gone,
}

/// Lists once now (so the first scrape has names), then keeps the names
/// current on a thread of its own. Err: why the first list failed (the
/// thread keeps trying).
pub fn start(source: Source, names: PodNames) -> Result<(), String> {
    let first = names.refresh(&source);
    let said = first.as_ref().err().cloned();
    let rv = first.as_ref().ok().cloned();
    std::thread::spawn(move || run(&source, &names, rv, said));
    first.map(|_| ())
}

fn run(source: &Source, names: &PodNames, mut rv: Option<String>, mut said: Option<String>) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let version = match rv.take() {
            Some(v) => v,
            None => match names.refresh(source) {
                Ok(v) => v,
                Err(e) => {
                    names.set_synced(false);
                    if said.as_ref() != Some(&e) {
                        eprintln!(
                            "vgpuctl serve: pod list unreadable, keeping the last names: {e}"
                        );
                        said = Some(e);
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            },
        };
        said = None;
        let mut version = version;
        match watch_once(source, names, &mut version) {
            Ok(End::Closed) => {
                backoff = Duration::from_secs(1);
                rv = Some(version);
            }
            Ok(End::Gone) => {}
            Err(e) => {
                names.set_synced(false);
                eprintln!("vgpuctl serve: pod watch failed, listing again: {e}");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// One watch from `rv`, applying its events; `rv` follows them.
pub fn watch_once(source: &Source, names: &PodNames, rv: &mut String) -> Result<End, String> {
    let url = source.url(&format!(
        "watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds={WATCH_S}"
    ));
    let resp = source.get(&url, true)?;
    let reader = BufReader::new(resp.into_body().into_reader().take(MAX_STREAM));
    for line in reader.lines() {
        let line = line.map_err(|e| format!("{url}: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        if let Some(end) = apply(names, &line, rv)? {
            return Ok(end);
        }
    }
    names.set_synced(true);
    Ok(End::Closed)
}

/// Applies one watch event (a JSON line); Some when it ends the watch.
pub fn apply(names: &PodNames, line: &str, rv: &mut String) -> Result<Option<End>, String> {
    let ev: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("not a watch event: {e}"))?;
    let object = &ev["object"];
    let kind = ev["type"].as_str().unwrap_or_default();
    if kind == "ERROR" {
        return match object["code"].as_i64() {
            Some(410) => Ok(Some(End::Gone)),
            _ => Err(format!("the watch sent an error: {object}")),
        };
    }
    if let Some(v) = object["metadata"]["resourceVersion"].as_str() {
        v.clone_into(rv);
    }
    match kind {
        "ADDED" | "MODIFIED" => {
            if let Some((uid, e)) = pod_entry(object) {
                names.apply(uid, Some(e));
            }
        }
        "DELETED" => {
            if let Some(uid) = object["metadata"]["uid"].as_str() {
                names.apply(uid.to_string(), None);
            }
        }
        "BOOKMARK" => {}
        other => return Err(format!("unknown watch event type {other:?}")),
    }
    names.set_synced(true);
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_add_rename_and_delete_pods_and_move_the_version() {
        let names = PodNames::default();
        let mut rv = "10".to_string();
        let add = r#"{"type":"ADDED","object":{"metadata":{"uid":"u1","namespace":"ml","name":"a","resourceVersion":"11"}}}"#;
        assert_eq!(apply(&names, add, &mut rv), Ok(None));
        assert_eq!(rv, "11");
        assert_eq!(names.listed("u1", Duration::from_secs(5)), Some(true));
        let mut o = crate::scan::owner_of("u1_main").unwrap();
        names.name(&mut o);
        assert_eq!(o.pod, "a");
        let bm = r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"15"}}}"#;
        assert_eq!(apply(&names, bm, &mut rv), Ok(None));
        assert_eq!(rv, "15");
        let del = r#"{"type":"DELETED","object":{"metadata":{"uid":"u1","namespace":"ml","name":"a","resourceVersion":"16"}}}"#;
        assert_eq!(apply(&names, del, &mut rv), Ok(None));
        assert_eq!(names.listed("u1", Duration::from_secs(5)), Some(false));
        let gone = r#"{"type":"ERROR","object":{"kind":"Status","code":410}}"#;
        assert_eq!(apply(&names, gone, &mut rv), Ok(Some(End::Gone)));
        assert!(apply(&names, r#"{"type":"ERROR","object":{"code":500}}"#, &mut rv).is_err());
        assert!(apply(&names, "<html>", &mut rv).is_err());
        names.set_synced(false);
        assert_eq!(names.listed("u1", Duration::from_secs(5)), None);
    }
}

//! `vgpuctl serve` against a fake API server on 127.0.0.1: one LIST, then
//! watches from the list's resourceVersion (never a LIST per rescan), the
//! token file read again, pod names in the metrics and in `vgpuctl status`,
//! and housekeeping removing the directory of a pod the watch deletes.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// This binary's own copy (tests/common: cargo relinks
/// `target/debug/vgpuctl` whenever another test binary's rig builds).
fn vgpuctl() -> &'static Path {
    &common::artifacts().vgpuctl
}

/// What the fake server saw: (query, authorization) of every request.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

const LIST: &str = r#"{"kind":"PodList","metadata":{"resourceVersion":"100"},"items":[
  {"metadata":{"uid":"u1","namespace":"ml","name":"trainer-0"}},
  {"metadata":{"uid":"u2","namespace":"ml","name":"side-0"}}]}"#;

fn serve_one(mut s: TcpStream, seen: &Seen, watches: &mut u32) {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut first = String::new();
    r.read_line(&mut first).unwrap();
    let mut auth = String::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap() == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("authorization")
        {
            auth = v.trim().to_string();
        }
    }
    let query = first.split_whitespace().nth(1).unwrap_or("").to_string();
    seen.lock().unwrap().push((query.clone(), auth));
    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n";
    if !query.contains("watch=1") {
        let _ = write!(s, "{head}Content-Length: {}\r\n\r\n{LIST}", LIST.len());
        return;
    }
    *watches += 1;
    let _ = write!(s, "{head}\r\n");
    if *watches == 1 {
        let _ = writeln!(
            s,
            r#"{{"type":"BOOKMARK","object":{{"metadata":{{"resourceVersion":"101"}}}}}}"#
        );
        std::thread::sleep(Duration::from_millis(500));
        let _ = writeln!(
            s,
            r#"{{"type":"DELETED","object":{{"metadata":{{"uid":"u1","namespace":"ml","name":"trainer-0","resourceVersion":"102"}}}}}}"#
        );
    }
    let _ = s.flush();
    std::thread::sleep(Duration::from_millis(1500));
}

/// A fake API server; its base URL and what it saw.
fn fake_api() -> (String, Seen) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let seen: Seen = Arc::default();
    let s2 = seen.clone();
    std::thread::spawn(move || {
        let mut watches = 0;
        for s in l.incoming().flatten() {
            serve_one(s, &s2, &mut watches);
        }
    });
    (url, seen)
}

/// A HAMi-core file (layout 1.2, one device, no process).
fn region(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let mut b = vec![0u8; 2_008_952];
    b[0..4].copy_from_slice(&19_920_718i32.to_le_bytes());
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    b[8..12].copy_from_slice(&2u32.to_le_bytes());
    b[56..64].copy_from_slice(&1u64.to_le_bytes());
    let uuid = b"GPU-00000000-1111-2222-3333-444444444444";
    b[64..64 + uuid.len()].copy_from_slice(uuid);
    std::fs::write(dir.join("r.cache"), b).unwrap();
}

fn metrics(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn wait_until(secs: f64, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed().as_secs_f64() < secs {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn one_list_then_watches_names_pods_and_gone_pods_are_cleaned_up() {
    // The rig first (it may wait for another binary's build): the holder
    // below maps its region for a bounded time.
    let vgpuctl = vgpuctl();
    let (api, seen) = fake_api();
    let root = tempfile::tempdir().unwrap();
    let c = root.path().join("containers");
    region(&c.join("u1_main"));
    region(&c.join("u2_side"));
    // A pod the list never had, whose region a live process maps: it stays.
    region(&c.join("u3_held"));
    let held = c.join("u3_held/r.cache");
    let code = "import mmap,sys,time; f=open(sys.argv[1],'r+b'); m=mmap.mmap(f.fileno(),0); print('mapped',flush=True); time.sleep(300)";
    let mut holder = Kill(
        Command::new("python3")
            .args(["-c", code])
            .arg(&held)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut l = String::new();
    BufReader::new(holder.0.stdout.take().unwrap())
        .read_line(&mut l)
        .unwrap();
    assert_eq!(l.trim(), "mapped");
    let token = root.path().join("token");
    std::fs::write(&token, "t1\n").unwrap();
    let mut child = Kill(
        Command::new(vgpuctl)
            .args(["serve", "--listen", "127.0.0.1:0", "--rescan", "0.2"])
            .args([
                "--housekeeping-grace",
                "0",
                "--housekeeping-interval",
                "0.2",
            ])
            .arg("--root")
            .arg(root.path())
            .args(["--api-server", &api, "--nvml", "/nonexistent/libnvml.so"])
            .env("VGPU_API_TOKEN_FILE", &token)
            .env("NODE_NAME", "node-7")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap()
        .to_string();
    // The first scrape has the names (listed before serving).
    let m = metrics(&addr);
    assert!(m.contains(r#"pod="trainer-0""#), "{m}");
    assert!(m.contains(r#"namespace="ml""#), "{m}");
    std::fs::write(&token, "t2\n").unwrap();
    // The watch deletes u1: housekeeping removes its directory, not u2's.
    assert!(wait_until(10.0, || !c.join("u1_main").exists()));
    // Several watches, and at least one with the token as rewritten (on a
    // loaded machine the first watch may already carry it).
    assert!(
        wait_until(10.0, || {
            let seen = seen.lock().unwrap();
            seen.iter().any(|(_, a)| a == "Bearer t2")
                && seen.iter().filter(|(q, _)| q.contains("watch=1")).count() >= 2
        }),
        "{:?}",
        seen.lock().unwrap()
    );
    assert!(c.join("u2_side/r.cache").exists());
    assert!(held.exists(), "a mapped region was removed");
    drop(holder);
    let seen = seen.lock().unwrap().clone();
    let lists: Vec<_> = seen
        .iter()
        .filter(|(q, _)| !q.contains("watch=1"))
        .collect();
    let watches: Vec<_> = seen.iter().filter(|(q, _)| q.contains("watch=1")).collect();
    // Dozens of rescans: one LIST (the old lister listed at every one).
    assert_eq!(lists.len(), 1, "{seen:?}");
    assert!(watches.len() >= 2, "{seen:?}");
    assert!(watches[0].0.contains("resourceVersion=100"), "{seen:?}");
    assert!(watches[1].0.contains("resourceVersion=102"), "{seen:?}");
    assert!(
        seen.iter()
            .all(|(q, _)| q.contains("fieldSelector=spec.nodeName%3Dnode-7")),
        "{seen:?}"
    );
    assert_eq!(seen[0].1, "Bearer t1");
    let m = metrics(&addr);
    assert!(!m.contains(r#"pod="trainer-0""#), "{m}");
    assert!(m.contains(r#"pod="side-0""#), "{m}");
}

#[test]
fn without_a_pod_list_a_young_region_stays() {
    let root = tempfile::tempdir().unwrap();
    let c = root.path().join("containers");
    region(&c.join("u1_main"));
    let mut child = Kill(
        Command::new(vgpuctl())
            .args(["serve", "--listen", "127.0.0.1:0", "--rescan", "0.2"])
            .args([
                "--housekeeping-grace",
                "0",
                "--housekeeping-interval",
                "0.2",
            ])
            .arg("--root")
            .arg(root.path())
            .args(["--nvml", "/nonexistent/libnvml.so"])
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(c.join("u1_main/r.cache").exists());
}

#[test]
fn status_names_pods_from_the_api_server() {
    let (api, _seen) = fake_api();
    let root = tempfile::tempdir().unwrap();
    region(&root.path().join("containers/u1_main"));
    let out = Command::new(vgpuctl())
        .args(["status", "--json", "--api-server", &api, "--root"])
        .arg(root.path())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let owner = &v["regions"][0]["owner"];
    assert_eq!(owner["pod"], "trainer-0", "{v}");
    assert_eq!(owner["namespace"], "ml", "{v}");
    assert_eq!(owner["pod_uid"], "u1", "{v}");
}

//! `vgpuctl`'s commands on live regions of the simulated GPU and on a
//! HAMi-core file: the table, the JSON schema (docs/vgpuctl.md), `watch`,
//! `usage`, completions, and clear errors.

mod common;

use std::path::Path;
use std::process::Stdio;

use common::*;

/// A container of one process holding 100 MiB under a 2 GiB, 30 % limit;
/// returns the machine and the holder.
fn holding() -> (Sim, std::process::Child) {
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "2g")
        .set("CUDA_DEVICE_SM_LIMIT", "30");
    let mut p = sim
        .client_cmd(Path3::Link, true, &["hold", &(100 * MIB).to_string(), "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(p.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "hold_rc=0");
    (sim, p)
}

fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

#[test]
fn status_json_follows_the_documented_schema() {
    let (sim, mut p) = holding();
    let s = sim.status(&sim.region());
    p.kill().unwrap();
    p.wait().unwrap();
    let d = &s["devices"][0];
    let proc = &s["processes"][0];
    let pd = &proc["devices"][0];
    assert_eq!(s["format"], "vgpu");
    assert_eq!(s["path"], sim.region().to_str().unwrap());
    assert_eq!(d["memory_limit_bytes"], 2 * GIB);
    assert_eq!(d["sm_limit_percent"], 30);
    assert_eq!(d["policy"], "default");
    assert_eq!(d["total_memory_bytes"], 8 * GIB);
    assert_eq!(d["used_bytes"], 356 * MIB);
    assert_eq!(d["oom_denials"], 0);
    assert_eq!(proc["pid"], p.id());
    assert_eq!(proc["alive"], "yes");
    assert_eq!(pd["used_bytes"], 356 * MIB);
    assert_eq!(pd["buffer_bytes"], 100 * MIB);
    assert_eq!(pd["by_kind"]["buffer"], 100 * MIB);
    assert_eq!(pd["context_bytes"], 256 * MIB);
    // The HAMi part that node monitors read: its numbering and fields.
    assert_eq!(d["vdevice_index"], 0);
    assert_eq!(s["hami"]["priority"], 1);
    assert_eq!(
        s["hami"]["recent_kernel"].as_i64().map(|k| k >= 0),
        Some(true)
    );
    assert!(pd["nvml_used_bytes"].is_u64());
    // An SM limit chose the container's turns on the device.
    assert_eq!(d["turns"]["period_ms"], 100.0);
    // A limited container takes no rest.
    assert_eq!(d["sm_rest_percent"], 0);
    assert_eq!(d["turns"]["paused"], false);
    assert!((0.0..100.0).contains(&d["turns"]["phase_ms"].as_f64().unwrap()));
    // Every field is documented in docs/vgpuctl.md, and nothing else is
    // there: the schema and its documentation stay one.
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/vgpuctl.md")).unwrap();
    for object in [&s, d, proc, pd] {
        for k in keys(object) {
            assert!(doc.contains(&format!("| `{k}` |")), "{k} is not documented");
        }
    }
    assert_eq!(
        keys(d),
        [
            "bucket_scale",
            "context_estimate_bytes",
            "counted_bytes",
            "index",
            "launches_throttled",
            "leader_pid",
            "memory_limit_bytes",
            "oom_denials",
            "policy",
            "sm_limit_percent",
            "sm_rest_percent",
            "throttled_seconds",
            "total_memory_bytes",
            "turns",
            "used_bytes",
            "utilization_percent",
            "uuid",
            "vdevice_index"
        ]
    );
}

#[test]
fn the_table_shows_devices_limits_and_processes() {
    let (sim, mut p) = holding();
    let r = sim.ctl(&["status", sim.region().to_str().unwrap()]).ok();
    let usage = sim.region_used(0);
    p.kill().unwrap();
    p.wait().unwrap();
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(
        lines[0].starts_with(sim.region().to_str().unwrap()),
        "{}",
        r.stdout
    );
    assert!(lines[0].contains("vgpu layout 2."), "{}", r.stdout);
    assert!(lines[1].split_whitespace().eq([
        "DEV",
        "UUID",
        "MEM",
        "LIMIT",
        "USED",
        "SM",
        "LIMIT",
        "UTIL",
        "SCALE",
        "THROTTLED",
        "WAITED",
        "OOM",
        "LEADER"
    ]));
    let dev: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(&dev[2..8], ["2.00", "GiB", "356.0", "MiB", "30%", "0.0%"]);
    let proc: Vec<&str> = lines[4].split_whitespace().collect();
    assert_eq!(proc[1], p.id().to_string());
    assert_eq!(proc[3], "yes");
    assert_eq!(usage, 356 * MIB, "usage prints the bytes alone");
}

#[test]
fn watch_redraws_and_stops_after_count() {
    let (sim, mut p) = holding();
    let r = sim
        .ctl(&[
            "watch",
            "--interval",
            "0.1",
            "--count",
            "3",
            sim.region().to_str().unwrap(),
        ])
        .ok();
    p.kill().unwrap();
    p.wait().unwrap();
    let frames = r.stdout.matches("vgpu layout").count();
    assert_eq!(frames, 3, "{}", r.stdout);
}

#[test]
fn a_hami_core_file_and_a_containers_tree_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let containers = dir.path().join("containers");
    let hami = containers.join("uid-1_main/usage.cache");
    std::fs::create_dir_all(hami.parent().unwrap()).unwrap();
    let bytes = write_hami_core_file(&hami, 1_700_000_000);
    let junk = containers.join("uid-2_side/usage.cache");
    std::fs::create_dir_all(junk.parent().unwrap()).unwrap();
    std::fs::write(&junk, b"\0\0\0\0 no region").unwrap();

    let out = std::process::Command::new(&artifacts().vgpuctl)
        .args(["status", "--json", "--root"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &v["regions"][0];
    assert_eq!(s["format"], "hami");
    assert_eq!(s["layout_version"], "1.2");
    assert_eq!(s["owner"]["pod_uid"], "uid-1");
    assert_eq!(s["owner"]["container"], "main");
    assert_eq!(s["hami"]["priority"], 0);
    assert_eq!(s["hami"]["recent_kernel"], -1);
    assert_eq!(s["hami"]["utilization_switch"], 1);
    assert_eq!(s["hami"]["last_kernel_time"], 1_700_000_000u64);
    assert_eq!(
        s["devices"][0]["uuid"],
        "GPU-11111111-2222-3333-4444-555555555555"
    );
    assert_eq!(s["devices"][0]["memory_limit_bytes"], 3 * GIB);
    assert_eq!(s["devices"][0]["used_bytes"], 1500 * MIB);
    assert_eq!(s["devices"][0]["utilization_percent"], 35.0);
    assert_eq!(s["processes"][1]["host_pid"], 5101);
    assert_eq!(
        s["processes"][0]["devices"][0]["nvml_used_bytes"],
        1010 * MIB
    );
    assert!(s["slots_reclaimed"].is_null() && s["devices"][0]["oom_denials"].is_null());
    assert_eq!(v["errors"][0]["path"], junk.to_str().unwrap());
    assert_eq!(v["regions"].as_array().unwrap().len(), 1);
    // Named directly, the same file reads the same; it was never written.
    let table = std::process::Command::new(&artifacts().vgpuctl)
        .arg("status")
        .arg(&hami)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("HAMi-core layout 1.2") && table.contains("priority 0"),
        "{table}"
    );
    assert_eq!(std::fs::read(&hami).unwrap(), bytes);
}

#[test]
fn unreadable_regions_are_errors_that_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], &str); 3] = [
        ("junk.cache", &[7u8; 64], "wrong magic"),
        ("short.cache", b"VGPU", "shorter than a region header"),
        (
            "hami-v0.cache",
            &{
                let mut b = vec![0u8; 4096];
                b[..4].copy_from_slice(&19920718i32.to_le_bytes());
                b
            },
            "HAMi-core region of layout 0.0 (4096 bytes)",
        ),
    ];
    for (name, bytes, why) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let out = std::process::Command::new(&artifacts().vgpuctl)
            .arg("status")
            .arg(&p)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}");
        assert!(
            err.contains(p.to_str().unwrap()) && err.contains(why),
            "{name}: {err}"
        );
        assert_eq!(std::fs::read(&p).unwrap(), bytes, "{name} untouched");
    }
    let missing = dir.path().join("missing.cache");
    let out = std::process::Command::new(&artifacts().vgpuctl)
        .args(["usage"])
        .arg(&missing)
        .arg("0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!Path::new(&missing).exists(), "never created");
}

#[test]
fn completions_cover_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let out = std::process::Command::new(&artifacts().vgpuctl)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success());
        let script = String::from_utf8_lossy(&out.stdout);
        for sub in [
            "status",
            "watch",
            "usage",
            "reclaim",
            "serve",
            "oversub",
            "completions",
        ] {
            assert!(script.contains(sub), "{shell}: no {sub}");
        }
    }
}

/// `turns.placed` is the leader's word while it runs: true for three
/// containers placed from the node's SM board (20 + 30 + 50 %, 1 ms
/// kernels back to back), false once they exited and their heartbeats
/// stopped, though the flag stays in each region as its last leader set
/// it.
#[test]
fn turns_show_placed_while_their_leader_runs_and_not_after() {
    let mut sim = Sim::new(1, "8g");
    let board = sim.dir.path().join("vgpulock");
    std::fs::create_dir(&board).unwrap();
    sim.set("VGPU_SM_BOARD_DIR", board.to_str().unwrap());
    let members = [("a", "20"), ("b", "30"), ("c", "50")];
    let region = |n: &str| sim.dir.path().join(format!("{n}.cache"));
    let children: Vec<std::process::Child> = members
        .iter()
        .map(|&(n, limit)| {
            sim.client_cmd(
                Path3::ProcAddr,
                true,
                &["spin", "1000000", "132", "11", "kernel"],
            )
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region(n))
            .env("CUDA_DEVICE_SM_LIMIT", limit)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
        })
        .collect();
    let all = || -> Vec<Option<serde_json::Value>> {
        members
            .iter()
            .map(|&(n, _)| {
                sim.try_status(&region(n))
                    .map(|s| s["devices"][0]["turns"]["placed"].clone())
            })
            .collect()
    };
    let seen = wait_until(10.0, || all().iter().all(|p| p == &Some(true.into())));
    let during = all();
    for mut c in children {
        c.wait().unwrap();
    }
    assert!(seen, "not all placed while running: {during:?}");
    // (At once in our pid namespace; by a stale heartbeat, 3 s, in another.)
    let cleared = wait_until(5.0, || all().iter().all(|p| p == &Some(false.into())));
    assert!(cleared, "placed after their leaders exited: {:?}", all());
}

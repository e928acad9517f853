//! The Kubernetes files in deploy/ hold together: every manifest parses,
//! the fields that make them work agree with each other (host paths,
//! mounts, ports, labels and selectors), the exporter's arguments are
//! arguments `vgpuctl` accepts, the Helm values set what the charts read,
//! and the installer script installs, keeps and restores as documented.
//! (.ci/run also validates the manifests against Kubernetes' schemas.)

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use serde_yaml_ng::Value;
use vgpuctl::cli::{Cli, Command as Sub};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every document of a YAML file.
fn docs(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(deploy().join(name)).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{name}: {e}")))
        .collect()
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

/// A label map as a sorted map.
fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .unwrap_or_else(|| panic!("not a map: {v:?}"))
        .iter()
        .map(|(k, v)| (s(k).to_string(), s(v).to_string()))
        .collect()
}

/// Whether every label of `selector` is in `target`.
fn selects(selector: &Value, target: &Value) -> bool {
    let target = labels(target);
    let selector = labels(selector);
    !selector.is_empty() && selector.iter().all(|(k, v)| target.get(k) == Some(v))
}

/// The hostPath of the pod volume mounted at `mount` in the first
/// container, and whether the mount is read-only.
fn host_path_at(pod: &Value, mount: &str) -> (String, bool) {
    let m = pod["containers"][0]["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == mount)
        .unwrap_or_else(|| panic!("nothing mounted at {mount}"));
    let vol = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == m["name"])
        .unwrap();
    (
        s(&vol["hostPath"]["path"]).to_string(),
        m["readOnly"].as_bool().unwrap_or(false),
    )
}

fn every_manifest() -> Vec<(String, Vec<Value>)> {
    ["vgpu-installer.yaml", "vgpu-exporter.yaml"]
        .iter()
        .map(|n| (n.to_string(), docs(n)))
        .collect()
}

#[test]
fn each_workload_selects_its_own_pods_in_one_namespace() {
    for (name, docs) in every_manifest() {
        let cluster_scoped = ["Namespace", "ClusterRole", "ClusterRoleBinding"];
        for d in docs
            .iter()
            .filter(|d| !cluster_scoped.iter().any(|k| d["kind"] == *k))
        {
            assert_eq!(d["metadata"]["namespace"], "vgpu-system", "{name}");
            if d["kind"] == "DaemonSet" {
                assert!(
                    selects(
                        &d["spec"]["selector"]["matchLabels"],
                        &d["spec"]["template"]["metadata"]["labels"]
                    ),
                    "{name}: the DaemonSet's selector misses its pods"
                );
                let image = s(&d["spec"]["template"]["spec"]["containers"][0]["image"]);
                assert_eq!(image, "registry.example.com/vgpu/vgpu:0.1.0", "{name}");
            }
        }
    }
    let ns = kind(&docs("vgpu-installer.yaml"), "Namespace").clone();
    assert_eq!(ns["metadata"]["name"], "vgpu-system");
}

#[test]
fn the_installer_writes_the_host_directory_the_device_plugins_mount() {
    let docs = docs("vgpu-installer.yaml");
    let ds = kind(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let (host, read_only) = host_path_at(pod, "/host/usr/local/vgpu");
    // HAMi's gpuHookPath /usr/local + /vgpu, and Volcano's HOOK_PATH.
    assert_eq!(host, "/usr/local/vgpu");
    assert!(!read_only);
    assert_eq!(pod["volumes"][0]["hostPath"]["type"], "DirectoryOrCreate");
    let args = s(&pod["containers"][0]["args"][0]);
    assert!(
        args.contains("/vgpu/install.sh \"$VGPU_MODE\" /host/usr/local/vgpu /vgpu/libvgpu.so"),
        "{args}"
    );
    let env = pod["containers"][0]["env"].as_sequence().unwrap();
    assert!(
        env.iter()
            .any(|e| e["name"] == "VGPU_MODE" && e["value"] == "keep")
    );
    // The image puts the script and the library where the command looks.
    let dockerfile = std::fs::read_to_string(deploy().join("image/Dockerfile")).unwrap();
    for line in [
        "/vgpu/libvgpu.so",
        "COPY deploy/install.sh /vgpu/install.sh",
        "/vgpu/vgpuctl",
    ] {
        assert!(dockerfile.contains(line), "Dockerfile lacks {line}");
    }
    // The line the installer writes into ld.so.preload is the repo's.
    let preload = std::fs::read_to_string(deploy().join("../ld.so.preload")).unwrap();
    let script = std::fs::read_to_string(deploy().join("install.sh")).unwrap();
    assert!(script.contains(&format!(
        "PRELOAD_LINE=${{VGPU_PRELOAD_LINE:-{}}}",
        preload.trim()
    )));
}

#[test]
fn the_exporter_service_and_monitor_point_at_one_port() {
    let docs = docs("vgpu-exporter.yaml");
    let ds = kind(&docs, "DaemonSet");
    let svc = kind(&docs, "Service");
    let mon = kind(&docs, "ServiceMonitor");
    let pod = &ds["spec"]["template"]["spec"];
    let ctr = &pod["containers"][0];

    // The arguments are vgpuctl's, and name what the pod mounts.
    let args: Vec<String> = ctr["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| s(a).to_string())
        .collect();
    let cli = Cli::try_parse_from(std::iter::once("vgpuctl".to_string()).chain(args))
        .unwrap_or_else(|e| panic!("vgpuctl rejects the exporter's arguments: {e}"));
    let Sub::Serve(serve) = cli.command else {
        panic!("the exporter does not run `serve`")
    };
    let (host, read_only) = host_path_at(pod, serve.root.to_str().unwrap());
    assert_eq!(host, "/usr/local/vgpu");
    assert!(read_only, "the exporter must not be able to write regions");
    assert_eq!(pod["hostPID"], true);
    // The oversubscription board it reads is the node's, read-only.
    let board = serve
        .oversub_dir
        .expect("the exporter names the board's directory");
    let (host, read_only) = host_path_at(pod, board.to_str().unwrap());
    assert_eq!(host, "/run/vgpu-oversub");
    assert!(
        read_only,
        "the exporter must not be able to write the board"
    );

    let port = ctr["ports"][0].clone();
    assert_eq!(port["name"], "metrics");
    assert_eq!(
        port["containerPort"].as_u64(),
        Some(u64::from(serve.listen.port()))
    );
    assert_eq!(ctr["readinessProbe"]["httpGet"]["path"], "/healthz");

    assert!(selects(
        &svc["spec"]["selector"],
        &ds["spec"]["template"]["metadata"]["labels"]
    ));
    let sp = &svc["spec"]["ports"][0];
    assert_eq!(sp["targetPort"], "metrics");
    assert_eq!(sp["port"], port["containerPort"]);

    assert!(selects(
        &mon["spec"]["selector"]["matchLabels"],
        &svc["metadata"]["labels"]
    ));
    assert_eq!(mon["spec"]["endpoints"][0]["port"], sp["name"]);
    assert_eq!(mon["spec"]["endpoints"][0]["path"], "/metrics");
    let names = mon["spec"]["namespaceSelector"]["matchNames"]
        .as_sequence()
        .unwrap();
    assert!(names.iter().any(|n| *n == svc["metadata"]["namespace"]));
}

#[test]
fn the_helm_values_replace_only_the_plugin_images() {
    let hami = &docs("helm/hami-values.yaml")[0];
    let image = &hami["devicePlugin"]["image"];
    assert!(s(&image["tag"]).ends_with("-vgpu"));
    assert!(!s(&image["registry"]).is_empty() && !s(&image["repository"]).is_empty());
    assert_eq!(
        hami.as_mapping().unwrap().len(),
        1,
        "only devicePlugin is set"
    );
    assert_eq!(
        hami["devicePlugin"].as_mapping().unwrap().len(),
        1,
        "only its image"
    );
    let volcano = &docs("helm/volcano-values.yaml")[0];
    assert!(s(&volcano["image"]["tag"]).ends_with("-vgpu"));
    assert!(!s(&volcano["image"]["repository"]).is_empty());
    assert_eq!(volcano.as_mapping().unwrap().len(), 1, "only image is set");
    // The plugin image drops HAMi-core's library and keeps the lib
    // directory non-empty (both plugins' hooks copy `lib/nvidia/*`).
    let plugin = std::fs::read_to_string(deploy().join("image/Dockerfile.plugin")).unwrap();
    assert!(plugin.contains("rm -f /k8s-vgpu/lib/nvidia/libvgpu.so*"));
    assert!(plugin.contains("> /k8s-vgpu/lib/nvidia/VGPU-README"));
}

fn install(mode: &str, dir: &Path, lib: &Path) -> std::process::Output {
    let out = Command::new("sh")
        .arg(deploy().join("install.sh"))
        .arg(mode)
        .arg(dir)
        .arg(lib)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "install.sh {mode}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn inode(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().ino()
}

#[test]
fn the_installer_replaces_by_rename_and_restores_what_it_replaced() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("vgpu");
    std::fs::create_dir(&dir).unwrap();
    let lib = t.path().join("libvgpu.so");
    std::fs::write(&lib, b"vgpu's library").unwrap();
    // What HAMi's plugin left: its versioned library and its preload file.
    let hami = dir.join("libvgpu.so.v2.10.0");
    std::fs::write(&hami, b"HAMi-core").unwrap();
    let old_preload = "/usr/local/vgpu/libvgpu.so\n# hami\n";
    std::fs::write(dir.join("ld.so.preload"), old_preload).unwrap();
    let old_inode = inode(&hami);
    // A container that bind-mounted it, or a process that mapped it, holds it.
    let held = std::fs::File::open(&hami).unwrap();

    install("install", &dir, &lib);
    for f in ["libvgpu.so", "libvgpu.so.v2.10.0"] {
        assert_eq!(
            std::fs::read(dir.join(f)).unwrap(),
            b"vgpu's library",
            "{f}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("ld.so.preload")).unwrap(),
        "/usr/local/vgpu/libvgpu.so\n"
    );
    assert_ne!(inode(&hami), old_inode, "replaced, not rewritten");
    let mut kept = String::new();
    std::io::Read::read_to_string(&mut &held, &mut kept).unwrap();
    assert_eq!(
        kept, "HAMi-core",
        "the old file is untouched for whoever holds it"
    );
    let backup = dir.join(".vgpu-backup/libvgpu.so.v2.10.0");
    assert_eq!(inode(&backup), old_inode);

    // Again: nothing changes (same inode, nothing said).
    let now = inode(&dir.join("libvgpu.so"));
    let out = install("install", &dir, &lib);
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(inode(&dir.join("libvgpu.so")), now);

    // A plugin that copied its library back is undone by the next round;
    // the backup keeps the first thing replaced.
    std::fs::remove_file(&hami).unwrap();
    std::fs::write(&hami, b"HAMi-core again").unwrap();
    install("install", &dir, &lib);
    assert_eq!(std::fs::read(&hami).unwrap(), b"vgpu's library");
    assert_eq!(inode(&backup), old_inode);

    install("restore", &dir, &lib);
    assert_eq!(inode(&hami), old_inode);
    assert_eq!(std::fs::read(&hami).unwrap(), b"HAMi-core");
    assert!(!dir.join("libvgpu.so").exists(), "it was not there before");
    assert_eq!(
        std::fs::read_to_string(dir.join("ld.so.preload")).unwrap(),
        old_preload
    );
    assert!(!dir.join(".vgpu-backup").exists());
}

#[test]
fn the_installer_refuses_what_it_cannot_do() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().to_str().unwrap();
    for (args, why) in [
        (vec!["install", "/nonexistent-dir"], "is not a directory"),
        (vec!["frobnicate", dir], "unknown mode"),
        (vec!["install", dir, "/no/lib.so"], "no library to install"),
    ] {
        let out = Command::new("sh")
            .arg(deploy().join("install.sh"))
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{args:?}: {err}");
    }
}

#[test]
fn the_exporter_may_list_the_pods_of_its_node() {
    let docs = docs("vgpu-exporter.yaml");
    let pod = &kind(&docs, "DaemonSet")["spec"]["template"]["spec"];
    let account = s(&pod["serviceAccountName"]);
    let sa = kind(&docs, "ServiceAccount");
    assert_eq!(s(&sa["metadata"]["name"]), account);
    let binding = kind(&docs, "ClusterRoleBinding");
    let subject = &binding["subjects"][0];
    assert_eq!(
        (s(&subject["name"]), s(&subject["namespace"])),
        (account, s(&sa["metadata"]["namespace"]))
    );
    let role = kind(&docs, "ClusterRole");
    assert_eq!(s(&binding["roleRef"]["name"]), s(&role["metadata"]["name"]));
    let rule = &role["rules"][0];
    assert_eq!(rule["resources"][0], "pods");
    assert_eq!(rule["verbs"][0], "list");
    // NODE_NAME narrows the list to this node's pods (pods.rs).
    let env = pod["containers"][0]["env"].as_sequence().unwrap();
    assert!(
        env.iter().any(|e| e["name"] == "NODE_NAME"
            && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName")
    );
}

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
    [
        "vgpu-installer.yaml",
        "vgpu-exporter.yaml",
        "vgpu-alerts.yaml",
    ]
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
    // The host directory is mounted at /host + its host path (what
    // install.sh takes the line of ld.so.preload from), and installing
    // there writes the repo's line.
    assert_eq!(format!("/host{host}"), "/host/usr/local/vgpu");
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("host");
    let dir = root.join("usr/local/vgpu");
    std::fs::create_dir_all(&dir).unwrap();
    let lib = t.path().join("libvgpu.so");
    std::fs::write(&lib, b"vgpu").unwrap();
    install_under(&root, "install", &dir, &lib);
    let preload = std::fs::read_to_string(deploy().join("../ld.so.preload")).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("ld.so.preload")).unwrap(),
        preload
    );
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
    assert!(
        read_only,
        "the exporter must not be able to write the library"
    );
    // Both region trees are mounted at their own host paths, read-write
    // for housekeeping alone (it removes the directories of gone pods):
    // HAMi's plugin writes {gpuHookPath}/containers, Volcano's
    // HOOK_PATH/vgpu/containers with HOOK_PATH=/usr/local/vgpu; `--root`
    // scans both layouts.
    for tree in [
        "/usr/local/vgpu/containers",
        "/usr/local/vgpu/vgpu/containers",
    ] {
        assert!(
            Path::new(tree).starts_with(&host),
            "{tree} is not under the root"
        );
        let (at, read_only) = host_path_at(pod, tree);
        assert_eq!(at, tree, "{tree} is not mounted at its host path");
        assert!(
            !read_only,
            "housekeeping cannot remove gone pods' directories in {tree}"
        );
    }
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

/// Runs install.sh with the host's root mounted at `root`.
fn install_under(root: &Path, mode: &str, dir: &Path, lib: &Path) -> std::process::Output {
    let out = Command::new("sh")
        .arg(deploy().join("install.sh"))
        .arg(mode)
        .arg(dir)
        .arg(lib)
        .env("VGPU_HOST_ROOT", root)
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
    let root = t.path().join("host");
    let dir = root.join("usr/local/vgpu");
    std::fs::create_dir_all(&dir).unwrap();
    let lib = t.path().join("libvgpu.so");
    std::fs::write(&lib, b"vgpu's library").unwrap();
    let install = |mode: &str, dir: &Path, lib: &Path| install_under(&root, mode, dir, lib);
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
    let lib_path = t.path().join("libvgpu.so");
    std::fs::write(&lib_path, b"vgpu").unwrap();
    let lib = lib_path.to_str().unwrap();
    for (args, why) in [
        (vec!["install", "/nonexistent-dir"], "is not a directory"),
        (vec!["frobnicate", dir], "unknown mode"),
        (vec!["install", dir, "/no/lib.so"], "no library to install"),
        // Not under the host's root (/host): the path containers see is
        // unknown, and a wrong line in ld.so.preload leaves them unlimited.
        (
            vec!["install", dir, lib],
            "is not under VGPU_HOST_ROOT=/host",
        ),
        (vec!["keep", dir, lib], "is not under VGPU_HOST_ROOT=/host"),
    ] {
        let out = Command::new("sh")
            .arg(deploy().join("install.sh"))
            .args(&args)
            .env_remove("VGPU_HOST_ROOT")
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
    // One LIST, then a WATCH from its resourceVersion (podwatch.rs).
    assert_eq!(rule["verbs"][0], "list");
    assert_eq!(rule["verbs"][1], "watch");
    // NODE_NAME narrows the list to this node's pods (pods.rs).
    let env = pod["containers"][0]["env"].as_sequence().unwrap();
    assert!(
        env.iter().any(|e| e["name"] == "NODE_NAME"
            && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName")
    );
}

#[test]
fn with_a_non_default_hook_path_the_preload_line_names_the_installed_library() {
    // HAMi with global.gpuHookPath=/opt/hami: containers see the library
    // at /opt/hami/vgpu/libvgpu.so, the host's path.
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("host");
    let dir = root.join("opt/hami/vgpu");
    std::fs::create_dir_all(&dir).unwrap();
    let lib = t.path().join("libvgpu.so");
    std::fs::write(&lib, b"vgpu").unwrap();
    install_under(&root, "install", &dir, &lib);
    assert_eq!(
        std::fs::read_to_string(dir.join("ld.so.preload")).unwrap(),
        "/opt/hami/vgpu/libvgpu.so\n"
    );
    assert_eq!(std::fs::read(dir.join("libvgpu.so")).unwrap(), b"vgpu");
    // A trailing slash on either changes nothing.
    let mut r = root.into_os_string();
    r.push("/");
    let mut d = dir.clone().into_os_string();
    d.push("/");
    std::fs::remove_file(dir.join("ld.so.preload")).unwrap();
    install_under(Path::new(&r), "install", Path::new(&d), &lib);
    assert_eq!(
        std::fs::read_to_string(dir.join("ld.so.preload")).unwrap(),
        "/opt/hami/vgpu/libvgpu.so\n"
    );
}

/// Whether a node with `labels` and `taints` (key, effect) admits `pod`:
/// its nodeSelector, its required node affinity (terms ORed, expressions
/// ANDed; In, Exists) and its tolerations of NoSchedule/NoExecute taints.
fn runs_on(pod: &Value, labels: &[(&str, &str)], taints: &[(&str, &str)]) -> bool {
    let label = |k: &str| labels.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
    if let Some(sel) = pod["nodeSelector"].as_mapping()
        && !sel.iter().all(|(k, v)| label(s(k)) == Some(s(v)))
    {
        return false;
    }
    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    if let Some(terms) = terms.as_sequence() {
        let term_matches = |t: &Value| {
            t["matchExpressions"]
                .as_sequence()
                .unwrap()
                .iter()
                .all(|e| {
                    let have = label(s(&e["key"]));
                    match s(&e["operator"]) {
                        "In" => e["values"]
                            .as_sequence()
                            .unwrap()
                            .iter()
                            .any(|v| have == Some(s(v))),
                        "Exists" => have.is_some(),
                        op => panic!("operator {op} is not modelled here"),
                    }
                })
        };
        if !terms.iter().any(term_matches) {
            return false;
        }
    }
    let tolerations = pod["tolerations"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    taints.iter().all(|(key, effect)| {
        tolerations.iter().any(|t| {
            t["key"] == *key
                && t["operator"] == "Exists"
                && (t["effect"].is_null() || t["effect"] == *effect)
        })
    })
}

#[test]
fn both_daemonsets_run_on_hami_and_volcano_gpu_nodes_only() {
    // HAMi's chart: devicePlugin.nvidiaNodeSelector gpu=on, no taint.
    let hami = (vec![("gpu", "on")], vec![]);
    // Volcano's chart labels no node and its plugin tolerates
    // volcano.sh/gpu-memory: a GPU node found by NVIDIA's GPU Feature
    // Discovery, by Node Feature Discovery, or labelled by hand.
    let taint = vec![("volcano.sh/gpu-memory", "NoSchedule")];
    let volcano = [
        (vec![("nvidia.com/gpu.present", "true")], taint.clone()),
        (
            vec![("feature.node.kubernetes.io/pci-10de.present", "true")],
            taint.clone(),
        ),
        (vec![("vgpu-node", "true")], taint.clone()),
    ];
    // A GPU node pool tainted as NVIDIA's GPU Operator and clouds do.
    let tainted = (
        vec![("nvidia.com/gpu.present", "true")],
        vec![("nvidia.com/gpu", "NoSchedule")],
    );
    let cpu = (vec![("kubernetes.io/os", "linux")], vec![]);
    let mut affinities = Vec::new();
    for name in ["vgpu-installer.yaml", "vgpu-exporter.yaml"] {
        let docs = docs(name);
        let pod = &kind(&docs, "DaemonSet")["spec"]["template"]["spec"];
        for (labels, taints) in std::iter::once(&hami).chain(&volcano).chain([&tainted]) {
            assert!(
                runs_on(pod, labels, taints),
                "{name}: {labels:?} {taints:?}"
            );
        }
        assert!(!runs_on(pod, &cpu.0, &cpu.1), "{name} runs on a CPU node");
        // Volcano's GPU node without the label: not selected.
        assert!(!runs_on(pod, &[], &taint), "{name}");
        affinities.push((pod["affinity"].clone(), pod["tolerations"].clone()));
    }
    assert_eq!(affinities[0], affinities[1], "the two DaemonSets differ");
}

#[test]
fn the_namespace_admits_what_the_daemonsets_need() {
    let ns = kind(&docs("vgpu-installer.yaml"), "Namespace").clone();
    let labels = labels(&ns["metadata"]["labels"]);
    // hostPath volumes (both), hostPID and added capabilities (the
    // exporter) are allowed by the privileged level only.
    for (name, pod) in every_manifest().iter().flat_map(|(n, d)| {
        d.iter()
            .filter(|d| d["kind"] == "DaemonSet")
            .map(move |d| (n.clone(), d["spec"]["template"]["spec"].clone()))
    }) {
        let host_path = pod["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|v| !v["hostPath"].is_null());
        assert!(host_path, "{name}");
        for mode in ["enforce", "audit", "warn"] {
            assert_eq!(
                labels
                    .get(&format!("pod-security.kubernetes.io/{mode}"))
                    .map(String::as_str),
                Some("privileged"),
                "{name}: {mode}"
            );
        }
    }
}

/// The metric families `vgpuctl serve` registers (vgpuctl/src/serve/*.rs:
/// each `gauge(r, "name", ...)` or `counter(r, "name", ...)`), as series
/// names: a counter's samples end in `_total`.
fn served() -> std::collections::BTreeSet<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/serve");
    let mut names = std::collections::BTreeSet::new();
    for f in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        for (at, _) in text.match_indices('"') {
            let rest = &text[at + 1..];
            let Some(end) = rest.find('"') else { continue };
            let name = &rest[..end];
            let ours = name.starts_with("hami_") || name.starts_with("vgpu_");
            if !ours
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                continue;
            }
            // The call this literal is the name of: the nearest before it.
            let before = &text[at.saturating_sub(80)..at];
            let call = |c: &str| {
                before
                    .rfind(&format!("{c}("))
                    .map(|i| i as i64)
                    .unwrap_or(-1)
            };
            let (g, c) = (call("gauge"), call("counter"));
            if g < 0 && c < 0 {
                continue;
            }
            names.insert(if c > g {
                format!("{name}_total")
            } else {
                name.to_string()
            });
        }
    }
    assert!(
        names.len() > 20,
        "too few families found in {dir:?}: {names:?}"
    );
    names
}

/// The metric names a PromQL expression uses: words starting `hami_` or
/// `vgpu_` that open no quoted label value and name no `$variable`.
fn families_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = expr.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        if word(b[i]) && (i == 0 || !word(b[i - 1]) && !matches!(b[i - 1], b'"' | b'$')) {
            let start = i;
            while i < b.len() && word(b[i]) {
                i += 1;
            }
            let w = &expr[start..i];
            if w.starts_with("hami_") || w.starts_with("vgpu_") {
                out.push(w.to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}

fn assert_served(what: &str, expr: &str, served: &std::collections::BTreeSet<String>) {
    let used = families_in(expr);
    assert!(!used.is_empty(), "{what}: no family of ours in {expr}");
    for f in used {
        assert!(served.contains(&f), "{what}: {f} is not served ({expr})");
        // vgpu's own percent families are being renamed to ratios.
        assert!(!f.ends_with("_percent"), "{what}: {f}");
    }
}

#[test]
fn the_monitor_and_the_rules_carry_the_label_kube_prometheus_stack_selects() {
    let exporter = docs("vgpu-exporter.yaml");
    let mon = kind(&exporter, "ServiceMonitor");
    let rules = kind(&docs("vgpu-alerts.yaml"), "PrometheusRule").clone();
    for d in [mon, &rules] {
        assert_eq!(d["metadata"]["labels"]["release"], "kube-prometheus-stack");
        assert_eq!(d["metadata"]["namespace"], "vgpu-system");
    }
}

#[test]
fn the_alert_rules_are_well_formed_and_use_served_families() {
    let docs = docs("vgpu-alerts.yaml");
    assert_eq!(docs.len(), 1);
    let rule = &docs[0];
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    let served = served();
    // The parser tells counters (`_total`) from gauges.
    assert!(served.contains("vgpu_container_oom_denials_total"));
    assert!(!served.contains("vgpu_container_oom_denials"));
    assert!(served.contains("hami_vgpu_memory_used_bytes"));
    let duration = |v: &str| {
        let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && ["ms", "s", "m", "h", "d", "w", "y"].contains(&&v[digits.len()..])
    };
    let spec = rule["spec"].as_mapping().unwrap();
    assert_eq!(spec.len(), 1, "spec has groups only");
    let mut alerts = Vec::new();
    for g in rule["spec"]["groups"].as_sequence().unwrap() {
        for k in g.as_mapping().unwrap().keys() {
            assert!(
                ["name", "interval", "rules"].contains(&s(k)),
                "group field {k:?}"
            );
        }
        assert!(!s(&g["name"]).is_empty());
        for r in g["rules"].as_sequence().unwrap() {
            for k in r.as_mapping().unwrap().keys() {
                assert!(
                    [
                        "alert",
                        "expr",
                        "for",
                        "keep_firing_for",
                        "labels",
                        "annotations"
                    ]
                    .contains(&s(k)),
                    "rule field {k:?}"
                );
            }
            let name = s(&r["alert"]).to_string();
            let expr = s(&r["expr"]);
            assert_served(&name, expr, &served);
            assert!(
                expr.contains("job=\"vgpu-exporter\""),
                "{name}: one job only"
            );
            if !r["for"].is_null() {
                assert!(duration(s(&r["for"])), "{name}: for {:?}", r["for"]);
            }
            let severity = s(&r["labels"]["severity"]);
            assert!(
                ["info", "warning", "critical"].contains(&severity),
                "{name}"
            );
            assert!(!s(&r["annotations"]["summary"]).is_empty(), "{name}");
            assert!(!s(&r["annotations"]["description"]).is_empty(), "{name}");
            alerts.push((name, expr.to_string()));
        }
    }
    // What issue 28 asks to be alerted on.
    for family in [
        "vgpu_container_oom_denials_total",
        "vgpu_container_throttled_seconds_total",
        "vgpu_container_slots_reclaimed_total",
        "vgpu_container_processes{job=\"vgpu-exporter\", namespace=\"\"}",
        "vgpu_oversub_process_state{job=\"vgpu-exporter\", state=\"failed\"}",
    ] {
        assert!(
            alerts.iter().any(|(_, e)| e.contains(family)),
            "no alert on {family}"
        );
    }
    let mut names: Vec<&String> = alerts.iter().map(|(n, _)| n).collect();
    names.dedup();
    assert_eq!(names.len(), alerts.len(), "alert names repeat");
}

#[test]
fn the_dashboard_parses_and_every_query_uses_served_families() {
    let text = std::fs::read_to_string(deploy().join("vgpu-dashboard.json")).unwrap();
    let d: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert!(!d["uid"].as_str().unwrap().is_empty());
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36);
    let served = served();
    let mut queries = 0;
    let mut ids = std::collections::BTreeSet::new();
    for p in d["panels"].as_array().unwrap() {
        let title = p["title"].as_str().unwrap();
        assert!(ids.insert(p["id"].as_u64().unwrap()), "{title}: id repeats");
        if p["type"] == "row" {
            continue;
        }
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}");
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            assert_served(title, expr, &served);
            // One job only: the exporter's, or for HAMi's families the one
            // chosen (HAMi's monitor serves them too).
            let job = if families_in(expr).iter().any(|f| f.starts_with("hami_")) {
                "job=\"$hami_job\""
            } else {
                "job=\"$job\""
            };
            assert!(expr.contains(job), "{title}: one job only");
            queries += 1;
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["query"]["query"].as_str() {
            assert_served(v["name"].as_str().unwrap(), q, &served);
        }
    }
    assert!(queries >= 10, "{queries} queries");
    // The job variables default to the ServiceMonitor's job (the Service).
    let svc = kind(&docs("vgpu-exporter.yaml"), "Service").clone();
    for name in ["job", "hami_job"] {
        let job = d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap();
        assert_eq!(
            job["current"]["value"],
            svc["metadata"]["name"].as_str().unwrap()
        );
    }
}

//! The integration-test rig: builds libvgpu.so, the simulated GPU and the
//! C test programs once, then runs real processes against a simulated
//! machine in a temp dir, with or without `LD_PRELOAD=libvgpu.so`.
#![allow(dead_code)]

pub mod oversub;
pub mod turns;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// How a test program reaches the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path3 {
    Link,
    Dlsym,
    ProcAddr,
}

pub const PATHS: [Path3; 3] = [Path3::Link, Path3::Dlsym, Path3::ProcAddr];

impl Path3 {
    fn define(self) -> &'static str {
        match self {
            Path3::Link => "VIA_LINK",
            Path3::Dlsym => "VIA_DLSYM",
            Path3::ProcAddr => "VIA_PROCADDR",
        }
    }
}

/// What the tests run. Every file is this test binary's own copy, taken
/// under [`RIG_LOCK`]: cargo replaces `target/debug/<file>` (removes it,
/// then links the new one) on every build, fresh or not, so a test that
/// ran `target/debug/vgpuctl` while another binary's rig ran `cargo build`
/// found no such file (a loaded CI run).
pub struct Artifacts {
    pub target: PathBuf,
    /// The bundle (stub + core, [`bundle`]).
    pub libvgpu: PathBuf,
    /// The stub alone, with `libvgpu_core.so` ([`Artifacts::core`]) beside
    /// it, where the stub finds it.
    pub stub: PathBuf,
    pub core: PathBuf,
    pub libsim: PathBuf,
    pub vgpuctl: PathBuf,
    pub bin: PathBuf,
    /// A directory holding the simulator under the driver's file names,
    /// used to link the -lcuda build.
    pub link_dir: PathBuf,
}

/// Held while a rig builds and copies what it runs, and by .ci/tests.py
/// while the doctests build (they relink `libvgpu_core.so`): nothing
/// replaces a file of `target/debug` while a rig copies it.
pub const RIG_LOCK: &str = "vgpu-test-programs/.rig.lock";

/// An exclusive `flock` on `path`, released when the file closes.
fn lock_file(path: &Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    loop {
        // SAFETY: `f` is an open file for the whole call.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return f;
        }
        let e = std::io::Error::last_os_error();
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::Interrupted,
            "flock {}: {e}",
            path.display()
        );
    }
}

/// The workspace's root (vgpuctl's tests share this rig).
fn repo() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if here.join("tests/programs").is_dir() {
        here
    } else {
        here.join("..")
    }
}

/// Builds the C program `src` into `out` with `cc -O1 -Wall`, `args`
/// after the source (libraries); fails the test with the compiler's words.
pub fn compile_c(src: &Path, out: &Path, args: &[&std::ffi::OsStr]) {
    run_ok(
        Command::new("cc")
            .args(["-O1", "-Wall", "-o"])
            .arg(out)
            .arg(src)
            .args(args),
    );
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds everything the tests run, once per test binary.
pub fn artifacts() -> &'static Artifacts {
    static A: OnceLock<Artifacts> = OnceLock::new();
    A.get_or_init(|| {
        let exe = std::env::current_exe().expect("test exe");
        let target = exe
            .parent()
            .and_then(Path::parent)
            .expect("target dir")
            .to_path_buf();
        let bin = target.join("vgpu-test-programs");
        std::fs::create_dir_all(&bin).unwrap();
        let lock = lock_file(&target.join(RIG_LOCK));
        let mut build = Command::new(env!("CARGO"));
        build.current_dir(repo()).args([
            "build",
            "--quiet",
            "-p",
            "vgpu",
            "-p",
            "vgpu-preload",
            "-p",
            "sim-gpu",
            "-p",
            "vgpuctl",
        ]);
        // Without what cargo sets for this test binary's package: ring's
        // build script reruns when CARGO_MANIFEST_DIR changes, so each
        // binary's rig rebuilt ring, rustls, ureq and vgpuctl (its value
        // differs between vgpu's and vgpuctl's tests, and a plain `cargo
        // build` sets none), seconds of CPU each under RIG_LOCK.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key.starts_with("CARGO_PKG_")
                || [
                    "CARGO_MANIFEST_DIR",
                    "CARGO_MANIFEST_PATH",
                    "CARGO_MANIFEST_LINKS",
                    "CARGO_CRATE_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                    "OUT_DIR",
                ]
                .contains(&&*key)
            {
                build.env_remove(&*key);
            }
        }
        run_ok(&mut build);
        // Each test binary builds into its own dir: they may run at once.
        let own = bin.join(exe.file_name().unwrap());
        let stub_dir = own.join("stub");
        std::fs::create_dir_all(&stub_dir).unwrap();
        let copy = |name: &str, to: &Path| {
            let dst = to.join(name);
            copy_built(&target.join(name), &dst);
            dst
        };
        let vgpuctl = copy("vgpuctl", &own);
        let libsim = copy("libsim_gpu.so", &own);
        let stub = copy("libvgpu.so", &stub_dir);
        let core = copy("libvgpu_core.so", &stub_dir);
        let link_dir = own.join("driver");
        std::fs::create_dir_all(&link_dir).unwrap();
        for name in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            let l = link_dir.join(name);
            let _ = std::fs::remove_file(&l);
            std::os::unix::fs::symlink(&libsim, &l).unwrap();
        }
        // Under the lock: the first binary compiles them, the rest wait
        // for that and copy.
        let c_programs = c_programs(&bin, &link_dir);
        drop(lock);
        for (name, _) in c_builds() {
            copy_built(&c_programs.join(&name), &own.join(&name));
        }
        let libvgpu = own.join("libvgpu.so");
        match std::env::var_os("VGPU_TEST_BUNDLE") {
            // The deployable bundle (deploy/build.sh: target/dist/libvgpu.so),
            // to run the tests against the file a node gets.
            Some(dist) => {
                std::fs::copy(&dist, &libvgpu)
                    .unwrap_or_else(|e| panic!("VGPU_TEST_BUNDLE={dist:?}: {e}"));
            }
            None => bundle(&stub_dir, &libvgpu),
        }
        Artifacts {
            libvgpu,
            stub,
            core,
            libsim,
            vgpuctl,
            bin: own,
            link_dir,
            target,
        }
    })
}

/// The C programs every test binary runs: each one's name and its `cc`
/// arguments but the output (in tests/programs; `LINK_DIR` stands for a
/// directory holding a driver to link against).
fn c_builds() -> Vec<(String, Vec<String>)> {
    let mut builds = Vec::new();
    for p in PATHS {
        let name = format!("cuclient-{}", p.define().to_lowercase());
        let mut args: Vec<String> = [
            "-O1",
            "-Wall",
            "-D",
            p.define(),
            "cuclient.c",
            "-ldl",
            "-lpthread",
        ]
        .map(String::from)
        .to_vec();
        if p == Path3::Link {
            args.extend(["-L", "LINK_DIR", "-l:libcuda.so.1"].map(String::from));
        }
        builds.push((name, args));
    }
    for prog in ["proc_address", "smi", "nodriver", "hostile_board"] {
        let args = ["-O1", "-Wall", &format!("{prog}.c"), "-ldl", "-lpthread"];
        builds.push((prog.to_string(), args.map(String::from).to_vec()));
    }
    builds
}

/// The C programs of tests/programs, compiled once for what they are
/// built from: a directory of `bin` named for a hash of every file there,
/// the command lines and the compiler's version. Each test binary
/// compiling its own seven was a tenth of the CPU of CI's lanes (`perf`,
/// 2026-11-29). Called under [`RIG_LOCK`]; built in a temp dir and
/// renamed into place, so a directory of that name is always whole.
/// (The -lcuda build links against whichever simulator built it first:
/// it names `libcuda.so.1` alone, and each test runs it on its own.)
fn c_programs(bin: &Path, link_dir: &Path) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let programs = repo().join("tests/programs");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&programs)
        .unwrap_or_else(|e| panic!("{}: {e}", programs.display()))
        .map(|f| f.unwrap().path())
        .filter(|f| f.is_file())
        .collect();
    files.sort();
    let builds = c_builds();
    let mut hash = std::collections::hash_map::DefaultHasher::new();
    builds.hash(&mut hash);
    let version = Command::new("cc").arg("-dumpfullversion").output();
    version.expect("cc (a C compiler)").stdout.hash(&mut hash);
    for f in &files {
        f.file_name().hash(&mut hash);
        let bytes = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        bytes.hash(&mut hash);
    }
    let dir = bin.join(format!("c-{:016x}", hash.finish()));
    if dir.is_dir() {
        return dir;
    }
    // What a run that died mid-build left.
    for old in std::fs::read_dir(bin).unwrap().filter_map(Result::ok) {
        if old.file_name().to_string_lossy().starts_with("c-tmp-") {
            let _ = std::fs::remove_dir_all(old.path());
        }
    }
    let tmp = bin.join(format!("c-tmp-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for (name, args) in &builds {
        let mut cc = Command::new("cc");
        cc.current_dir(&programs).arg("-o").arg(tmp.join(name));
        for a in args {
            if a == "LINK_DIR" {
                cc.arg(link_dir);
            } else {
                cc.arg(a);
            }
        }
        run_ok(&mut cc);
    }
    std::fs::rename(&tmp, &dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// Copies a built file over `to`, through a temp name of this process's:
/// a test never runs a half-written file, and two processes of one test
/// binary (overlapping runs) do not write the same temp file.
fn copy_built(from: &Path, to: &Path) {
    let tmp = to.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::copy(from, &tmp).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    std::fs::rename(&tmp, to).unwrap();
}

/// The single file a deployment installs (and HAMi's device plugin
/// mounts): the stub `libvgpu.so` with the core and its trailer appended
/// (`vgpu_preload::bundle`, as deploy/build.sh makes it), which the stub
/// checks and loads through a memfd (preload/stub.c). Every test that
/// preloads vgpu runs that path; a copy of it alone in another directory
/// still works. `VGPU_TEST_BUNDLE=target/dist/libvgpu.so` makes the tests
/// use deploy/build.sh's file instead.
pub fn bundle(dir: &Path, out: &Path) {
    let stub = std::fs::read(dir.join("libvgpu.so")).expect("the stub");
    // As deploy/build.sh builds it: the core without its debug
    // sections (binutils' objcopy, which .ci/run installs).
    let core = out.with_extension(format!("core.{}.tmp", std::process::id()));
    let stripped = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(dir.join("libvgpu_core.so"))
        .arg(&core)
        .status()
        .expect("objcopy (binutils)");
    assert!(stripped.success(), "objcopy --strip-debug of the core");
    let bytes = vgpu_preload::bundle(&stub, &std::fs::read(&core).expect("the core"));
    let _ = std::fs::remove_file(&core);
    let tmp = out.with_extension("so.tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, out).unwrap();
}

/// `readelf FLAG -W lib`'s output.
pub fn readelf(lib: &Path, flag: &str) -> String {
    let out = Command::new("readelf").args([flag, "-W"]).arg(lib).output();
    let out = out.expect("readelf (binutils) is needed for this test");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The preloaded stub stays what makes preloading cheap (issue 14,
/// docs/benchmarks.md): few relocations, no constructor, libc alone, a
/// few pages mapped, no TLS. For the `cargo build` stub (tests/preload.rs)
/// and deploy/build.sh's (tests/dist.rs).
pub fn stub_budget(stub: &Path) {
    let relocs = readelf(stub, "-r")
        .lines()
        .filter(|l| l.contains("R_X86_64_"))
        .count();
    assert!(
        relocs <= 32,
        "{relocs} relocations: each one is paid by every exec"
    );
    let dynamic = readelf(stub, "-d");
    for tag in ["(INIT)", "(INIT_ARRAY)", "(FINI_ARRAY)", "(TEXTREL)"] {
        assert!(!dynamic.contains(tag), "{tag} in the stub:\n{dynamic}");
    }
    let needed: Vec<&str> = dynamic
        .lines()
        .filter_map(|l| l.split_once("Shared library: [")?.1.strip_suffix(']'))
        .collect();
    assert_eq!(
        needed,
        ["libc.so.6"],
        "no libgcc_s, no libm, no libdl, no libpthread"
    );
    // What the loader maps: a few pages.
    let mapped: u64 = readelf(stub, "-l")
        .lines()
        .filter(|l| l.trim_start().starts_with("LOAD"))
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|m| u64::from_str_radix(m.trim_start_matches("0x"), 16).unwrap())
        .sum();
    assert!(mapped <= 32 * 1024, "{mapped} bytes mapped");
    assert!(!readelf(stub, "-l").contains(" TLS "), "no TLS");
}

/// One simulated machine: its state file, its drivers, its region.
pub struct Sim {
    pub dir: tempfile::TempDir,
    pub env: Vec<(String, String)>,
}

impl Sim {
    /// A machine with `gpus` devices of `memory` (e.g. "8g").
    pub fn new(gpus: u32, memory: &str) -> Sim {
        let a = artifacts();
        let dir = tempfile::Builder::new()
            .prefix("vgpu-sim-")
            .tempdir()
            .unwrap();
        let drivers = dir.path().join("drivers");
        std::fs::create_dir_all(&drivers).unwrap();
        for name in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            std::os::unix::fs::symlink(&a.libsim, drivers.join(name)).unwrap();
        }
        let env = vec![
            ("LD_LIBRARY_PATH".into(), drivers.display().to_string()),
            (
                "SIM_GPU_STATE".into(),
                dir.path().join("sim.state").display().to_string(),
            ),
            ("SIM_GPU_COUNT".into(), gpus.to_string()),
            ("SIM_GPU_MEMORY".into(), memory.into()),
            ("SIM_GPU_CTX_OVERHEAD".into(), "256m".into()),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
                dir.path().join("region.cache").display().to_string(),
            ),
        ];
        Sim { dir, env }
    }

    /// Sets (or replaces) an environment variable for every process.
    pub fn set(&mut self, k: &str, v: &str) -> &mut Sim {
        self.env.retain(|(n, _)| n != k);
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn region(&self) -> PathBuf {
        self.dir.path().join("region.cache")
    }

    /// A command for `program` (a test program name or a path).
    pub fn cmd(&self, program: impl AsRef<std::ffi::OsStr>, preload: bool) -> Command {
        let p = Path::new(program.as_ref());
        let path = if p.is_absolute() {
            p.to_path_buf()
        } else {
            artifacts().bin.join(p)
        };
        let mut c = Command::new(path);
        c.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        for (k, v) in &self.env {
            c.env(k, v);
        }
        if preload {
            c.env("LD_PRELOAD", &artifacts().libvgpu);
        }
        c.stdin(Stdio::null());
        c
    }

    /// Runs cuclient built for `path` with `args`.
    pub fn client(&self, path: Path3, preload: bool, args: &[&str]) -> Run {
        let out = self
            .client_cmd(path, preload, args)
            .output()
            .expect("run cuclient");
        Run::from(out)
    }

    pub fn client_cmd(&self, path: Path3, preload: bool, args: &[&str]) -> Command {
        let mut c = self.cmd(
            format!("cuclient-{}", path.define().to_lowercase()),
            preload,
        );
        c.args(args);
        c
    }

    pub fn spawn_client(&self, path: Path3, preload: bool, args: &[&str]) -> Child {
        self.client_cmd(path, preload, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cuclient")
    }

    /// `vgpuctl` on this machine's region.
    pub fn ctl(&self, args: &[&str]) -> Run {
        let mut c = Command::new(&artifacts().vgpuctl);
        c.args(args);
        Run::from(c.output().expect("run vgpuctl"))
    }

    /// The container's live usage of device entry `dev`.
    pub fn region_used(&self, dev: usize) -> u64 {
        let r = self.ctl(&["usage", self.region().to_str().unwrap(), &dev.to_string()]);
        r.stdout.trim().parse().unwrap_or(0)
    }

    /// `vgpuctl status --json` of `region`: the region's object in the
    /// schema of docs/vgpuctl.md (`devices`, `processes`, ...).
    pub fn status(&self, region: &Path) -> serde_json::Value {
        let r = self
            .ctl(&["status", "--json", region.to_str().unwrap()])
            .ok();
        region_of(&r)
    }

    /// [`Sim::status`], or None while the region cannot be read yet (not
    /// created, or its creator has not finished): for loops that watch a
    /// region from a process's start.
    pub fn try_status(&self, region: &Path) -> Option<serde_json::Value> {
        let r = self.ctl(&["status", "--json", region.to_str().unwrap()]);
        r.status.success().then(|| region_of(&r))
    }

    /// Every byte the processes of `region` hold, as it says (0 while it
    /// cannot be read yet).
    pub fn used_bytes(&self, region: &Path) -> u64 {
        let Some(s) = self.try_status(region) else {
            return 0;
        };
        s["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|p| p["devices"].as_array().into_iter().flatten())
            .filter_map(|d| d["used_bytes"].as_u64())
            .sum()
    }

    /// What the simulated NVML reports, without vgpu: (total, used).
    pub fn physical(&self, dev: usize) -> (u64, u64) {
        let r = Run::from(self.cmd("smi", false).output().expect("run smi"));
        (
            r.u64(&format!("gpu{dev}_v1_total")),
            r.u64(&format!("gpu{dev}_v1_used")),
        )
    }
}

/// The region of a `vgpuctl status --json` run.
fn region_of(r: &Run) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("vgpuctl status --json: {e}\n{}", r.stdout));
    assert_eq!(v["schema_version"], 1, "{}", r.stdout);
    v["regions"][0].take()
}

/// A finished process with its `key=value` output.
pub struct Run {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub kv: HashMap<String, String>,
}

impl From<Output> for Run {
    fn from(out: Output) -> Run {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut kv = HashMap::new();
        for line in stdout.lines() {
            for tok in line.split_whitespace() {
                if let Some((k, v)) = tok.split_once('=') {
                    kv.insert(k.to_string(), v.trim_matches('"').to_string());
                }
            }
        }
        Run {
            status: out.status,
            stdout,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            kv,
        }
    }
}

impl Run {
    pub fn get(&self, k: &str) -> &str {
        self.kv.get(k).unwrap_or_else(|| {
            panic!(
                "no {k} in output:\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    pub fn u64(&self, k: &str) -> u64 {
        self.get(k)
            .parse()
            .unwrap_or_else(|_| panic!("{k}={} is not a number", self.get(k)))
    }

    pub fn i64(&self, k: &str) -> i64 {
        self.get(k)
            .parse()
            .unwrap_or_else(|_| panic!("{k}={} is not a number", self.get(k)))
    }

    pub fn f64(&self, k: &str) -> f64 {
        self.get(k)
            .parse()
            .unwrap_or_else(|_| panic!("{k}={} is not a number", self.get(k)))
    }

    /// Asserts a clean exit and returns self.
    pub fn ok(self) -> Run {
        assert!(
            self.status.success(),
            "exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }
}

/// Reads a child's output after it exits (or after `kill`).
pub fn finish(child: Child) -> Run {
    Run::from(child.wait_with_output().expect("wait child"))
}

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Held by tests whose results depend on timing, so that they do not run
/// at the same time as each other (the CI machine has two cores).
///
/// Such tests judge paces that the host sets too (a launch loop's, the
/// limiter's wake-ups at its windows), so this thread, and every process
/// it starts, also runs before the machine's other work: nice -10 (root
/// only; elsewhere it stays as it was). Beside two busy loops on a 2-core
/// machine, a host-bound loop's solo rate otherwise fell from 9000 to
/// 2500 a second, and 50 % containers lost up to 0.1 of a second's share
/// waking late for their windows.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static M: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = M.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: setpriority takes no pointers; `0` is the calling thread
    // (Linux's nice is per thread), which the test owns; failure (not
    // root) leaves the priority as it was.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -10) };
    guard
}

/// Waits until `cond` holds (up to `secs`).
pub fn wait_until(secs: f64, mut cond: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + Duration::from_secs_f64(secs);
    while std::time::Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// A HAMi-core 1.2 region, as HAMi-core writes it (offsets from
/// ../shared/HAMI-REGION.md): one device, two processes.
pub fn write_hami_core_file(path: &Path, last_kernel_time: u64) -> Vec<u8> {
    let mut b = vec![0u8; 2_008_952];
    let put = |b: &mut Vec<u8>, at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
    put(&mut b, 0, &19920718i32.to_le_bytes());
    put(&mut b, 4, &1u32.to_le_bytes());
    put(&mut b, 8, &2u32.to_le_bytes());
    put(&mut b, 56, &1u64.to_le_bytes());
    put(&mut b, 64, b"GPU-11111111-2222-3333-4444-555555555555\0");
    put(&mut b, 1600, &(3 * GIB).to_le_bytes());
    put(&mut b, 1728, &40u64.to_le_bytes());
    for (i, (pid, ctx, data, sm)) in [
        (100i32, 300 * MIB, 700 * MIB, 20u64),
        (101, 300 * MIB, 200 * MIB, 15),
    ]
    .into_iter()
    .enumerate()
    {
        let slot = 1856 + i * 1960;
        put(&mut b, slot, &pid.to_le_bytes());
        put(&mut b, slot + 4, &(pid + 5000i32).to_le_bytes());
        put(&mut b, slot + 8, &ctx.to_le_bytes());
        put(&mut b, slot + 8 + 16, &data.to_le_bytes());
        put(&mut b, slot + 8 + 32, &(ctx + data).to_le_bytes());
        put(&mut b, slot + 1032, &(ctx + data + 10 * MIB).to_le_bytes());
        put(&mut b, slot + 1160 + 16, &sm.to_le_bytes());
        put(&mut b, slot + 1928, &1i32.to_le_bytes());
    }
    put(&mut b, 2_008_896, &2i32.to_le_bytes());
    put(&mut b, 2_008_900, &1i32.to_le_bytes());
    put(&mut b, 2_008_904, &(-1i32).to_le_bytes());
    put(&mut b, 2_008_908, &0i32.to_le_bytes());
    put(&mut b, 2_008_912, &last_kernel_time.to_le_bytes());
    std::fs::write(path, &b).unwrap();
    b
}

/// An fd of this test's /proc, inherited by every child: the simulated
/// driver reads host pids through it, as the real one knows them,
/// whatever /proc a process mounts (`SIM_GPU_HOST_PROC_FD`).
pub fn host_proc_fd() -> i32 {
    use std::os::fd::AsRawFd;
    static PROC: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();
    let f = PROC.get_or_init(|| std::fs::File::open("/proc").unwrap());
    // SAFETY: F_SETFD on an fd we own, clearing FD_CLOEXEC only.
    assert_eq!(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFD, 0) }, 0);
    f.as_raw_fd()
}

/// The URL a `vgpuctl serve` child (stdout piped) says it serves at, from
/// the first line it prints (`... http://ADDR/metrics, ...`).
pub fn served_url(child: &mut Child) -> String {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout piped"))
        .read_line(&mut line)
        .expect("vgpuctl serve's first line");
    line.split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .trim_end_matches(',')
        .to_string()
}

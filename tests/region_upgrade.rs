//! Old region files on a node, with real processes on the simulated GPU:
//! a HAMi-core file that HAMi-core processes still use binds new processes
//! to its limits (alone) and is adopted once they are gone; a file of
//! vgpu's layout 1.x is shared with the old library's processes, then
//! upgraded. Neither is misread, and no limit stored in one is lost.

mod common;

use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;
use vgpu_shm::hami::layout::{HamiProc, HamiRegion};
use vgpu_shm::layout::{LEGACY_SIZE, VGPU_OFFSET};
use vgpu_shm::{Format, OpenMode, ProcId, Region};

/// The simulated GPU's UUID as NVML prints it.
fn gpu_uuid(sim: &Sim) -> String {
    Run::from(sim.cmd("smi", false).output().unwrap())
        .ok()
        .get("gpu0_uuid")
        .to_string()
}

/// A HAMi-core file (layout 1.2, one byte longer, as HAMi-core makes it)
/// limiting device 0 (`uuid`) to `limit` bytes, used by process `user`.
fn hami_core_file(uuid: &str, limit: u64, user: i32) -> Vec<u8> {
    let mut f = vec![0u8; vgpu_shm::hami::HAMI_SIZE + 1];
    let mut put = |at: usize, b: &[u8]| f[at..at + b.len()].copy_from_slice(b);
    put(0, &19_920_718i32.to_le_bytes());
    put(4, &1u32.to_le_bytes());
    put(8, &2u32.to_le_bytes());
    put(offset_of!(HamiRegion, device_num), &1u64.to_le_bytes());
    put(offset_of!(HamiRegion, uuids), uuid.as_bytes());
    put(offset_of!(HamiRegion, limit), &limit.to_le_bytes());
    for d in 0..16 {
        put(
            offset_of!(HamiRegion, sm_limit) + 8 * d,
            &100u64.to_le_bytes(),
        );
    }
    put(offset_of!(HamiRegion, procs), &user.to_le_bytes());
    put(
        offset_of!(HamiRegion, procs) + offset_of!(HamiProc, status),
        &1i32.to_le_bytes(),
    );
    put(offset_of!(HamiRegion, proc_num), &1i32.to_le_bytes());
    put(offset_of!(HamiRegion, priority), &1i32.to_le_bytes());
    put(
        offset_of!(HamiRegion, utilization_switch),
        &1i32.to_le_bytes(),
    );
    assert_eq!(size_of::<HamiRegion>(), vgpu_shm::hami::HAMI_SIZE);
    f
}

/// hami_reader (a monitor's view), built from include/hami_region.h once.
fn reader() -> &'static Path {
    static EXE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        let exe = artifacts().bin.join("hami_reader");
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/programs/hami_reader.c");
        assert!(
            Command::new("cc")
                .args(["-O1", "-o"])
                .arg(&exe)
                .arg(src)
                .status()
                .unwrap()
                .success()
        );
        exe
    })
}

fn alloc(sim: &Sim, bytes: u64) -> Run {
    sim.client(Path3::Dlsym, true, &["alloc", "buffer", &bytes.to_string()])
        .ok()
}

fn probe(path: &Path) -> Format {
    vgpu_shm::hami::probe(path).unwrap()
}

#[test]
fn a_hami_core_file_in_use_binds_new_processes_to_its_limit_then_is_adopted() {
    // No limit in the environment: the file's 1 GiB is the only one.
    let sim = Sim::new(1, "8g");
    let uuid = gpu_uuid(&sim);
    let region = sim.region();
    std::fs::write(&region, hami_core_file(&uuid, 1 << 30, 0)).unwrap();
    // A HAMi-core process: it maps the file (and sits in its slot 0).
    let mut user = Command::new(reader())
        .arg(&region)
        .args(["hold", "60"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(user.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "holding");
    let file = hami_core_file(&uuid, 1 << 30, user.id() as i32);
    std::fs::write(&region, &file).unwrap();

    // Context (256 MiB) and 900 MiB do not fit in the file's 1 GiB.
    let r = alloc(&sim, 900 * MIB);
    assert_eq!(r.i64("alloc_rc"), 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("HAMi-core") && r.stderr.contains(&user.id().to_string()),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.matches("refused").count(), 1, "{}", r.stderr);
    assert_eq!(alloc(&sim, 500 * MIB).i64("alloc_rc"), 0);
    assert_eq!(std::fs::read(&region).unwrap(), file, "left as it was");

    user.kill().unwrap();
    user.wait().unwrap();
    // Adopted: the same limit, now shared through vgpu's region.
    let r = alloc(&sim, 900 * MIB);
    assert_eq!(r.i64("alloc_rc"), 2, "{}", r.stderr);
    assert!(!r.stderr.contains("refused"), "{}", r.stderr);
    assert!(matches!(probe(&region), Format::Vgpu { .. }));
    assert_eq!(alloc(&sim, 500 * MIB).i64("alloc_rc"), 0);
    let shown = Run::from(Command::new(reader()).arg(&region).output().unwrap()).ok();
    assert_eq!(shown.get("dev0.uuid"), uuid);
    assert_eq!(shown.u64("dev0.limit"), 1 << 30);
}

/// A file of vgpu's layout 1.1 at `path` limiting the simulated GPU to
/// `limit`, in which process `old` holds `held` bytes.
fn vgpu_1_file(path: &Path, uuid: &str, limit: u64, old: u32, held: u64) {
    let tmp = path.with_extension("new");
    let r = Region::open(&tmp, OpenMode::CreateIfMissing).unwrap();
    let info = vgpu_shm::DeviceInfo {
        uuid: vgpu_shm::parse_uuid(uuid).unwrap(),
        total_mem: 8 << 30,
        sm_count: 132,
    };
    let limits = vgpu_shm::Limits {
        mem: limit,
        sm: 0,
        policy: vgpu_shm::CorePolicy::Default,
    };
    let dev = r.register_device(&info, limits).unwrap().index;
    // What the old processes measured a context to cost (the simulator's).
    r.device(dev).set_context_bytes(256 * MIB);
    let slot = r
        .claim_slot(&ProcId {
            pid: old as i32,
            start_time: 0,
            pidns: ProcId::current().pidns,
        })
        .unwrap();
    r.add_usage(slot, dev, vgpu_shm::Kind::Buffer, held);
    drop(r);
    let mut part = std::fs::read(&tmp).unwrap()[VGPU_OFFSET..].to_vec();
    std::fs::remove_file(&tmp).unwrap();
    part[8..16].copy_from_slice(&[1, 0, 0, 0, 1, 0, 0, 0]);
    part[16..24].copy_from_slice(&(LEGACY_SIZE as u64).to_le_bytes());
    std::fs::write(path, part).unwrap();
}

#[test]
fn a_vgpu_1_file_is_shared_with_the_old_processes_then_upgraded() {
    let sim = Sim::new(1, "8g");
    let uuid = gpu_uuid(&sim);
    let region = sim.region();
    // A process of the old library, holding 600 MiB of a 1 GiB limit.
    let mut old = Command::new("sleep").arg("60").spawn().unwrap();
    vgpu_1_file(&region, &uuid, 1 << 30, old.id(), 600 * MIB);
    // Its 600 MiB count: context (256 MiB) and 300 MiB more do not fit,
    // 100 MiB do.
    assert_eq!(alloc(&sim, 300 * MIB).i64("alloc_rc"), 2);
    assert_eq!(alloc(&sim, 100 * MIB).i64("alloc_rc"), 0);
    assert_eq!(probe(&region), Format::VgpuLegacy { major: 1, minor: 1 });
    assert_eq!(
        std::fs::metadata(&region).unwrap().len(),
        LEGACY_SIZE as u64
    );
    // Monitors cannot see it yet (not HAMi's layout).
    let monitor = Command::new(reader()).arg(&region).output().unwrap();
    assert_eq!(monitor.status.code(), Some(3));

    old.kill().unwrap();
    old.wait().unwrap();
    // The next process upgrades it, the limit kept.
    let r = alloc(&sim, 900 * MIB);
    assert_eq!(r.i64("alloc_rc"), 2, "{}", r.stderr);
    assert!(matches!(probe(&region), Format::Vgpu { .. }));
    let uuid = vgpu_shm::parse_uuid(&uuid).unwrap();
    let r = Region::open(&region, OpenMode::ExistingOnly).unwrap();
    let dev = r.find_device(&uuid).unwrap();
    assert_eq!(r.device(dev).limits().mem, 1 << 30);
    drop(r);
    // Monitors see it once a process of the container has run a while.
    // (Within 30 s, and held 10: a loaded host takes seconds to start it.)
    let holder = sim.spawn_client(
        Path3::Dlsym,
        true,
        &["hold", &(600 * MIB).to_string(), "10"],
    );
    assert!(wait_until(30.0, || {
        let shown = Run::from(Command::new(reader()).arg(&region).output().unwrap());
        shown.kv.get("dev0.limit").map(String::as_str) == Some("1073741824")
    }));
    assert_eq!(finish(holder).ok().i64("hold_rc"), 0);
}

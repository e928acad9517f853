//! Region validation: any bytes as a region file. `check` must refuse or
//! accept without panicking, and opening the file must never map a file
//! that `check` refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vgpu_shm::format::Found;
use vgpu_shm::{OpenMode, Region, ShmError, check, layout};

fuzz_target!(|data: &[u8]| {
    // Claimed length: the input's own, or a lie taken from its tail.
    let len = match data.len() {
        n if n >= 8 && data[0] & 1 == 1 => u64::from_le_bytes(data[n - 8..].try_into().unwrap()),
        n => n as u64,
    };
    match check(data, len) {
        Ok(Found::Vgpu { ready: true, .. }) => assert_eq!(len, layout::FILE_SIZE as u64),
        Ok(Found::VgpuLegacy { ready: true, .. }) => assert_eq!(len, layout::LEGACY_SIZE as u64),
        Ok(Found::HamiCore) => assert!(len >= vgpu_shm::hami::HAMI_SIZE as u64),
        _ => {}
    }
    // Every few inputs, the real thing on a file (tmpfs when there is one).
    if data.len() % 7 == 0 {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("vgpu-fuzz-{}.cache", std::process::id()));
        std::fs::write(&path, data).unwrap();
        match Region::open(&path, OpenMode::ExistingOnly) {
            Ok(r) => assert!(
                r.header().size.load(std::sync::atomic::Ordering::Relaxed)
                    == std::fs::metadata(&path).unwrap().len()
            ),
            Err(ShmError::Refused { .. }) => assert_eq!(
                std::fs::read(&path).unwrap(),
                data,
                "a refused file is never modified"
            ),
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
});

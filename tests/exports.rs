//! The exported symbols: vgpuctl defines no driver symbol (it never
//! interposes), while the library exports the ones it hooks.

mod common;

use common::*;

#[test]
fn vgpuctl_exports_no_driver_symbols() {
    let out = std::process::Command::new("nm")
        .arg("--defined-only")
        .arg(&artifacts().vgpuctl)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let bad: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|s| {
            *s == "dlsym"
                || *s == "dlvsym"
                || s.starts_with("cu") && s.len() > 2 && s.as_bytes()[2].is_ascii_uppercase()
                || s.starts_with("nvml")
        })
        .collect();
    assert!(bad.is_empty(), "vgpuctl defines {bad:?}");
    // The library itself exports them: the check above can fail.
    let lib = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&artifacts().libvgpu)
        .output()
        .unwrap();
    let lib = String::from_utf8_lossy(&lib.stdout);
    assert!(
        lib.contains(" T dlsym")
            && lib.contains(" T cuMemAlloc_v2")
            && lib.contains(" T nvmlDeviceGetMemoryInfo_v2")
    );
}

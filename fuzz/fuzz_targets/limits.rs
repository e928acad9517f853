//! Environment parsing: any bytes as the values of vgpu's variables.
#![no_main]

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use libfuzzer_sys::fuzz_target;
use vgpu::config::{Config, DeviceNumber, parse_bytes, parse_percent};

const VARS: [&str; 8] = [
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_MEMORY_LIMIT_3",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_DEVICE_SM_LIMIT_0",
    "GPU_CORE_UTILIZATION_POLICY",
    "CUDA_DISABLE_CONTROL",
    "LIBCUDA_LOG_LEVEL",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
];

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Some(b) = parse_bytes(&text) {
        // A parsed limit is the digits times a power of 1024: never below them.
        let digits: String = text
            .trim()
            .trim_end_matches(|c: char| c.is_ascii_alphabetic())
            .to_string();
        assert!(digits.parse::<u64>().is_ok_and(|d| d == 0 || b >= d));
    }
    if let Some(Some(p)) = parse_percent(&text) {
        assert!((1..100).contains(&p));
    }
    // Split the input among the variables, byte values kept raw.
    let parts: Vec<Vec<u8>> = data.split(|&b| b == 0).map(<[u8]>::to_vec).collect();
    let lookup = |k: &str| {
        VARS.iter()
            .position(|v| *v == k)
            .and_then(|i| parts.get(i))
            .map(|v| OsString::from_vec(v.clone()))
    };
    match Config::from_lookup(lookup) {
        Ok(c) => {
            for n in (0..16).map(DeviceNumber::new) {
                let _ = (c.mem_limit_for(n), c.sm_limit_for(n));
            }
            let _ = c.limits_for(None);
        }
        Err(e) => assert!(VARS.contains(&e.var.as_str()) && !e.to_string().is_empty()),
    }
});

//! Hand-written NVML types: only what vgpu reads or writes.
#![forbid(unsafe_code)]

use std::ffi::{c_uint, c_void};
use std::fmt;
use std::mem::size_of;

/// `nvmlReturn_t`, transparent so unknown codes pass through.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct NvmlReturn(pub c_uint);

impl NvmlReturn {
    pub const SUCCESS: Self = Self(0);
    pub const ERROR_NOT_FOUND: Self = Self(6);
    pub const ERROR_INSUFFICIENT_SIZE: Self = Self(7);
    /// `NVML_ERROR_LIBRARY_NOT_FOUND`: what the stub libnvidia-ml returns.
    pub const ERROR_LIBRARY_NOT_FOUND: Self = Self(12);
    pub const ERROR_FUNCTION_NOT_FOUND: Self = Self(13);

    pub fn is_ok(self) -> bool {
        self == Self::SUCCESS
    }
}

impl crate::interpose::real::NoLibrary for NvmlReturn {
    const NO_LIBRARY: Self = Self::ERROR_LIBRARY_NOT_FOUND;
}

impl fmt::Display for NvmlReturn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nvmlReturn_t {}", self.0)
    }
}

pub type NvmlDevice = *mut c_void;

/// A device as NVML numbers it (`nvmlDeviceGetIndex`): the enumeration
/// of the devices the container can see, which `CUDA_VISIBLE_DEVICES`
/// does not change. Not a CUDA ordinal.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmlIndex(pub c_uint);

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2`: the version word of a [`MemoryV2`].
pub const MEMORY_V2: c_uint = std::mem::size_of::<MemoryV2>() as c_uint | (2 << 24);

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct MemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ProcessInfoV1 {
    pub pid: c_uint,
    pub used: u64,
}

/// `nvmlProcessInfo_t` (v2 and v3).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ProcessInfo {
    pub pid: c_uint,
    pub used: u64,
    pub gpu_instance: c_uint,
    pub compute_instance: c_uint,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct UtilSample {
    pub pid: c_uint,
    /// CPU time of the sample, microseconds since the epoch.
    pub timestamp: u64,
    pub sm: c_uint,
    pub mem: c_uint,
    pub enc: c_uint,
    pub dec: c_uint,
}

const _: () = {
    assert!(size_of::<MemoryV2>() == 40);
    assert!(size_of::<ProcessInfo>() == 24);
    assert!(size_of::<ProcessInfoV1>() == 16);
    assert!(size_of::<UtilSample>() == 32);
};

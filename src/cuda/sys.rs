//! Hand-written driver API types: only what the hooks read or write.
//! Layouts checked against cuda.h 13.0 on the GPU machine
//! (gpu-tests/probe/calibrate.c prints them).
#![forbid(unsafe_code)]

use std::ffi::{c_int, c_uint, c_void};
use std::fmt;
use std::mem::{offset_of, size_of};

/// `CUresult`: a transparent code, so unknown values pass through intact.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CUresult(pub c_int);

impl CUresult {
    pub const SUCCESS: Self = Self(0);
    pub const ERROR_INVALID_VALUE: Self = Self(1);
    pub const ERROR_OUT_OF_MEMORY: Self = Self(2);
    /// `CUDA_ERROR_STUB_LIBRARY`: what the toolkit's stub libcuda returns.
    pub const ERROR_STUB_LIBRARY: Self = Self(34);
    pub const ERROR_INVALID_CONTEXT: Self = Self(201);
    /// `CUDA_ERROR_ILLEGAL_STATE`: a checkpoint call in the wrong state,
    /// and our answer to calls of a process whose restore failed.
    pub const ERROR_ILLEGAL_STATE: Self = Self(401);
    pub const ERROR_NOT_FOUND: Self = Self(500);
    pub const ERROR_NOT_READY: Self = Self(600);

    pub fn is_ok(self) -> bool {
        self == Self::SUCCESS
    }
}

impl crate::interpose::real::NoLibrary for CUresult {
    const NO_LIBRARY: Self = Self::ERROR_STUB_LIBRARY;
}

impl fmt::Display for CUresult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CUresult {}", self.0)
    }
}

/// `CUcheckpointLockArgs` (cuda.h 12.8+): a timeout and reserved zeros,
/// 64 bytes. The other checkpoint calls take NULL (no optional arguments).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct CheckpointLockArgs {
    pub timeout_ms: c_uint,
    pub reserved0: c_uint,
    pub reserved1: [u64; 7],
}

const _: () = assert!(size_of::<CheckpointLockArgs>() == 64);

/// `CUdevice`: a device as the CUDA driver numbers it in this process.
/// `CUDA_VISIBLE_DEVICES` renumbers devices per process, so an ordinal is
/// neither the container's device number (`_N`, see `numbering.rs`) nor
/// NVML's index, and never a region entry.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaOrdinal(pub c_int);

impl fmt::Display for CudaOrdinal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

pub type CUdevice = CudaOrdinal;
pub type CUdeviceptr = u64;
pub type CUmemGenericAllocationHandle = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUgraphNode = *mut c_void;

/// `CU_STREAM_PER_THREAD`: the per-thread default stream as a handle.
pub const STREAM_PER_THREAD: CUstream = 2 as CUstream;
pub const ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
pub const MEM_LOCATION_TYPE_DEVICE: c_int = 1;
pub const GRAPH_NODE_TYPE_KERNEL: c_int = 0;
pub const GRAPH_NODE_TYPE_GRAPH: c_int = 4;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub channels: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

impl ArrayDescriptor {
    /// What the array holds, in bytes.
    pub fn bytes(&self) -> u64 {
        array_bytes(self.width, self.height, 1, self.format, self.channels)
    }
}

impl Array3dDescriptor {
    /// What the array holds, in bytes.
    pub fn bytes(&self) -> u64 {
        array_bytes(
            self.width,
            self.height,
            self.depth,
            self.format,
            self.channels,
        )
    }

    /// What a mipmapped array of `levels` levels holds, in bytes (each
    /// level halves every dimension).
    pub fn mipmap_bytes(&self, levels: c_uint) -> u64 {
        (0..levels.clamp(1, 32))
            .map(|l| {
                array_bytes(
                    self.width >> l,
                    self.height >> l,
                    self.depth >> l,
                    self.format,
                    self.channels,
                )
            })
            .fold(0u64, u64::saturating_add)
    }
}

/// Bytes per element of a `CUarray_format`; formats we do not model (block
/// compressed, video) are counted at 16 bytes, the widest.
fn format_bytes(format: c_uint) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => 16,
    }
}

/// The size of a `width x height x depth` array (0 dimensions count as 1).
fn array_bytes(width: usize, height: usize, depth: usize, format: c_uint, channels: c_uint) -> u64 {
    [width, height, depth]
        .iter()
        .map(|&d| d.max(1) as u64)
        .chain([format_bytes(format), u64::from(channels.max(1))])
        .fold(1u64, u64::saturating_mul)
}

/// `CUmemLocation`: for a device location (`MEM_LOCATION_TYPE_DEVICE`),
/// `id` is the device's CUDA ordinal.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemLocation {
    pub kind: c_int,
    pub id: c_int,
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAccessDesc {
    pub location: MemLocation,
    pub flags: c_int,
}

/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
pub const MEM_ACCESS_READWRITE: c_int = 3;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const MEM_ALLOCATION_PINNED: c_int = 1;

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAllocationProp {
    pub kind: c_int,
    pub handle_types: c_int,
    pub location: MemLocation,
    pub win32: *mut c_void,
    pub flags: [u8; 8],
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: VMM memory that can be
/// exported as a file descriptor (and so shared with another process).
pub const MEM_HANDLE_TYPE_POSIX_FD: c_int = 1;

/// `CUipcMemHandle`: 64 opaque bytes, passed by value to
/// `cuIpcOpenMemHandle`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcMemHandle {
    pub reserved: [u8; 64],
}

/// `CUmemPoolProps`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemPoolProps {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: MemLocation,
    pub win32: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem: c_uint,
    pub stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

/// `CUDA_KERNEL_NODE_PARAMS` (v2).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNodeParams {
    pub func: CUfunction,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem: c_uint,
    pub params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    pub kern: *mut c_void,
    pub ctx: CUcontext,
}

impl KernelNodeParams {
    /// Every field zero or NULL: what the driver fills in.
    pub const ZERO: Self = Self {
        func: std::ptr::null_mut(),
        grid: [0; 3],
        block: [0; 3],
        shared_mem: 0,
        params: std::ptr::null_mut(),
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    };
}

const _: () = {
    assert!(size_of::<ArrayDescriptor>() == 24);
    assert!(size_of::<Array3dDescriptor>() == 40);
    assert!(size_of::<MemAllocationProp>() == 32 && offset_of!(MemAllocationProp, location) == 8);
    assert!(size_of::<MemPoolProps>() == 88 && offset_of!(MemPoolProps, location) == 8);
    assert!(size_of::<LaunchConfig>() == 56 && offset_of!(LaunchConfig, stream) == 32);
    assert!(size_of::<KernelNodeParams>() == 72 && offset_of!(KernelNodeParams, params) == 40);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes_cover_every_level_and_format() {
        // 1024 x 1024 float4
        assert_eq!(array_bytes(1024, 1024, 0, 0x20, 4), 16 << 20);
        // 1-D arrays have height 0
        assert_eq!(array_bytes(4096, 0, 0, 0x01, 1), 4096);
        // unknown formats count at the widest element
        assert_eq!(array_bytes(10, 10, 10, 0x91, 1), 16_000);
        assert_eq!(array_bytes(usize::MAX, usize::MAX, 2, 0x20, 4), u64::MAX);
        // four levels of a 4096-wide float4 image: 85/64 of the first
        let d = Array3dDescriptor {
            width: 4096,
            height: 64,
            depth: 0,
            format: 0x20,
            channels: 4,
            flags: 0,
        };
        assert_eq!(d.mipmap_bytes(4), d.bytes() * 85 / 64);
    }
}

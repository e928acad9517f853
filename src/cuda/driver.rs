//! Questions vgpu asks the driver itself (through the real functions of
//! `exports.rs`, never through our hooks).
#![forbid(unsafe_code)]

use super::real;
use super::sys::*;
use crate::ffi::Out;

/// The current context, if any.
pub fn current_context() -> Option<CUcontext> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    real::cuCtxGetCurrent(Out::from(&mut ctx))
        .is_ok()
        .then_some(ctx)
        .filter(|c| !c.is_null())
}

/// How many GPUs this process sees (None before `cuInit`).
pub fn device_count() -> Option<usize> {
    let mut n = 0;
    real::cuDeviceGetCount(Out::from(&mut n))
        .is_ok()
        .then(|| usize::try_from(n).unwrap_or(0))
}

/// Whether GPU `dev` supports virtual memory management
/// (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`); None where
/// the driver does not answer.
pub fn has_vmm(dev: CUdevice) -> Option<bool> {
    let mut v = 0;
    real::cuDeviceGetAttribute(Out::from(&mut v), 102, dev)
        .is_ok()
        .then_some(v != 0)
}

/// The ordinals of the other GPUs whose kernels can reach memory on
/// `dev` (peer access) and that support virtual memory management, in
/// order.
pub fn peers_of(dev: CUdevice) -> Vec<CUdevice> {
    let n = device_count().unwrap_or(0);
    (0..n)
        .filter_map(|i| i32::try_from(i).ok().map(CudaOrdinal))
        .filter(|&d| d != dev)
        .filter(|&d| {
            let mut can = 0;
            real::cuDeviceCanAccessPeer(Out::from(&mut can), d, dev).is_ok() && can != 0
        })
        .filter(|&d| has_vmm(d) == Some(true))
        .collect()
}

/// The UUID the driver reports for ordinal `dev`.
pub fn uuid(dev: CUdevice) -> Option<[u8; 16]> {
    let mut uuid = [0u8; 16];
    (real::cuDeviceGetUuid_v2(Out::from(&mut uuid), dev).is_ok()
        || real::cuDeviceGetUuid(Out::from(&mut uuid), dev).is_ok())
    .then_some(uuid)
}

/// The ordinal of the current context's device.
pub fn current_ordinal() -> Option<CUdevice> {
    let mut dev = CudaOrdinal(-1);
    real::cuCtxGetDevice(Out::from(&mut dev))
        .is_ok()
        .then_some(dev)
}

/// Whether the primary context of `dev` is still alive.
pub fn primary_active(dev: CUdevice) -> bool {
    let (mut flags, mut active) = (0, 0);
    real::cuDevicePrimaryCtxGetState(dev, Out::from(&mut flags), Out::from(&mut active)).is_ok()
        && active != 0
}

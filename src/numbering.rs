//! The container's device numbers: what the `_N` of
//! `CUDA_DEVICE_MEMORY_LIMIT_N` names. One definition for every path
//! (docs/reliability.md, "Which device `_N` names"):
//! 1. where `NVIDIA_VISIBLE_DEVICES` lists GPU UUIDs (as HAMi's device
//!    plugin sets it), a device's position in that list;
//! 2. otherwise its NVML index: NVML's enumeration of the devices the
//!    container can see, which `CUDA_VISIBLE_DEVICES` does not change;
//! 3. never a process's CUDA ordinal, which `CUDA_VISIBLE_DEVICES`
//!    renumbers: a per-rank launcher's `CUDA_VISIBLE_DEVICES=1` would
//!    otherwise give the second card the first card's limit, and, region
//!    limits winning, give it to every later process of the container.
//!
//! Without either (NVML unavailable, no UUID list) the number is unknown,
//! and the device gets the least of the limits the environment sets
//! (`Config::limits_for`): fail closed.
#![forbid(unsafe_code)]

use crate::config::{Config, DeviceNumber};
use crate::nvml::sys::NvmlIndex;

/// The container's number for the device `uuid`; `nvml_index` is asked
/// only when `NVIDIA_VISIBLE_DEVICES` does not say.
pub fn number_of(
    config: &Config,
    uuid: &[u8; 16],
    nvml_index: impl FnOnce() -> Option<NvmlIndex>,
) -> Option<DeviceNumber> {
    if let Some(pos) = config
        .visible_uuids
        .as_ref()
        .and_then(|list| list.iter().position(|u| u == uuid))
    {
        return Some(DeviceNumber::new(pos));
    }
    nvml_index().map(|i| DeviceNumber::new(i.0 as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuid(last: u8) -> [u8; 16] {
        let mut u = [0x51; 16];
        u[15] = last;
        u
    }

    #[test]
    fn the_uuid_list_wins_then_nvml_decides() {
        let mut c = Config::default();
        let n =
            |c: &Config, last, nvml: Option<u32>| number_of(c, &uuid(last), || nvml.map(NvmlIndex));
        assert_eq!(n(&c, 1, Some(1)), Some(DeviceNumber::new(1)));
        assert_eq!(n(&c, 1, None), None);
        c.visible_uuids = Some(vec![uuid(1), uuid(0)]);
        assert_eq!(n(&c, 1, Some(1)), Some(DeviceNumber::new(0)));
        assert_eq!(n(&c, 0, None), Some(DeviceNumber::new(1)));
        // A device the list does not name: NVML's order.
        assert_eq!(n(&c, 7, Some(3)), Some(DeviceNumber::new(3)));
    }
}

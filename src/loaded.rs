//! The line that proves vgpu is loaded: logged once per process at
//! `LIBCUDA_LOG_LEVEL=2` (info) when it attaches to a region, naming the
//! limits and the region, so that an operator can check a pod
//! (docs/kubernetes.md) without the debug output of level 4.
#![forbid(unsafe_code)]

use vgpu_shm::{CorePolicy, EntryIndex, Limits, Region, format_uuid};

use crate::config::{Config, DEVICE_NUMBERS};
use crate::log::fmt_bytes;

/// The line for a process that attached to `region` with `config`.
pub fn line(region: &Region, config: &Config) -> String {
    let held: Vec<([u8; 16], Limits)> = EntryIndex::all()
        .map(|d| region.device(d))
        .filter(|d| d.is_used())
        .map(|d| (d.uuid(), d.limits()))
        .collect();
    let place = if region.is_shared() {
        format!("region {}", region.path().display())
    } else {
        "a private region (this process alone)".to_string()
    };
    describe(&place, config, &held)
}

/// The line, from what it names: where the region is, the environment's
/// limits, and the limits the region holds already for its devices.
fn describe(place: &str, config: &Config, held: &[([u8; 16], Limits)]) -> String {
    let mut out = format!("vgpu {} loaded, {place}: ", env!("CARGO_PKG_VERSION"));
    let mem = per_device(config.mem_limit, &config.mem_limit_n, |b| fmt_bytes(*b));
    let sm = per_device(config.sm_limit, &config.sm_limit_n, |p| format!("{p}%"));
    match (mem, sm) {
        (None, None) => out.push_str("no limits in the environment"),
        (mem, sm) => {
            out.push_str(&format!(
                "memory limit {}, SM limit {}, policy {}",
                mem.as_deref().unwrap_or("none"),
                sm.as_deref().unwrap_or("none"),
                policy(config.policy)
            ));
        }
    }
    if !held.is_empty() {
        let devices: Vec<String> = held
            .iter()
            .map(|(uuid, l)| {
                let mem = if l.mem == 0 {
                    "none".to_string()
                } else {
                    fmt_bytes(l.mem)
                };
                let sm = if l.sm == 0 {
                    "none".to_string()
                } else {
                    format!("{}%", l.sm)
                };
                format!(
                    "{} memory {mem} SM {sm} policy {}",
                    format_uuid(uuid),
                    policy(l.policy)
                )
            })
            .collect();
        out.push_str(&format!(
            "; the region's limits (they win): {}",
            devices.join(", ")
        ));
    }
    out
}

/// A limit without a suffix and its `_N` overrides, e.g. "2.00 GiB (device
/// 1: 1.00 GiB)"; None when neither is set.
fn per_device<T>(
    global: Option<T>,
    per: &[Option<T>; DEVICE_NUMBERS],
    show: impl Fn(&T) -> String,
) -> Option<String> {
    let devices: Vec<String> = per
        .iter()
        .enumerate()
        .filter_map(|(n, v)| v.as_ref().map(|v| format!("device {n}: {}", show(v))))
        .collect();
    match (global, devices.is_empty()) {
        (None, true) => None,
        (Some(g), true) => Some(show(&g)),
        (None, false) => Some(devices.join(", ")),
        (Some(g), false) => Some(format!("{} ({})", show(&g), devices.join(", "))),
    }
}

fn policy(p: CorePolicy) -> &'static str {
    match p {
        CorePolicy::Default => "default",
        CorePolicy::Force => "force",
        CorePolicy::Disable => "disable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_region_and_every_limit() {
        let mut c = Config {
            mem_limit: Some(2 << 30),
            sm_limit: Some(30),
            ..Config::default()
        };
        c.mem_limit_n[1] = Some(1 << 30);
        let line = describe("region /tmp/vgpu/a.cache", &c, &[]);
        assert!(
            line.starts_with("vgpu ") && line.contains(" loaded, region /tmp/vgpu/a.cache: "),
            "{line}"
        );
        assert!(
            line.ends_with(
                "memory limit 2.00 GiB (device 1: 1.00 GiB), SM limit 30%, policy default"
            ),
            "{line}"
        );
    }

    #[test]
    fn without_limits_it_says_so_and_names_the_regions() {
        let held = [(
            [0x11; 16],
            Limits {
                mem: 4 << 30,
                sm: 0,
                policy: CorePolicy::Force,
            },
        )];
        let line = describe("region /r.cache", &Config::default(), &held);
        assert!(line.contains("no limits in the environment"), "{line}");
        assert!(
            line.ends_with(
                "the region's limits (they win): GPU-11111111-1111-1111-1111-111111111111 memory 4.00 GiB SM none policy force"
            ),
            "{line}"
        );
    }

    #[test]
    fn an_sm_limit_alone_is_named() {
        let mut c = Config::default();
        c.sm_limit_n[0] = Some(50);
        let line = describe("region /r.cache", &c, &[]);
        assert!(
            line.ends_with("memory limit none, SM limit device 0: 50%, policy default"),
            "{line}"
        );
    }
}

//! Unit tests of the environment's parsing.

use std::ffi::OsString;

use log::LevelFilter;
use vgpu_shm::Limits;

use super::parse::*;
use super::*;

fn cfg(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| {
        vars.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| OsString::from(v))
    })
}

#[test]
fn memory_units_follow_hami_core() {
    assert_eq!(parse_bytes("1073741824"), Some(1 << 30));
    assert_eq!(parse_bytes("1048576k"), Some(1 << 30));
    assert_eq!(parse_bytes("1024M"), Some(1 << 30));
    assert_eq!(parse_bytes(" 4g "), Some(4 << 30));
    assert_eq!(parse_bytes("4G"), Some(4 << 30));
    for bad in [
        "",
        "g",
        "4q",
        "-1g",
        "4.5g",
        "4gb",
        "99999999999999999999",
        "18014398509481984g",
    ] {
        assert_eq!(parse_bytes(bad), None, "{bad:?}");
    }
}

#[test]
fn per_ordinal_limits_override_the_global_one() {
    let c = cfg(&[
        ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "2g"),
        ("CUDA_DEVICE_SM_LIMIT_1", "30"),
    ])
    .unwrap();
    let (n0, n1) = (DeviceNumber::new(0), DeviceNumber::new(1));
    assert_eq!(c.mem_limit_for(n0), 4 << 30);
    assert_eq!(c.mem_limit_for(n1), 2 << 30);
    assert_eq!((c.sm_limit_for(n0), c.sm_limit_for(n1)), (0, 30));
    assert!(c.has_limits() && c.has_per_device_limits());
    assert!(!cfg(&[]).unwrap().has_limits());
    assert!(
        !cfg(&[("CUDA_DEVICE_MEMORY_LIMIT", "4g")])
            .unwrap()
            .has_per_device_limits()
    );
}

#[test]
fn a_device_of_unknown_number_gets_the_least_limit() {
    let c = cfg(&[
        ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "2g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_2", "6g"),
        ("CUDA_DEVICE_SM_LIMIT_3", "30"),
    ])
    .unwrap();
    let unknown = c.limits_for(None);
    assert_eq!((unknown.mem, unknown.sm), (2 << 30, 30));
    let two = c.limits_for(Some(DeviceNumber::new(2)));
    assert_eq!((two.mem, two.sm), (6 << 30, 0));
    // Numbers past the last suffix get the variable without one.
    assert_eq!(c.limits_for(Some(DeviceNumber::new(40))).mem, 4 << 30);
    assert_eq!(cfg(&[]).unwrap().limits_for(None), Limits::default());
}

#[test]
fn nvidia_visible_devices_counts_only_as_a_uuid_list() {
    let a = "GPU-51516d67-9000-0000-0000-000000000001";
    let b = "GPU-51516d67-9000-0000-0000-000000000000";
    let c = cfg(&[("NVIDIA_VISIBLE_DEVICES", &format!("{a}, {b}"))]).unwrap();
    let list = c.visible_uuids.unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0][15], 1);
    for other in ["all", "none", "void", "0,1", "", &format!("{a},1")] {
        let c = cfg(&[("NVIDIA_VISIBLE_DEVICES", other)]).unwrap();
        assert_eq!(c.visible_uuids, None, "{other:?}");
    }
}

#[test]
fn bad_limits_are_errors_that_name_the_variable() {
    let e = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT_1", "4q")]).unwrap_err();
    assert_eq!(e.var, "CUDA_DEVICE_MEMORY_LIMIT_1");
    assert!(
        e.to_string()
            .starts_with("CUDA_DEVICE_MEMORY_LIMIT_1=\"4q\": expected bytes"),
        "{e}"
    );
    assert_eq!(
        cfg(&[("CUDA_DEVICE_SM_LIMIT", "130")]).unwrap_err().var,
        "CUDA_DEVICE_SM_LIMIT"
    );
    assert_eq!(
        cfg(&[("CUDA_DEVICE_SM_LIMIT", "3O")]).unwrap_err().var,
        "CUDA_DEVICE_SM_LIMIT"
    );
    assert_eq!(
        cfg(&[("GPU_CORE_UTILIZATION_POLICY", "strict")])
            .unwrap_err()
            .var,
        "GPU_CORE_UTILIZATION_POLICY"
    );
}

fn cfg_named(vars: &[(&str, &str)], secure: bool) -> Result<Config, ConfigError> {
    Config::from_vars(
        vars.iter().map(|(k, _)| *k),
        |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        },
        secure,
    )
}

#[test]
fn number_suffixes_must_be_canonical_and_in_range() {
    for good in ["0", "7", "15"] {
        assert!(parse_number(good).is_some(), "{good}");
    }
    for bad in ["", "16", "99999", "00", "07", "-1", "+1", "x", "1 "] {
        assert_eq!(parse_number(bad), None, "{bad:?}");
    }
    let e = cfg_named(&[("CUDA_DEVICE_SM_LIMIT_00", "30")], false).unwrap_err();
    assert_eq!(e.var, "CUDA_DEVICE_SM_LIMIT_00");
    assert!(cfg_named(&[("CUDA_DEVICE_MEMORY_LIMIT_15", "1g")], false).is_ok());
    // Names that only share a prefix are not ours.
    assert!(cfg_named(&[("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/r")], false).is_ok());
}

#[test]
fn region_settings_parse_and_relative_paths_are_refused() {
    let c = cfg(&[("VGPU_REGION_MODE", "0660"), ("VGPU_REGION_ANY_OWNER", "1")]).unwrap();
    assert_eq!((c.region_mode, c.region_any_owner), (0o660, true));
    assert_eq!(cfg(&[]).unwrap().region_mode, 0o666);
    for bad in ["0777", "4666", "0066", "rw", ""] {
        assert_eq!(
            cfg(&[("VGPU_REGION_MODE", bad)]).unwrap_err().var,
            "VGPU_REGION_MODE"
        );
    }
    let e = cfg(&[("CUDA_DEVICE_MEMORY_SHARED_CACHE", "vgpu.cache")]).unwrap_err();
    assert_eq!(e.var, "CUDA_DEVICE_MEMORY_SHARED_CACHE");
}

#[test]
fn secure_execution_reads_limits_only() {
    let vars = [
        ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/root/x.cache"),
        ("LIBCUDA_LOG_LEVEL", "4"),
        ("CUDA_DISABLE_CONTROL", "1"),
        ("GPU_CORE_UTILIZATION_POLICY", "disable"),
        ("VGPU_REGION_MODE", "0600"),
        ("VGPU_REGION_ANY_OWNER", "1"),
        ("VGPU_TEST_PANIC", "cuInit"),
        ("VGPU_TEST_HOLD_LOCK", "contexts"),
    ];
    let c = cfg_named(&vars, true).unwrap();
    assert_eq!(c.mem_limit, Some(1 << 30));
    assert!(c.secure && c.shared_cache.is_none() && !c.disable_control);
    assert_eq!(c.log_level, LevelFilter::Warn);
    assert_eq!(c.policy, CorePolicy::Default);
    assert_eq!((c.region_mode, c.region_any_owner), (0o666, false));
    assert!(c.test_panic.is_none() && c.test_hold_lock.is_none() && c.warnings.is_empty());
    // A bad limit is still an error: it can only narrow.
    assert!(cfg_named(&[("CUDA_DEVICE_MEMORY_LIMIT", "4q")], true).is_err());
    assert!(!c.without_limits().has_limits());
}

#[test]
fn zero_and_hundred_percent_mean_unlimited() {
    assert_eq!(
        cfg(&[("CUDA_DEVICE_SM_LIMIT", "0")]).unwrap().sm_limit,
        None
    );
    assert_eq!(
        cfg(&[("CUDA_DEVICE_SM_LIMIT", "100")]).unwrap().sm_limit,
        None
    );
    assert_eq!(
        cfg(&[("CUDA_DEVICE_SM_LIMIT", "30")]).unwrap().sm_limit,
        Some(30)
    );
}

#[test]
fn soft_variables_warn_and_keep_defaults() {
    let c = cfg(&[
        ("LIBCUDA_LOG_LEVEL", "loud"),
        ("CUDA_DISABLE_CONTROL", "maybe"),
    ])
    .unwrap();
    assert_eq!(c.log_level, LevelFilter::Warn);
    assert!(!c.disable_control);
    assert_eq!(c.warnings.len(), 2);
    assert!(
        cfg(&[("CUDA_DISABLE_CONTROL", "TRUE")])
            .unwrap()
            .disable_control
    );
    assert_eq!(
        cfg(&[("GPU_CORE_UTILIZATION_POLICY", "FORCE")])
            .unwrap()
            .policy,
        CorePolicy::Force
    );
}

#[test]
fn task_priority_is_0_or_1_and_anything_else_warns_and_stays_normal() {
    assert_eq!(cfg(&[]).unwrap().task_priority, 1);
    assert_eq!(
        cfg(&[("CUDA_TASK_PRIORITY", "0")]).unwrap().task_priority,
        0
    );
    for bad in ["2", "-1", "high", ""] {
        let c = cfg(&[("CUDA_TASK_PRIORITY", bad)]).unwrap();
        assert_eq!(c.task_priority, 1, "{bad:?}");
        assert_eq!(c.warnings[0].var, "CUDA_TASK_PRIORITY");
    }
    // Secure execution: an untrusted environment takes no priority.
    let c = cfg_named(&[("CUDA_TASK_PRIORITY", "0")], true).unwrap();
    assert_eq!(c.task_priority, 1);
}

#[test]
fn oversubscription_settings_are_whole_milliseconds_and_bad_ones_warn_and_keep_defaults() {
    let d = Oversub::default();
    assert_eq!(
        (d.wait_ms, d.restore_wait_ms, d.idle_ms),
        (30_000, 600_000, 2_000)
    );
    let c = cfg(&[
        ("VGPU_OVERSUBSCRIBE_WAIT_MS", "1500"),
        ("VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS", " 90000 "),
        ("VGPU_OVERSUBSCRIBE_IDLE_MS", "0"),
        ("VGPU_OVERSUBSCRIBE_HOST_LIMIT", "64g"),
    ])
    .unwrap();
    assert_eq!(
        (
            c.oversub.wait_ms,
            c.oversub.restore_wait_ms,
            c.oversub.idle_ms
        ),
        (1500, 90_000, 0)
    );
    assert_eq!(c.oversub.host_limit, Some(64 << 30));
    assert!(c.warnings.is_empty());
    assert_eq!(d.quantum_ms, None);
    let c = cfg(&[("VGPU_OVERSUBSCRIBE_QUANTUM_MS", "2000")]).unwrap();
    assert_eq!((c.oversub.quantum_ms, c.warnings.len()), (Some(2000), 0));
    let c = cfg(&[("VGPU_OVERSUBSCRIBE_QUANTUM_MS", "2s")]).unwrap();
    assert_eq!(c.oversub.quantum_ms, None);
    assert_eq!(c.warnings[0].var, "VGPU_OVERSUBSCRIBE_QUANTUM_MS");
    assert!(
        c.warnings[0].to_string().contains(
            "VGPU_OVERSUBSCRIBE_QUANTUM_MS=\"2s\": expected a whole number of milliseconds"
        ),
        "{}",
        c.warnings[0]
    );
    for bad in ["10m", "-1", "1.5", "", "forever", "99999999999999999999999"] {
        let c = cfg(&[("VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS", bad)]).unwrap();
        assert_eq!(c.oversub.restore_wait_ms, 600_000, "{bad:?}");
        assert_eq!(c.warnings.len(), 1, "{bad:?}");
        assert_eq!(c.warnings[0].var, "VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS");
        assert!(
            c.warnings[0]
                .to_string()
                .contains("a whole number of milliseconds"),
            "{}",
            c.warnings[0]
        );
    }
    // Secure execution reads none of them.
    let c = cfg_named(&[("VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS", "5")], true).unwrap();
    assert_eq!(c.oversub.restore_wait_ms, 600_000);
}

#[test]
fn the_sm_period_is_whole_milliseconds_from_10_to_1000_and_a_bad_one_warns() {
    assert_eq!(cfg(&[]).unwrap().sm_period_ms, None);
    let c = cfg(&[("VGPU_SM_PERIOD_MS", " 20 ")]).unwrap();
    assert_eq!((c.sm_period_ms, c.warnings.len()), (Some(20), 0));
    for bad in ["9", "1001", "0", "20ms", "-5", ""] {
        let c = cfg(&[("VGPU_SM_PERIOD_MS", bad)]).unwrap();
        assert_eq!(c.sm_period_ms, None, "{bad:?}");
        assert_eq!(c.warnings.len(), 1, "{bad:?}");
        assert!(c.warnings[0].to_string().contains("VGPU_SM_PERIOD_MS"));
    }
}

#[test]
fn the_vmm_setting_is_auto_by_default_and_a_bad_value_warns_and_keeps_it() {
    assert_eq!(Oversub::default().vmm, Vmm::Auto);
    assert_eq!(Vmm::parse(" AUTO "), Some(Vmm::Auto));
    let on = cfg(&[("VGPU_OVERSUBSCRIBE_VMM", "true")]).unwrap();
    assert_eq!(on.oversub.vmm, Vmm::Always);
    let off = cfg(&[("VGPU_OVERSUBSCRIBE_VMM", "0")]).unwrap();
    assert_eq!(off.oversub.vmm, Vmm::Never);
    let c = cfg(&[("VGPU_OVERSUBSCRIBE_VMM", "maybe")]).unwrap();
    assert_eq!(c.oversub.vmm, Vmm::Auto);
    assert_eq!(c.oversub.quantum_ms, None);
    assert_eq!(c.warnings.len(), 1);
    assert_eq!(
        c.warnings[0].to_string(),
        "VGPU_OVERSUBSCRIBE_VMM=\"maybe\": expected auto, true or false"
    );
}

#[test]
fn the_default_quantum_is_the_one_the_switch_rate_gives_and_a_set_one_stays() {
    assert_eq!(cfg(&[]).unwrap().oversub.quantum_ms, None);
    assert_eq!(default_quantum_ms(true), DEFAULT_VMM_QUANTUM_MS);
    assert_eq!(default_quantum_ms(false), DEFAULT_QUANTUM_MS);
    assert_eq!(
        (DEFAULT_VMM_QUANTUM_MS, DEFAULT_QUANTUM_MS),
        (80_000, 660_000)
    );
    let set = cfg(&[("VGPU_OVERSUBSCRIBE_QUANTUM_MS", "15000")]).unwrap();
    assert_eq!(set.oversub.quantum_ms, Some(15_000));
    let never = cfg(&[("VGPU_OVERSUBSCRIBE_QUANTUM_MS", "0")]).unwrap();
    assert_eq!(never.oversub.quantum_ms, Some(0));
    // A bad one warns and keeps the default of how the switches move.
    let c = cfg(&[("VGPU_OVERSUBSCRIBE_QUANTUM_MS", "1m")]).unwrap();
    assert_eq!((c.oversub.quantum_ms, c.warnings.len()), (None, 1));
}

#[test]
fn the_sm_turns_setting_reads_auto_true_and_false_and_a_bad_one_warns() {
    assert_eq!(Turns::parse("auto"), Some(Turns::Auto));
    assert_eq!(Turns::parse(" AUTO "), Some(Turns::Auto));
    assert_eq!(Turns::parse("true"), Some(Turns::Always));
    assert_eq!(Turns::parse("0"), Some(Turns::Never));
    assert_eq!(Turns::parse("sometimes"), None);
    assert_eq!(cfg(&[]).unwrap().sm_turns, Turns::Auto);
    let c = cfg(&[("VGPU_SM_TURNS", "false")]).unwrap();
    assert_eq!((c.sm_turns, c.warnings.len()), (Turns::Never, 0));
    let c = cfg(&[("VGPU_SM_TURNS", "sometimes")]).unwrap();
    assert_eq!((c.sm_turns, c.warnings.len()), (Turns::Auto, 1));
    let c = cfg(&[("VGPU_SM_BOARD_DIR", "relative/dir")]).unwrap();
    assert_eq!((c.sm_board_dir, c.warnings.len()), (None, 1));
    let c = cfg(&[("VGPU_SM_BOARD_DIR", "/tmp/vgpulock")]).unwrap();
    assert_eq!(c.sm_board_dir, Some("/tmp/vgpulock".into()));
}

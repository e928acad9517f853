//! Lazy initialisation, on the first hook call: read the environment, find
//! the container's region, attach. Nothing runs in a constructor, so the
//! many processes that load us through /etc/ld.so.preload and never touch
//! CUDA pay nothing.
//!
//! Where the region is (DESIGN.md, "The shared region"):
//! 1. `CUDA_DEVICE_MEMORY_SHARED_CACHE`, created if missing;
//! 2. a `*.cache` region in the directory of libvgpu.so itself (HAMi's
//!    device plugin mounts the container's cache directory there), so a
//!    shell that lost its environment still lands in its container's region;
//! 3. HAMi-core's default, `/tmp/cudevshr.cache`: attached if it exists,
//!    created if the environment sets a limit;
//! 4. otherwise nothing is limited and every call passes through.
//!
//! When a region exists but cannot be used (a symbolic link, not a
//! regular file, owned by another user, corrupt), see docs/reliability.md:
//! limits from the environment are enforced for this process alone; with
//! none, the process runs unlimited. When it exists but cannot be opened
//! for writing, the container's limits may live only there: with no
//! limits of its own the process is refused CUDA, with the reason.
//!
//! In a secure-execution process (`AT_SECURE`: setuid, setgid, file
//! capabilities) the environment belongs to whoever started it: no path
//! is taken from it and nothing is created. An existing region found
//! without the environment (steps 2 and 3) is joined without registering
//! the environment's limits; otherwise those limits bind this process
//! alone, in private memory.

use std::ffi::{CStr, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use vgpu_shm::{FileOptions, Refusal, Region, ShmError};

use crate::attach::{Attach, OnSlot};
use crate::config::Config;
use crate::guard::Guard;
use crate::quota::restore::restore_usage;
use crate::watcher;

/// HAMi-core's default region path.
pub const DEFAULT_REGION: &str = "/tmp/cudevshr.cache";

pub struct Runtime {
    pub config: Config,
    /// Why CUDA initialisation is refused (a bad variable, a region that
    /// cannot be written), as logged.
    pub refused: Option<String>,
    /// None: nothing to enforce, every call passes through.
    pub attach: Option<Attach>,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

pub fn runtime() -> &'static Runtime {
    RUNTIME.get_or_init(|| {
        let _internal = Guard::enter();
        Runtime::start()
    })
}

/// The attachment, if anything is being enforced.
pub fn attach() -> Option<&'static Attach> {
    runtime().attach.as_ref()
}

/// The attachment, if the runtime has started and enforces anything;
/// never starts it (a free: nothing can have been counted before).
pub fn attach_if_started() -> Option<&'static Attach> {
    started()?.attach.as_ref()
}

/// The runtime if it has started, without starting it.
pub fn started() -> Option<&'static Runtime> {
    RUNTIME.get()
}

/// Starts the runtime, if it has not started (what the entry paths need
/// of `init`: the bits it sets in `duty.rs` are then true).
pub fn start() {
    let _ = runtime();
}

/// Whether `CUDA_DISABLE_CONTROL` is set: the one flag in `duty.rs`, with
/// the runtime started first (an entry path may be a program's first use
/// of vgpu, a lookup before any hook).
pub fn control_disabled() -> bool {
    start();
    crate::duty::control_disabled()
}

impl Runtime {
    fn start() -> Runtime {
        let secure = secure_execution();
        let (config, bad) = match Config::from_env(secure) {
            Ok(c) => (c, None),
            Err(e) => (
                Config {
                    secure,
                    ..Config::default()
                },
                Some(e),
            ),
        };
        crate::log::init(config.log_level);
        if config.disable_control {
            crate::duty::disable_control();
        }
        if !crate::unwind::load() {
            log::warn!(
                "libgcc_s.so.1 could not be loaded: an internal error of vgpu would abort this process instead of being caught"
            );
        }
        if let Some(hook) = &config.test_panic {
            crate::guard::set_test_panic(hook);
        }
        for w in &config.warnings {
            log::warn!("{w}; using the default");
        }
        let refuse = |config: Config, why: String| {
            log::error!("{why}");
            Runtime {
                config,
                refused: Some(why),
                attach: None,
            }
        };
        if let Some(e) = bad {
            let why = format!("{e}; CUDA initialisation is refused until the variable is fixed");
            return refuse(config, why);
        }
        if config.disable_control {
            log::info!("CUDA_DISABLE_CONTROL is set: every call passes through unlimited");
            return Runtime {
                config,
                refused: None,
                attach: None,
            };
        }
        if config.oversubscribe {
            // Before oversubscription turns on: the trampolines of functions
            // without a hook restore a suspended process first.
            crate::interpose::trampoline::set_gate(crate::oversub::gate);
            crate::oversub::start(&config.oversub, config.task_priority, OVERSUB_ABOVE);
        }
        if let Some(ms) = config.sm_period_ms {
            crate::limiter::turns::set_period_ms(ms);
        }
        crate::limiter::pacing::configure(config.sm_turns, config.sm_board_dir.clone());
        crate::limiter::rest::configure(config.sm_yield);
        let found = find_region(&config);
        crate::fork::install(|| started()?.attach.as_ref());
        match found {
            Ok(found) => Runtime {
                attach: found.map(|(r, shared_config)| {
                    // The line that proves vgpu is loaded (level 2).
                    log::info!("{}", crate::loaded::line(&r, &shared_config));
                    Attach::new(r, shared_config, ON_SLOT)
                }),
                config,
                refused: None,
            },
            Err(why) => refuse(config, why),
        }
    }
}

/// A slot claimed starts the watcher; a new slot is filled again by the
/// quota.
const ON_SLOT: OnSlot = OnSlot {
    claimed: || {
        if let Some(attach) = attach() {
            watcher::start(attach);
        }
    },
    refill: restore_usage,
};

/// What oversubscription needs from above: the attachment (a restore a
/// hook asked for beats the slot while it waits), and the watcher's kick.
const OVERSUB_ABOVE: crate::oversub::Above = crate::oversub::Above {
    attach,
    kick: watcher::kick,
};

/// Whether this process runs in secure-execution mode (`AT_SECURE`).
/// `VGPU_TEST_SECURE=1` forces it, for tests where no setuid program can
/// be run (it only ever narrows what vgpu takes from the environment).
fn secure_execution() -> bool {
    // SAFETY: getauxval reads the auxiliary vector the kernel gave this
    // process; AT_SECURE is a defined entry type (0 when absent).
    let at_secure = unsafe { libc::getauxval(libc::AT_SECURE) } != 0;
    at_secure || std::env::var_os("VGPU_TEST_SECURE").is_some_and(|v| v == "1")
}

type Found = Result<Option<(Region, Config)>, String>;

/// The region to attach to and the configuration to register in it, or
/// why CUDA is refused (module docs).
fn find_region(config: &Config) -> Found {
    let limited = config.has_limits();
    let private = || Region::anonymous().ok().map(|r| (r, config.clone()));
    let unusable = |e: ShmError| -> Found {
        if let Some(kept) = hami_core_limits(config, &e) {
            // HAMi-core's file, in use by HAMi-core processes: its limits
            // bind this process alone.
            log::error!("{e}");
            return Ok(Region::anonymous().ok().map(|r| (r, kept)));
        }
        if limited {
            log::error!("{e}; the limits in this process's environment are enforced for it alone");
            Ok(private())
        } else if e.cannot_write() {
            Err(format!(
                "{e}; this process has no limits of its own and its container's may be in that region: CUDA initialisation is refused (let this user write it, e.g. VGPU_REGION_MODE=0666 for whoever creates it)"
            ))
        } else {
            log::error!("{e}; no limits in the environment: running unlimited");
            Ok(None)
        }
    };
    let opts = |create: bool| FileOptions {
        create: create.then_some(config.region_mode),
        any_owner: config.region_any_owner,
    };
    let default = Path::new(DEFAULT_REGION);
    let default_exists = std::fs::symlink_metadata(default).is_ok();
    if config.secure {
        let shared = config.without_limits();
        if let Some(r) = own_directory().and_then(|d| region_in(&d, opts(false))) {
            return Ok(Some((r, shared)));
        }
        if !default_exists {
            return Ok(if limited { private() } else { None });
        }
        return match Region::open_with(default, opts(false)) {
            Ok(r) => Ok(Some((r, shared))),
            Err(e) => unusable(e),
        };
    }
    let attach = |path: &Path, create: bool| match Region::open_with(path, opts(create)) {
        Ok(r) => {
            if r.created()
                && let Some(h) = r.hami()
            {
                h.set_priority(config.task_priority);
            }
            Ok(Some((r, config.clone())))
        }
        Err(e) => unusable(e),
    };
    if let Some(path) = &config.shared_cache {
        return attach(path, true);
    }
    if let Some(r) = own_directory().and_then(|d| region_in(&d, opts(false))) {
        return Ok(Some((r, config.clone())));
    }
    if default_exists || limited {
        return attach(default, !default_exists);
    }
    Ok(None)
}

/// When `e` refuses a HAMi-core file that HAMi-core processes still use:
/// `config` with the file's limits in place of the environment's for the
/// devices it limits (limits stored in a region win).
fn hami_core_limits(config: &Config, e: &ShmError) -> Option<Config> {
    let ShmError::Refused {
        why: Refusal::HamiCoreInUse { limits, .. },
        ..
    } = e
    else {
        return None;
    };
    let mut kept = config.clone();
    for l in limits {
        if let Some(m) = kept.mem_limit_n.get_mut(l.index)
            && l.mem != 0
        {
            *m = Some(l.mem);
        }
        if let Some(s) = kept.sm_limit_n.get_mut(l.index)
            && l.sm != 0
        {
            *s = Some(l.sm);
        }
    }
    Some(kept)
}

/// The directory libvgpu.so was loaded from (the stub's, when it loaded
/// us: our own file may be a memfd).
fn own_directory() -> Option<PathBuf> {
    if let Some(stub) = crate::interpose::stub::path() {
        let file = stub.to_str().ok()?;
        return Path::new(file).parent().map(Path::to_path_buf);
    }
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr fills `info` for an address inside a loaded object; the
    // address is one of our own functions.
    let found = unsafe { libc::dladdr(own_directory as *const c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    let file = unsafe { CStr::from_ptr(info.dli_fname) }.to_str().ok()?;
    Path::new(file).parent().map(Path::to_path_buf)
}

/// The newest valid region among the regular files `dir/*.cache`.
fn region_in(dir: &Path, opts: FileOptions) -> Option<Region> {
    let mut candidates: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cache"))
        .filter_map(|p| {
            let meta = std::fs::symlink_metadata(&p).ok()?;
            Some((
                meta.file_type()
                    .is_file()
                    .then_some(meta)?
                    .modified()
                    .ok()?,
                p,
            ))
        })
        .collect();
    candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
    candidates
        .into_iter()
        .find_map(|(_, p)| match Region::open_with(&p, opts) {
            Ok(r) => Some(r),
            Err(e) => {
                log::warn!("{e}; skipped");
                None
            }
        })
}

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
//! When a region exists but cannot be used (foreign, corrupt, unreadable),
//! see docs/reliability.md: limits from the environment are enforced for
//! this process alone; with none, the process runs unlimited.

use std::ffi::{CStr, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use vgpu_shm::{OpenMode, Region, ShmError};

use crate::attach::Attach;
use crate::config::{Config, ConfigError};
use crate::guard::Guard;

/// HAMi-core's default region path.
pub const DEFAULT_REGION: &str = "/tmp/cudevshr.cache";

pub struct Runtime {
    pub config: Config,
    /// A bad limit in the environment: CUDA initialisation is refused.
    pub refused: Option<ConfigError>,
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

/// The runtime if it has started, without starting it.
pub fn started() -> Option<&'static Runtime> {
    RUNTIME.get()
}

pub fn control_disabled() -> bool {
    runtime().config.disable_control
}

impl Runtime {
    fn start() -> Runtime {
        let (config, refused) = match Config::from_env() {
            Ok(c) => (c, None),
            Err(e) => (Config::default(), Some(e)),
        };
        crate::log::init(config.log_level);
        for w in &config.warnings {
            log::warn!("{w}; using the default");
        }
        if let Some(e) = &refused {
            log::error!("{e}; CUDA initialisation is refused until the variable is fixed");
            return Runtime {
                config,
                refused,
                attach: None,
            };
        }
        if config.disable_control {
            log::info!("CUDA_DISABLE_CONTROL is set: every call passes through unlimited");
            return Runtime {
                config,
                refused,
                attach: None,
            };
        }
        if config.oversubscribe {
            log::warn!("CUDA_OVERSUBSCRIBE is not supported: memory limits are enforced as usual");
        }
        let attach = open_region(&config).map(|r| {
            log::debug!("attached to region {}", r.path().display());
            Attach::new(r, config.clone())
        });
        crate::fork::install();
        Runtime {
            config,
            refused,
            attach,
        }
    }
}

fn open_region(config: &Config) -> Option<Region> {
    let limited = config.has_limits();
    let fallback = |e: ShmError| {
        if limited {
            log::error!("{e}; the limits in this process's environment are enforced for it alone");
            Region::anonymous().ok()
        } else {
            log::error!("{e}; no limits in the environment: running unlimited");
            None
        }
    };
    let open = |path: &Path, mode| match Region::open(path, mode) {
        Ok(r) => Some(r),
        Err(e) => fallback(e),
    };
    if let Some(path) = &config.shared_cache {
        return open(path, OpenMode::CreateIfMissing);
    }
    if let Some(r) = own_directory().and_then(|d| region_in(&d)) {
        return Some(r);
    }
    let default = Path::new(DEFAULT_REGION);
    let mode = if default.exists() {
        OpenMode::ExistingOnly
    } else if limited {
        OpenMode::CreateIfMissing
    } else {
        return None;
    };
    open(default, mode)
}

/// The directory libvgpu.so was loaded from.
fn own_directory() -> Option<PathBuf> {
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

/// The newest valid region among `dir/*.cache`.
fn region_in(dir: &Path) -> Option<Region> {
    let mut candidates: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cache"))
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
    candidates
        .into_iter()
        .find_map(|(_, p)| match Region::open(&p, OpenMode::ExistingOnly) {
            Ok(r) => Some(r),
            Err(e) => {
                log::warn!("{e}; skipped");
                None
            }
        })
}

//! NVIDIA GPU discovery and injection, without nvidia-container-toolkit.
//!
//! ```text
//! discover(opts, inventory) -> Driver        what the host (or --driver-root) has
//!   nvml::GpuInventory                       NVML (dlopen) or a fake: version, GPUs
//!   ldcache + driver                         libraries, binaries, firmware, sockets
//!   devices                                  /dev/nvidia* with majors/minors from stat
//! GpuRequest::parse("all"|"none"|"0,GPU-..") what the job asked for (--gpus)
//! select::select(driver, request)            -> the GPUs a sandbox gets
//! select::split(gpus, agents, per_agent)     -> the GPUs of each agent slot
//!   graphics                                 EGL/Vulkan loader JSON files, Xorg modules
//! inject::edits(driver, gpus, caps)          -> ContainerEdits (the only output)
//! cdi::Registry + cdi::edits                 same output from CDI spec files
//! edits_for(driver, cdi, request, caps)      native or CDI edits for a request
//! compat::check(rootfs, driver, gpus)        rootfs CUDA vs driver CUDA (before a job)
//! job_edits(opts, request, caps, rootfs)     all of the above with the real NVML: one call per job
//! list(opts, caps) -> report::Report         what `azp-sandbox gpu list [--json]` prints
//!   services::warnings                       persistenced, fabric manager, IMEX, MIG nodes
//! ```

pub mod cdi;
pub mod compat;
pub mod devices;
pub mod driver;
pub mod elf;
pub mod found;
pub mod graphics;
pub mod inject;
pub mod ldcache;
pub mod nvml;
pub mod paths;
pub mod report;
pub mod select;
pub mod services;

use crate::edits::ContainerEdits;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;

pub use devices::Devices;
pub use driver::Capabilities;
pub use found::{Binary, FirmwareFile, LibGroup, Library, Socket};
pub use nvml::{FakeInventory, GpuInventory, NoInventory, NvmlInventory};
pub use select::{GpuRequest, PerAgent};

/// Where discovery looks.
#[derive(Debug, Clone)]
pub struct DiscoverOptions {
    /// Root of the driver installation (`--driver-root`, default `/`). Every path below
    /// (ld.so.cache, /dev, bin dirs, firmware, sockets) is taken inside it.
    pub driver_root: PathBuf,
    /// Library dirs outside the linker cache, as seen inside `driver_root`
    /// (e.g. `/usr/local/nvidia/lib64` on Kubernetes nodes).
    pub extra_lib_dirs: Vec<PathBuf>,
    /// `--cdi-spec FILE`: use only this CDI spec (otherwise `/etc/cdi`, `/var/run/cdi`).
    pub cdi_spec: Option<PathBuf>,
}

impl Default for DiscoverOptions {
    fn default() -> Self {
        DiscoverOptions {
            driver_root: PathBuf::from("/"),
            extra_lib_dirs: vec![PathBuf::from("/usr/local/nvidia/lib64")],
            cdi_spec: None,
        }
    }
}

/// One GPU as a job may be given it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuInfo {
    /// NVML index (or position among `/dev/nvidia<N>` nodes when NVML is unavailable).
    pub index: u32,
    /// `GPU-xxxxxxxx-...`; unknown without NVML.
    pub uuid: Option<String>,
    pub name: String,
    /// Minor number: the GPU's node is `/dev/nvidia<minor>`.
    pub minor: u32,
    pub memory_total_bytes: Option<u64>,
    pub compute_capability: Option<(u32, u32)>,
    pub mig_enabled: Option<bool>,
    pub pci_bus_id: Option<String>,
    pub source: GpuSource,
    /// Set when this is a MIG device of GPU `index` (whose node is still
    /// `/dev/nvidia<minor>`): its instance ids. `uuid` is then the `MIG-...` one.
    pub mig: Option<MigInstance>,
}

/// Where a MIG device is: the GPU instance and compute instance ids that name its
/// capability files (`/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/ci<C>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MigInstance {
    pub gi: u32,
    pub ci: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum GpuSource {
    /// Reported by NVML (the real inventory).
    Nvml,
    /// NVML unavailable: derived from `/dev/nvidia<N>` nodes under the driver root
    /// (index = order of minors, no UUID/name/memory). This is how tests exercise
    /// per-GPU selection on a driver tree without a GPU.
    DeviceNodes,
}

impl fmt::Display for GpuSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GpuSource::Nvml => "NVML",
            GpuSource::DeviceNodes => "device nodes (NVML unavailable)",
        })
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct NvmlStatus {
    pub loaded: bool,
    /// Why NVML could not be used (library not loadable, driver not loaded, ...).
    pub error: Option<String>,
    /// Directory libnvidia-ml.so.1 was loaded from (host path).
    pub library_dir: Option<PathBuf>,
}

/// Something a sandbox would not get, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Missing {
    pub item: String,
    pub why: String,
}

/// Everything discovered about the NVIDIA driver of one driver root.
#[derive(Debug, Clone, Serialize)]
pub struct Driver {
    pub root: PathBuf,
    /// `535.309.01`; `None` when no driver was found.
    pub version: Option<String>,
    /// Where the version came from (NVML, a library file name, /proc).
    pub version_source: Option<String>,
    /// CUDA driver API version (12, 2), from NVML.
    pub cuda_version: Option<(u32, u32)>,
    pub nvml: NvmlStatus,
    pub gpus: Vec<GpuInfo>,
    /// `None` when there are no GPUs.
    pub gpu_source: Option<GpuSource>,
    /// The MIG devices of MIG-enabled GPUs (NVML only), selectable by `MIG-` UUID.
    pub mig_devices: Vec<GpuInfo>,
    pub ldcache: Option<PathBuf>,
    pub libraries: Vec<Library>,
    pub binaries: Vec<Binary>,
    pub firmware: Vec<FirmwareFile>,
    pub sockets: Vec<Socket>,
    /// MPS pipe directory (`/tmp/nvidia-mps`) when an MPS daemon runs on the host.
    pub mps_pipe_dir: Option<PathBuf>,
    /// Loader JSON files, Xorg modules and configuration of `graphics`/`display`.
    pub files: Vec<graphics::DriverFile>,
    /// nvidia-persistenced, the fabric manager, NVSwitches, IMEX (see `services`).
    pub services: services::Services,
    pub devices: Devices,
    pub missing: Vec<Missing>,
    pub notes: Vec<String>,
}

impl Driver {
    /// The one-line error a GPU request gets on this host, if it can't be served.
    pub fn unavailable_reason(&self) -> Option<String> {
        if !self.gpus.is_empty() {
            return None;
        }
        Some(match (&self.nvml.error, self.nvml.loaded) {
            (_, true) => "no NVIDIA GPU found: NVML loaded but reports no GPUs; check `nvidia-smi` on the host or use --gpus none".to_string(),
            (Some(e), false) => format!(
                "no NVIDIA driver found: libnvidia-ml.so.1 could not be loaded ({e}) and there are no /dev/nvidia<N> nodes under {}; install the driver or use --gpus none",
                self.root.join("dev").display()
            ),
            (None, false) => format!(
                "no NVIDIA driver found: no GPU inventory and no /dev/nvidia<N> nodes under {}; install the driver or use --gpus none",
                self.root.join("dev").display()
            ),
        })
    }

    pub fn library(&self, name: &str) -> Option<&Library> {
        self.libraries.iter().find(|l| l.name == name)
    }
}

/// Finds the driver, its files and GPUs. Fails only when the driver root is unusable;
/// everything else that is absent ends up in `missing`/`notes`, and GPU requests fail
/// later with [`Driver::unavailable_reason`].
pub fn discover(opts: &DiscoverOptions, inventory: &dyn GpuInventory) -> Result<Driver> {
    discover_scoped(opts, inventory, driver::Scope::Everything)
}

/// [`discover`] of what one job with `caps` needs (see [`driver::Scope::Job`]).
pub fn discover_for_job(opts: &DiscoverOptions, inventory: &dyn GpuInventory, caps: &Capabilities) -> Result<Driver> {
    discover_scoped(opts, inventory, driver::Scope::Job(*caps))
}

fn discover_scoped(opts: &DiscoverOptions, inventory: &dyn GpuInventory, scope: driver::Scope) -> Result<Driver> {
    let root = &opts.driver_root;
    if !root.is_dir() {
        bail!("driver root {} is not a directory: fix --driver-root", root.display());
    }
    let root = root.canonicalize().with_context(|| format!("cannot resolve driver root {}", root.display()))?;
    driver::discover(&root, &opts.extra_lib_dirs, inventory, scope)
}

/// The edits for one job: `request` against the native driver, or against CDI specs when
/// `--cdi-spec` was given or the request names CDI devices (`nvidia.com/gpu=0`).
/// `GpuRequest::None` gives empty edits and never needs a driver.
pub fn edits_for(
    driver: Option<&Driver>,
    cdi: Option<&cdi::Registry>,
    request: &GpuRequest,
    caps: &Capabilities,
) -> Result<ContainerEdits> {
    if request.is_none() {
        return Ok(ContainerEdits::default());
    }
    let use_cdi = matches!(request, GpuRequest::Cdi(_)) || cdi.is_some_and(|r| r.explicit);
    if use_cdi {
        let reg = cdi.context(
            "CDI devices were requested but no CDI specs were loaded: pass --cdi-spec FILE or put specs in /etc/cdi",
        )?;
        return cdi::edits(reg, &request.cdi_names());
    }
    let driver = driver.context("GPU requested but the NVIDIA driver was not discovered")?;
    let gpus = select::select(driver, request)?;
    inject::edits(driver, &gpus, caps)
}

/// Everything one job needs, with the real NVML, in one call: nothing (and no driver
/// lookup at all) for `--gpus none`; CDI when `--cdi-spec` was given or CDI names were
/// requested; else native discovery + selection + injection. With `rootfs` (the job's
/// lower layer), its CUDA is checked against the driver's ([`compat::check`]: a rootfs
/// the driver cannot run is an error here, before the job) and the host libraries are
/// also bound over the driver libraries the rootfs carries ([`inject::rootfs_overrides`]).
pub fn job_edits(
    opts: &DiscoverOptions,
    request: &GpuRequest,
    caps: &Capabilities,
    rootfs: Option<&compat::RootfsCuda>,
) -> Result<ContainerEdits> {
    if request.is_none() {
        return Ok(ContainerEdits::default());
    }
    if opts.cdi_spec.is_some() || matches!(request, GpuRequest::Cdi(_)) {
        let reg = cdi::Registry::load(opts)?;
        return edits_for(None, Some(&reg), request, caps);
    }
    // Timed for -v: on a GPU without persistence mode, NVML's init wakes the GPU up.
    let started = std::time::Instant::now();
    let inventory = NvmlInventory::load(&opts.driver_root, &opts.extra_lib_dirs);
    let nvml_ms = started.elapsed().as_secs_f64() * 1e3;
    let driver = discover_for_job(opts, &inventory, caps)?;
    tracing::debug!(
        "GPUs: NVML loaded in {nvml_ms:.1} ms, driver files found in {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3 - nvml_ms
    );
    let mut edits = edits_for(Some(&driver), None, request, caps)?;
    if let Some(rootfs) = rootfs {
        if caps.compute {
            let verdict = compat::check(rootfs, &driver, &select::select(&driver, request)?)?;
            log_compat(rootfs.name, &verdict);
            verdict.apply(&mut edits);
        }
        let (mounts, notes) = inject::rootfs_overrides(&driver, caps, rootfs.tree)?;
        for n in notes {
            tracing::info!("{n}");
        }
        edits.mounts.extend(mounts);
    }
    Ok(edits)
}

/// The CUDA check's outcome in the log: a warning when unchecked, debug for a rootfs
/// without CUDA (nothing to say), else info.
pub fn log_compat(rootfs: &str, verdict: &compat::Compat) {
    match verdict {
        v if v.is_warning() => tracing::warn!("rootfs '{rootfs}': {v}"),
        compat::Compat::NoCuda => tracing::debug!("rootfs '{rootfs}': {verdict}"),
        v => tracing::info!("rootfs '{rootfs}': {v}"),
    }
}

/// The CUDA check alone, with the real NVML, for all of this host's GPUs (what a
/// `check` command shows): `Err` is the line a GPU job on this rootfs would fail with.
pub fn check_rootfs(opts: &DiscoverOptions, rootfs: &compat::RootfsCuda) -> Result<compat::Compat> {
    let inventory = NvmlInventory::load(&opts.driver_root, &opts.extra_lib_dirs);
    let driver = discover(opts, &inventory)?;
    compat::check(rootfs, &driver, &driver.gpus)
}

/// `azp-sandbox gpu list`: discovery with the real NVML plus the CDI specs, as a report
/// (`Display` for the table, `to_json()` for `--json`).
pub fn list(opts: &DiscoverOptions, caps: &Capabilities) -> Result<report::Report> {
    let inventory = NvmlInventory::load(&opts.driver_root, &opts.extra_lib_dirs);
    let driver = discover(opts, &inventory)?;
    let reg = cdi::Registry::load(opts)?;
    Ok(report::Report::build(&driver, caps, Some(&reg)))
}

/// Is `name` a library base name of one of the known groups (`libcuda`)?
pub fn lib_group(name: &str) -> Option<LibGroup> {
    driver::LIBRARIES
        .iter()
        .chain(driver::OWN_VERSION_LIBRARIES)
        .find(|(_, names)| names.contains(&name))
        .map(|(g, _)| *g)
}

/// `libcuda.so.535.54.15` -> (`libcuda`, `535.54.15`); `libcuda.so` -> (`libcuda`, ``).
pub fn split_so_name(file: &str) -> Option<(&str, &str)> {
    let i = file.find(".so")?;
    let rest = &file[i + 3..];
    if rest.is_empty() {
        return Some((&file[..i], ""));
    }
    rest.strip_prefix('.').map(|v| (&file[..i], v))
}

pub(crate) fn is_driver_version(v: &str) -> bool {
    let parts: Vec<&str> = v.split('.').collect();
    (2..=3).contains(&parts.len()) && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn so_names() {
        assert_eq!(split_so_name("libcuda.so.535.54.15"), Some(("libcuda", "535.54.15")));
        assert_eq!(split_so_name("libcuda.so.1"), Some(("libcuda", "1")));
        assert_eq!(split_so_name("libcuda.so"), Some(("libcuda", "")));
        assert_eq!(split_so_name("libcuda.sox"), None);
        assert_eq!(lib_group("libcuda"), Some(LibGroup::Compute));
        assert_eq!(lib_group("libnvidia-ml"), Some(LibGroup::Utility));
        assert_eq!(lib_group("libnvidia-pkcs11-openssl3"), Some(LibGroup::Compute));
        assert_eq!(lib_group("libnvidia"), None);
        assert!(is_driver_version("535.309.01"));
        assert!(is_driver_version("550.54"));
        assert!(!is_driver_version("1"));
        assert!(!is_driver_version("535.x.01"));
    }
}

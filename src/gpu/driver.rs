//! Driver files: version, libraries (through the linker cache, extra dirs and the NVML
//! dir), binaries, firmware, sockets. The lists follow libnvidia-container's
//! `nvc_info.c` (see shared/nvidia-driver-files.md).

use super::devices;
use super::elf;
use super::found::{Binary, FirmwareFile, LibGroup, Library, Socket};
use super::ldcache::LdCache;
use super::nvml::GpuInventory;
use super::paths::{host_path, in_root, resolve_host, resolve_in_root};
use super::{is_driver_version, lib_group, split_so_name, Driver, GpuInfo, GpuSource, Missing, NvmlStatus};
use anyhow::{bail, Result};
use serde::Serialize;
use std::collections::BTreeSet;
use std::fmt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Library base names (before `.so`) per group.
pub const LIBRARIES: &[(LibGroup, &[&str])] = &[
    (LibGroup::Utility, &["libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"]),
    (
        LibGroup::Compute,
        &[
            "libcuda",
            "libcudadebugger",
            "libnvidia-opencl",
            "libnvidia-gpucomp",
            "libnvidia-ptxjitcompiler",
            "libnvidia-fatbinaryloader",
            "libnvidia-allocator",
            "libnvidia-compiler",
            "libnvidia-pkcs11",
            "libnvidia-pkcs11-openssl3",
            "libnvidia-nvvm",
        ],
    ),
    (LibGroup::Video, &["libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"]),
    (
        LibGroup::Graphics,
        &[
            "libnvidia-eglcore",
            "libnvidia-glcore",
            "libnvidia-tls",
            "libnvidia-glsi",
            "libnvidia-fbc",
            "libnvidia-ifr",
            "libnvidia-rtcore",
            "libnvoptix",
            "libGLX_nvidia",
            "libEGL_nvidia",
            "libGLESv2_nvidia",
            "libGLESv1_CM_nvidia",
            "libnvidia-glvkspirv",
            "libnvidia-vulkan-producer",
        ],
    ),
];

/// Driver libraries with a version of their own (`libnvidia-egl-wayland.so.1.1.10`), not
/// the driver's: any `X.Y[.Z]` file is taken. Optional everywhere (separate packages).
pub const OWN_VERSION_LIBRARIES: &[(LibGroup, &[&str])] =
    &[(LibGroup::Graphics, &["libnvidia-egl-wayland", "libnvidia-egl-gbm", "libnvidia-egl-xcb", "libnvidia-egl-xlib"])];

fn has_own_version(base: &str) -> bool {
    OWN_VERSION_LIBRARIES.iter().any(|(_, names)| names.contains(&base))
}

/// Binaries per group (nv-fabricmanager is host-only and never injected).
pub const BINARIES: &[(LibGroup, &str)] = &[
    (LibGroup::Utility, "nvidia-smi"),
    (LibGroup::Utility, "nvidia-debugdump"),
    (LibGroup::Utility, "nvidia-persistenced"),
    (LibGroup::Compute, "nvidia-cuda-mps-control"),
    (LibGroup::Compute, "nvidia-cuda-mps-server"),
];

/// Where binaries are looked for, inside the driver root, in this order.
pub const BIN_DIRS: &[&str] = &["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/nvidia/bin"];

const SOCKETS: &[(&str, &[&str])] = &[
    ("nvidia-persistenced", &["/run/nvidia-persistenced/socket", "/var/run/nvidia-persistenced/socket"]),
    ("nvidia-fabricmanager", &["/run/nvidia-fabricmanager/socket", "/var/run/nvidia-fabricmanager/socket"]),
];
pub const MPS_PIPE_DIR: &str = "/tmp/nvidia-mps";

/// `NVIDIA_DRIVER_CAPABILITIES`: which driver parts a job gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    pub compute: bool,
    pub utility: bool,
    pub video: bool,
    pub graphics: bool,
    pub display: bool,
}

impl Default for Capabilities {
    /// `compute,utility`, as nvidia-container-runtime.
    fn default() -> Self {
        Capabilities { compute: true, utility: true, video: false, graphics: false, display: false }
    }
}

impl Capabilities {
    pub fn all() -> Self {
        Capabilities { compute: true, utility: true, video: true, graphics: true, display: true }
    }

    /// Library/binary groups these capabilities bring (`display` uses the graphics libraries).
    pub fn groups(&self) -> Vec<LibGroup> {
        let mut g = Vec::new();
        if self.utility {
            g.push(LibGroup::Utility);
        }
        if self.compute {
            g.push(LibGroup::Compute);
        }
        if self.video {
            g.push(LibGroup::Video);
        }
        if self.graphics || self.display {
            g.push(LibGroup::Graphics);
        }
        g
    }
}

impl std::str::FromStr for Capabilities {
    type Err = anyhow::Error;
    /// `compute,utility`, `all`, ...; empty means the default.
    fn from_str(s: &str) -> Result<Self> {
        let mut c = Capabilities { compute: false, utility: false, video: false, graphics: false, display: false };
        let mut any = false;
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            any = true;
            match part.to_ascii_lowercase().as_str() {
                "all" => c = Capabilities::all(),
                "compute" => c.compute = true,
                "utility" => c.utility = true,
                "video" => c.video = true,
                "graphics" => c.graphics = true,
                "display" => c.display = true,
                // Accepted by nvidia-container-runtime; nothing to inject for them here.
                "compat32" | "ngx" => {}
                other => bail!(
                    "unknown driver capability '{other}': expected a comma list of compute, utility, video, graphics, display, or all"
                ),
            }
        }
        Ok(if any { c } else { Capabilities::default() })
    }
}

impl fmt::Display for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Capabilities::all() {
            return f.write_str("all");
        }
        let names: Vec<&str> = [
            (self.compute, "compute"),
            (self.utility, "utility"),
            (self.video, "video"),
            (self.graphics, "graphics"),
            (self.display, "display"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect();
        f.write_str(&names.join(","))
    }
}

struct Candidate {
    base: String,
    /// In-root path (before symlink resolution).
    path: PathBuf,
    via: String,
    cache_name: Option<String>,
}

/// How much of the driver a caller needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Everything (`gpu list`, the agent runner's one discovery per run).
    Everything,
    /// One job with these capabilities (`exec`, on the per-job path): no graphics files
    /// without `graphics`/`display` (~40 path lookups in the driver root), no host
    /// services scan (`gpu list`'s warnings).
    Job(Capabilities),
}

pub(crate) fn discover(
    root: &Path,
    extra_lib_dirs: &[PathBuf],
    inv: &dyn GpuInventory,
    scope: Scope,
) -> Result<Driver> {
    let mut missing = Vec::new();
    let mut notes = Vec::new();

    // NVML first: it knows the running driver's version.
    let nvml_version = inv.driver_version();
    let nvml = NvmlStatus {
        loaded: nvml_version.is_ok(),
        error: nvml_version.as_ref().err().map(|e| format!("{e:#}")),
        library_dir: inv.library_dir(),
    };
    let cuda_version = if nvml.loaded { inv.cuda_driver_version().ok() } else { None };

    let cache = match LdCache::load(root) {
        Ok(c) => Some(c),
        Err(e) => {
            notes.push(format!("{e:#}"));
            None
        }
    };

    // Library candidates: linker cache first, then extra dirs, then NVML's dir.
    let mut cands = Vec::new();
    if let Some(cache) = &cache {
        for e in &cache.entries {
            if !e.is_host_native() || e.hwcap != 0 {
                continue;
            }
            if let Some((base, _)) = split_so_name(&e.name) {
                if lib_group(base).is_some() {
                    cands.push(Candidate {
                        base: base.to_string(),
                        path: e.path.clone(),
                        via: format!("ld.so.cache ({} => {})", e.name, e.path.display()),
                        cache_name: Some(e.name.clone()),
                    });
                }
            }
        }
    }
    let mut dirs: Vec<(PathBuf, &str)> = extra_lib_dirs.iter().map(|d| (d.clone(), "extra lib dir")).collect();
    if let Some(d) = &nvml.library_dir {
        match in_root(root, d) {
            Some(p) => dirs.push((p, "NVML library dir")),
            None => notes.push(format!(
                "NVML was loaded from {} which is outside the driver root {}; not scanned",
                d.display(),
                root.display()
            )),
        }
    }
    // The dir the driver's own libcuda/libnvidia-ml files are in: libraries the linker
    // cache does not list (no SONAME, e.g. libnvidia-vulkan-producer) sit next to them.
    let driver_dir = cands.iter().filter(|c| c.base == "libnvidia-ml" || c.base == "libcuda").find_map(|c| {
        let real = resolve_in_root(root, &c.path).ok()?;
        Some(real.parent()?.to_path_buf())
    });
    if let Some(d) = driver_dir.filter(|d| !dirs.iter().any(|(x, _)| x == d)) {
        dirs.push((d, "driver library dir"));
    }
    for (dir, what) in &dirs {
        let host = match resolve_host(root, dir) {
            Ok(h) if h.is_dir() => h,
            _ => continue,
        };
        let Ok(rd) = std::fs::read_dir(&host) else {
            continue;
        };
        let mut names: Vec<String> =
            rd.filter_map(|e| e.ok()).filter_map(|e| e.file_name().into_string().ok()).collect();
        names.sort();
        for name in names {
            if let Some((base, suffix)) = split_so_name(&name) {
                if lib_group(base).is_some() && !suffix.is_empty() {
                    cands.push(Candidate {
                        base: base.to_string(),
                        path: dir.join(&name),
                        via: format!("{what} {}", dir.display()),
                        cache_name: None,
                    });
                }
            }
        }
    }

    // Driver version: NVML, else the file libnvidia-ml.so.1 / libcuda.so.1 resolves to,
    // else /proc/driver/nvidia/version.
    let mut version = None;
    let mut version_source = None;
    if let Ok(v) = &nvml_version {
        version = Some(v.clone());
        version_source = Some("NVML".to_string());
    }
    if version.is_none() {
        'outer: for base in ["libnvidia-ml", "libcuda"] {
            for c in cands.iter().filter(|c| c.base == base) {
                if let Ok(real) = resolve_in_root(root, &c.path) {
                    let file = real.file_name().and_then(|f| f.to_str()).unwrap_or_default();
                    if let Some((b, v)) = split_so_name(file) {
                        if b == base && is_driver_version(v) {
                            version = Some(v.to_string());
                            version_source = Some(format!("file name of {} (via {})", real.display(), c.via));
                            break 'outer;
                        }
                    }
                }
            }
        }
    }
    if version.is_none() {
        let p = root.join("proc/driver/nvidia/version");
        if let Ok(text) = std::fs::read_to_string(&p) {
            if let Some(v) = parse_proc_version(&text) {
                version = Some(v);
                version_source = Some(p.display().to_string());
            }
        }
    }

    // Libraries of that version.
    let mut libraries: Vec<Library> = Vec::new();
    let mut ignored_versions = BTreeSet::new();
    if let Some(v) = &version {
        for c in &cands {
            if libraries.iter().any(|l| l.name == c.base) {
                continue;
            }
            let Ok(real) = resolve_in_root(root, &c.path) else {
                notes.push(format!("{} ({}) is a dangling link inside {}", c.path.display(), c.via, root.display()));
                continue;
            };
            let file_name = real.file_name().and_then(|f| f.to_str()).unwrap_or_default().to_string();
            match split_so_name(&file_name) {
                Some((b, fv)) if b == c.base && fv == v => {}
                Some((b, fv)) if b == c.base && has_own_version(b) && is_driver_version(fv) => {}
                Some((b, fv)) if b == c.base && is_driver_version(fv) => {
                    ignored_versions.insert(format!("{} (version {fv}, via {})", real.display(), c.via));
                    continue;
                }
                _ => continue,
            }
            let host = host_path(root, &real);
            match elf::read(&host) {
                Ok(Some(info)) if info.is_host_native() => {
                    let soname = info
                        .soname
                        .or_else(|| c.cache_name.clone().filter(|n| *n != file_name))
                        .unwrap_or_else(|| file_name.clone());
                    libraries.push(Library {
                        group: lib_group(&c.base).expect("candidates are group members"),
                        name: c.base.clone(),
                        file_name,
                        soname,
                        host_path: host,
                        found_via: c.via.clone(),
                    });
                }
                Ok(Some(info)) => notes.push(format!(
                    "skipped {}: {}-bit {} library, the sandbox needs 64-bit {}",
                    host.display(),
                    if info.class64 { 64 } else { 32 },
                    elf::machine_name(info.machine),
                    elf::machine_name(elf::host_machine())
                )),
                Ok(None) => notes.push(format!("skipped {}: not an ELF file", host.display())),
                Err(e) => notes.push(format!("skipped {}: {e}", host.display())),
            }
        }
    }
    for i in ignored_versions {
        notes.push(format!("ignored {i}: not the driver version {}", version.as_deref().unwrap_or("?")));
    }
    // A library of its own version is only of use next to the driver's (egl-wayland is
    // a platform of libEGL_nvidia): none without a driver library of its group.
    let groups_found: BTreeSet<LibGroup> =
        libraries.iter().filter(|l| !has_own_version(&l.name)).map(|l| l.group).collect();
    libraries.retain(|l| !has_own_version(&l.name) || groups_found.contains(&l.group));
    libraries.sort_by(|a, b| (a.group, &a.name).cmp(&(b.group, &b.name)));
    if version.is_some() {
        for (group, names) in LIBRARIES.iter().chain(OWN_VERSION_LIBRARIES) {
            for n in *names {
                if !libraries.iter().any(|l| l.name == *n) {
                    missing.push(Missing {
                        item: format!("{n}.so ({group})"),
                        why: "not in ld.so.cache, the extra lib dirs or the NVML dir (not shipped by every driver)"
                            .into(),
                    });
                }
            }
        }
    } else {
        missing.push(Missing {
            item: "driver libraries".into(),
            why: format!(
                "no driver version: NVML unavailable, no libnvidia-ml.so.<version>/libcuda.so.<version> in {}/etc/ld.so.cache or the extra lib dirs, no {}/proc/driver/nvidia/version",
                root.display(),
                root.display()
            ),
        });
    }

    // Graphics/display files (loader JSON files, Xorg modules), for the libraries found.
    let want_files = match scope {
        Scope::Everything => true,
        Scope::Job(caps) => caps.graphics || caps.display,
    };
    let files = match &version {
        Some(v) if want_files => {
            let (files, absent) = super::graphics::discover(root, Some(v), &libraries);
            missing.extend(absent);
            files
        }
        _ => Vec::new(),
    };

    // Binaries: the standard dirs, then the `bin` beside each dir the libraries came from
    // (a driver under /usr/local/nvidia keeps its programs in /usr/local/nvidia/bin).
    let mut bin_dirs: Vec<PathBuf> = BIN_DIRS.iter().map(PathBuf::from).collect();
    let lib_dirs =
        libraries.iter().filter_map(|l| l.host_path.strip_prefix(root).ok()?.parent().map(|d| Path::new("/").join(d)));
    for d in extra_lib_dirs.iter().cloned().chain(lib_dirs) {
        if let Some(parent) = d.parent() {
            let b = parent.join("bin");
            if !bin_dirs.contains(&b) {
                bin_dirs.push(b);
            }
        }
    }
    // The first program of that name that is a real program (ELF), else the first
    // executable: a site may put a wrapper script first (the lent H200's /usr/bin/nvidia-smi
    // is `exec /usr/local/nvidia/bin/nvidia-smi "$@"`), which, bound alone into a job,
    // execs a path the job does not have.
    let executable_in = |d: &PathBuf, name: &str| {
        let at = d.join(name);
        let real = resolve_in_root(root, &at).ok()?;
        let host = host_path(root, &real);
        let meta = std::fs::metadata(&host).ok()?;
        (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some((at, host))
    };
    let mut binaries = Vec::new();
    for (group, name) in BINARIES {
        // Lazily: a GPU `exec` discovers per job, and the first dir usually has it.
        let mut first = None;
        let found = bin_dirs
            .iter()
            .filter_map(|d| executable_in(d, name))
            .find(|c| {
                first.get_or_insert_with(|| c.clone());
                matches!(elf::read(&c.1), Ok(Some(_)))
            })
            .or(first);
        match found {
            Some((at, host)) => {
                binaries.push(Binary { group: *group, name: name.to_string(), host_path: host, found_at: at })
            }
            None => missing.push(Missing {
                item: format!("{name} ({group})"),
                why: format!(
                    "not found in {} under {}",
                    bin_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
                    root.display()
                ),
            }),
        }
    }

    // Firmware (GSP), optional.
    let mut firmware: Vec<FirmwareFile> = Vec::new();
    if let Some(v) = &version {
        for dir in [format!("/lib/firmware/nvidia/{v}"), format!("/usr/lib/firmware/nvidia/{v}")] {
            let Ok(host) = resolve_host(root, Path::new(&dir)) else {
                continue;
            };
            let Ok(rd) = std::fs::read_dir(&host) else {
                continue;
            };
            let mut files: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
            files.sort();
            for f in files {
                let name = f.file_name().unwrap().to_string_lossy().to_string();
                if name.ends_with(".bin") && f.is_file() && !firmware.iter().any(|x| x.container_path.ends_with(&name))
                {
                    firmware.push(FirmwareFile {
                        host_path: f.clone(),
                        container_path: PathBuf::from(format!("/lib/firmware/nvidia/{v}/{name}")),
                    });
                }
            }
        }
        if firmware.is_empty() {
            missing.push(Missing {
                item: format!("firmware /lib/firmware/nvidia/{v}/*.bin (optional)"),
                why: "not installed (only GSP-firmware drivers ship it)".into(),
            });
        }
    }

    // Sockets, optional.
    let mut sockets = Vec::new();
    for (name, candidates) in SOCKETS {
        let found = candidates.iter().find_map(|c| {
            let real = resolve_in_root(root, Path::new(c)).ok()?;
            let host = host_path(root, &real);
            std::fs::metadata(&host).ok()?.file_type().is_socket().then_some(host)
        });
        match found {
            Some(host) => sockets.push(Socket {
                name: name.to_string(),
                host_path: host,
                container_path: PathBuf::from(candidates[0]),
            }),
            None => missing.push(Missing {
                item: format!("{} (optional)", candidates[0]),
                why: format!("{name} is not running (no socket)"),
            }),
        }
    }
    let mps_pipe_dir = resolve_host(root, Path::new(MPS_PIPE_DIR)).ok().filter(|p| p.is_dir());

    // Devices and GPUs.
    let devices = devices::scan(root);
    let (gpus, gpu_source) = if nvml.loaded {
        match inv.gpus() {
            Ok(g) if !g.is_empty() => (g, Some(GpuSource::Nvml)),
            Ok(_) => (Vec::new(), None),
            Err(e) => {
                notes.push(format!("NVML loaded but listing GPUs failed: {e:#}"));
                (Vec::new(), None)
            }
        }
    } else if !devices.gpus.is_empty() {
        let g: Vec<GpuInfo> = devices
            .gpus
            .iter()
            .enumerate()
            .map(|(i, d)| GpuInfo {
                index: i as u32,
                uuid: None,
                name: format!("unknown ({} present, NVML unavailable)", d.path.display()),
                minor: d.minor as u32,
                memory_total_bytes: None,
                compute_capability: None,
                mig_enabled: None,
                pci_bus_id: None,
                source: GpuSource::DeviceNodes,
                mig: None,
            })
            .collect();
        (g, Some(GpuSource::DeviceNodes))
    } else {
        (Vec::new(), None)
    };
    let mig_devices = match (nvml.loaded, gpus.iter().any(|g| g.mig_enabled == Some(true))) {
        (true, true) => inv.mig_devices().unwrap_or_else(|e| {
            notes.push(format!("MIG is enabled but NVML could not list the MIG devices: {e:#}"));
            Vec::new()
        }),
        _ => Vec::new(),
    };
    for g in &gpus {
        if devices.gpu_node(g.minor).is_none() {
            missing.push(Missing {
                item: format!("/dev/nvidia{} (GPU {})", g.minor, g.index),
                why: format!(
                    "node absent under {}: run `nvidia-modprobe -c {}` on the host",
                    root.join("dev").display(),
                    g.minor
                ),
            });
        }
    }
    for (name, node) in
        [("nvidiactl", &devices.ctl), ("nvidia-uvm", &devices.uvm), ("nvidia-uvm-tools", &devices.uvm_tools)]
    {
        if node.is_none() {
            let fix = if name == "nvidiactl" {
                "load the nvidia module"
            } else {
                "run `nvidia-modprobe -u -c=0` (loads nvidia-uvm and creates the nodes)"
            };
            missing.push(Missing { item: format!("/dev/{name}"), why: format!("node absent: {fix}") });
        }
    }
    missing.extend(devices.missing_caps_reason());
    notes.extend(devices.notes.iter().cloned());

    Ok(Driver {
        root: root.to_path_buf(),
        version,
        version_source,
        cuda_version,
        nvml,
        gpus,
        gpu_source,
        mig_devices,
        ldcache: cache.map(|c| c.file),
        libraries,
        binaries,
        firmware,
        sockets,
        mps_pipe_dir,
        files,
        services: match scope {
            Scope::Everything => super::services::scan(root),
            Scope::Job(_) => Default::default(),
        },
        devices,
        missing,
        notes,
    })
}

/// `NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.309.01  Thu ...` -> `535.309.01`.
pub fn parse_proc_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace().find(|w| is_driver_version(w)).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_parse_and_print() {
        let d: Capabilities = "".parse().unwrap();
        assert_eq!(d, Capabilities::default());
        assert_eq!(d.to_string(), "compute,utility");
        assert_eq!(d.groups(), vec![LibGroup::Utility, LibGroup::Compute]);
        let v: Capabilities = "utility, video".parse().unwrap();
        assert!(!v.compute && v.utility && v.video);
        assert_eq!(v.groups(), vec![LibGroup::Utility, LibGroup::Video]);
        let a: Capabilities = "ALL".parse().unwrap();
        assert_eq!(a.to_string(), "all");
        assert_eq!(a.groups().len(), 4);
        let disp: Capabilities = "display".parse().unwrap();
        assert_eq!(disp.groups(), vec![LibGroup::Graphics]);
        let e = "compute,gpu".parse::<Capabilities>().unwrap_err().to_string();
        assert!(e.contains("unknown driver capability 'gpu'"), "{e}");
    }

    #[test]
    fn proc_version() {
        let t = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\nGCC version: gcc 12\n";
        assert_eq!(parse_proc_version(t).as_deref(), Some("550.54.15"));
        // The open kernel module, as on the lent H200.
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \n";
        assert_eq!(parse_proc_version(open).as_deref(), Some("580.159.04"));
        assert_eq!(parse_proc_version("nothing"), None);
    }
}

//! Can the host's driver run the rootfs's CUDA? Checked before a GPU job starts, so a
//! rootfs newer than the driver fails with one line that says what to do, instead of
//! CUDA error 35 ("driver version is insufficient for CUDA runtime version"), 803 or 804
//! (forward-compatibility libraries on a driver or GPU they do not support) inside the
//! job, after the agent took it.
//!
//! The rootfs's CUDA is the store's `cuda_version` (from `usr/local/cuda/version.json`,
//! or the dpkg database). The driver's is NVML's CUDA driver version; without NVML (no
//! kernel module reachable, `--driver-root` trees), the driver version looked up in
//! [`CUDA_MIN_DRIVER`]. As nvidia-container-toolkit's `NVIDIA_REQUIRE_CUDA` check, a
//! rootfs needs a driver of at least its major.minor (minor-version compatibility lets
//! some programs run on an older 12.x driver, not all: PTX JIT and newer APIs fail).
//!
//! The exception is CUDA forward compatibility: a `cuda-compat-X-Y` package in the rootfs
//! puts a newer `libcuda.so.<driver version>` in `/usr/local/cuda-X.Y/compat`, which runs
//! on an older kernel module on data-center GPUs. When it is there and new enough, the
//! check passes and [`Compat::apply`] puts that dir first in the sandbox's linker path.

use super::inject::compare_versions;
use super::paths::{host_path, resolve_in_root};
use super::{split_so_name, Driver, GpuInfo};
use anyhow::{bail, Result};
use std::fmt;
use std::path::{Path, PathBuf};

/// The first Linux x86_64 driver of each CUDA release (its GA; `major, minor, driver`).
/// Source: NVIDIA CUDA Toolkit Release Notes, table "CUDA Toolkit and Corresponding
/// Driver Versions" (<https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/>).
/// Newest first. Add a row per CUDA release; a driver newer than the first row's branch
/// gets no answer (not a guess) and the check then only warns.
pub const CUDA_MIN_DRIVER: &[(u32, u32, &str)] = &[
    (13, 0, "580.65.06"),
    (12, 9, "575.51.03"),
    (12, 8, "570.26"),
    (12, 6, "560.28.03"),
    (12, 5, "555.42.02"),
    (12, 4, "550.54.14"),
    (12, 3, "545.23.06"),
    (12, 2, "535.54.03"),
    (12, 1, "530.30.02"),
    (12, 0, "525.60.13"),
    (11, 8, "520.61.05"),
    (11, 7, "515.43.04"),
    (11, 6, "510.39.01"),
    (11, 5, "495.29.05"),
    (11, 4, "470.42.01"),
    (11, 3, "465.19.01"),
    (11, 2, "460.27.03"),
    (11, 1, "455.23"),
    (11, 0, "450.36.06"),
    (10, 2, "440.33"),
    (10, 1, "418.39"),
    (10, 0, "410.48"),
];

/// The newest CUDA a driver supports, from [`CUDA_MIN_DRIVER`]; `None` for a driver of a
/// branch newer than the table knows, or older than CUDA 10.0.
pub fn cuda_for_driver(driver_version: &str) -> Option<(u32, u32)> {
    let branch = |v: &str| v.split('.').next().and_then(|b| b.parse::<u32>().ok());
    let (_, _, newest) = CUDA_MIN_DRIVER[0];
    if branch(driver_version)? > branch(newest)? {
        return None;
    }
    CUDA_MIN_DRIVER
        .iter()
        .find(|(_, _, min)| compare_versions(driver_version, min) != std::cmp::Ordering::Less)
        .map(|(maj, min, _)| (*maj, *min))
}

/// The first driver of a CUDA release, when the table has it.
pub fn min_driver_for(cuda: (u32, u32)) -> Option<&'static str> {
    CUDA_MIN_DRIVER.iter().find(|(a, b, _)| (*a, *b) == cuda).map(|(_, _, d)| *d)
}

/// `12.4.1`, `12.4`, `11.8.89~11.8.0-5` -> (12, 4).
pub fn parse_cuda(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor))
}

/// Can a driver supporting `driver` run CUDA `rootfs` (major.minor order)? The one rule
/// for the check and `--rootfs auto`.
pub fn cuda_supported(rootfs: (u32, u32), driver: (u32, u32)) -> bool {
    rootfs <= driver
}

/// Where the driver's CUDA version came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaSource {
    Nvml,
    /// [`CUDA_MIN_DRIVER`], by the driver version (no NVML).
    Table,
}

/// The host driver's CUDA version, and how it is known.
pub fn driver_cuda(driver: &Driver) -> Option<((u32, u32), CudaSource)> {
    if let Some(c) = driver.cuda_version {
        return Some((c, CudaSource::Nvml));
    }
    driver.version.as_deref().and_then(cuda_for_driver).map(|c| (c, CudaSource::Table))
}

/// The rootfs as the check sees it.
#[derive(Debug, Clone, Copy)]
pub struct RootfsCuda<'a> {
    pub name: &'a str,
    /// Host path of the tree (the job's lower layer).
    pub tree: &'a Path,
    /// The store's `cuda_version`.
    pub cuda_version: Option<&'a str>,
    /// `NVIDIA_DISABLE_REQUIRE` set in the job's environment: skip the check, as
    /// nvidia-container-toolkit does (minor-version compatibility may be enough for it).
    pub disable_require: bool,
}

/// `NVIDIA_DISABLE_REQUIRE` as nvidia-container-toolkit reads it (any value but false/0).
pub fn disable_require(env: &[(String, String)]) -> bool {
    env.iter()
        .rev()
        .find(|(k, _)| k == "NVIDIA_DISABLE_REQUIRE")
        .is_some_and(|(_, v)| !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false" | "no"))
}

/// What the check found (all of these let the job start; refusals are errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compat {
    /// The rootfs records no CUDA: nothing to check.
    NoCuda,
    /// `NVIDIA_DISABLE_REQUIRE` was set.
    Disabled,
    /// The driver's CUDA is not known (no NVML, a driver newer than the table): the job
    /// runs, with a warning.
    Unknown {
        rootfs: (u32, u32),
        why: String,
    },
    Supported {
        rootfs: (u32, u32),
        driver: (u32, u32),
    },
    /// The rootfs is newer than the driver but carries forward-compatibility libraries
    /// of a driver that supports it, in `dir` (in-root path).
    ForwardCompat {
        rootfs: (u32, u32),
        driver: (u32, u32),
        dir: PathBuf,
        compat_driver: String,
    },
}

impl Compat {
    /// Puts the forward-compatibility dir before the host driver's in the sandbox's
    /// linker path (ldconfig keeps the first dir's library for a SONAME), so its libcuda
    /// is the one loaded. Nothing for the other outcomes.
    pub fn apply(&self, edits: &mut crate::edits::ContainerEdits) {
        if let Compat::ForwardCompat { dir, .. } = self {
            if !edits.ld_library_dirs.is_empty() && !edits.ld_library_dirs.contains(dir) {
                edits.ld_library_dirs.insert(0, dir.clone());
            }
        }
    }

    /// Worth a warning in the log (the job still runs)?
    pub fn is_warning(&self) -> bool {
        matches!(self, Compat::Unknown { .. } | Compat::Disabled)
    }
}

fn v((a, b): (u32, u32)) -> String {
    format!("{a}.{b}")
}

impl fmt::Display for Compat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compat::NoCuda => write!(f, "the rootfs records no CUDA version: not checked"),
            Compat::Disabled => write!(f, "CUDA version check skipped (NVIDIA_DISABLE_REQUIRE is set)"),
            Compat::Unknown { rootfs, why } => {
                write!(f, "CUDA {} of the rootfs not checked against the driver: {why}", v(*rootfs))
            }
            Compat::Supported { rootfs, driver } => {
                write!(f, "CUDA {} of the rootfs runs on the driver's CUDA {}", v(*rootfs), v(*driver))
            }
            Compat::ForwardCompat { rootfs, driver, dir, compat_driver } => write!(
                f,
                "CUDA {} of the rootfs is newer than the driver's CUDA {}: using its forward-compatibility libraries {} (driver {compat_driver}; data-center GPUs only)",
                v(*rootfs),
                v(*driver),
                dir.display()
            ),
        }
    }
}

/// Checks `rootfs` against `driver` for a job on `gpus`. Errors are the one line the
/// job fails with.
pub fn check(rootfs: &RootfsCuda, driver: &Driver, gpus: &[GpuInfo]) -> Result<Compat> {
    if rootfs.disable_require {
        return Ok(Compat::Disabled);
    }
    let Some(want) = rootfs.cuda_version.and_then(parse_cuda) else {
        return Ok(Compat::NoCuda);
    };
    let driver_version = driver.version.as_deref().unwrap_or("unknown");
    let Some((have, source)) = driver_cuda(driver) else {
        let why = match &driver.version {
            Some(d) => {
                format!("NVML unavailable and driver {d} is newer than the CUDA/driver table (src/gpu/compat.rs)")
            }
            None => "no driver version".into(),
        };
        return Ok(Compat::Unknown { rootfs: want, why });
    };
    if cuda_supported(want, have) {
        return Ok(Compat::Supported { rootfs: want, driver: have });
    }
    // Forward compatibility: the newest compat libcuda that supports the rootfs's CUDA
    // and is newer than the host driver.
    let compat = forward_compat_libcuda(rootfs.tree)
        .into_iter()
        .filter(|(_, cv)| driver.version.as_deref().is_none_or(|d| compare_versions(cv, d).is_gt()))
        .filter(|(_, cv)| cuda_for_driver(cv).is_some_and(|c| cuda_supported(want, c)))
        .max_by(|a, b| compare_versions(&a.1, &b.1));
    if let Some((dir, compat_driver)) = compat {
        if let Some(g) = gpus.iter().find(|g| is_consumer(&g.name)) {
            bail!(
                "rootfs '{}' has CUDA {} and forward-compatibility libraries ({}), but GPU {} is a {}: forward compatibility works on data-center GPUs only (CUDA error 804); upgrade the host driver{} or use a rootfs with CUDA <= {}",
                rootfs.name,
                v(want),
                dir.display(),
                g.index,
                g.name,
                min_driver_for(want).map(|d| format!(" to >= {d}")).unwrap_or_default(),
                v(have)
            );
        }
        return Ok(Compat::ForwardCompat { rootfs: want, driver: have, dir, compat_driver });
    }
    let source = match source {
        CudaSource::Nvml => "NVML",
        CudaSource::Table => "driver table, no NVML",
    };
    bail!(
        "rootfs '{}' has CUDA {} but the host's NVIDIA driver {driver_version} supports CUDA {} at most ({source}): CUDA would fail inside the job (error 35/803); upgrade the driver{}, use a rootfs with CUDA <= {} (`--rootfs auto` picks one), or on data-center GPUs install cuda-compat-{}-{} in the rootfs",
        rootfs.name,
        v(want),
        v(have),
        min_driver_for(want).map(|d| format!(" to >= {d}")).unwrap_or_default(),
        v(have),
        want.0,
        want.1
    )
}

/// GeForce/TITAN boards: CUDA forward compatibility is not supported on them.
fn is_consumer(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("geforce") || n.contains("titan")
}

/// The rootfs's CUDA forward-compatibility dirs (`/usr/local/cuda*/compat`, resolved
/// inside the tree, each once), in-root paths.
pub fn forward_compat_dirs(tree: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(tree.join("usr/local")) else {
        return Vec::new();
    };
    let mut names: Vec<String> =
        rd.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with("cuda")).collect();
    names.sort();
    let mut dirs: Vec<PathBuf> = Vec::new();
    for n in names {
        let Ok(real) = resolve_in_root(tree, &Path::new("/usr/local").join(n).join("compat")) else {
            continue;
        };
        if host_path(tree, &real).is_dir() && !dirs.contains(&real) {
            dirs.push(real);
        }
    }
    dirs
}

/// `libcuda.so.<driver version>` files in the forward-compatibility dirs: (dir, version).
pub fn forward_compat_libcuda(tree: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for dir in forward_compat_dirs(tree) {
        let Ok(rd) = std::fs::read_dir(host_path(tree, &dir)) else { continue };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(("libcuda", ver)) = split_so_name(&name) {
                if super::is_driver_version(ver) && e.path().is_file() {
                    out.push((dir.clone(), ver.to_string()));
                }
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{Devices, GpuSource, NvmlStatus};

    fn driver(version: &str, nvml_cuda: Option<(u32, u32)>) -> Driver {
        Driver {
            root: "/".into(),
            version: Some(version.into()),
            version_source: None,
            cuda_version: nvml_cuda,
            nvml: NvmlStatus::default(),
            gpus: vec![],
            gpu_source: None,
            mig_devices: vec![],
            ldcache: None,
            libraries: vec![],
            binaries: vec![],
            firmware: vec![],
            sockets: vec![],
            mps_pipe_dir: None,
            files: vec![],
            services: Default::default(),
            devices: Devices::default(),
            missing: vec![],
            notes: vec![],
        }
    }

    fn gpu(name: &str) -> GpuInfo {
        GpuInfo {
            index: 0,
            uuid: None,
            name: name.into(),
            minor: 0,
            memory_total_bytes: None,
            compute_capability: None,
            mig_enabled: None,
            pci_bus_id: None,
            source: GpuSource::Nvml,
            mig: None,
        }
    }

    #[test]
    fn driver_table() {
        assert_eq!(cuda_for_driver("535.309.01"), Some((12, 2)));
        assert_eq!(cuda_for_driver("535.54.03"), Some((12, 2)));
        assert_eq!(cuda_for_driver("535.54.02"), Some((12, 1)), "just below 12.2's first driver");
        assert_eq!(cuda_for_driver("550.54.15"), Some((12, 4)));
        assert_eq!(cuda_for_driver("470.256.02"), Some((11, 4)));
        assert_eq!(cuda_for_driver("580.95.05"), Some((13, 0)));
        assert_eq!(cuda_for_driver("590.44.01"), None, "a branch newer than the table: no guess");
        assert_eq!(cuda_for_driver("390.157"), None);
        // Newest first, strictly: a row out of order would shadow the ones below it.
        for w in CUDA_MIN_DRIVER.windows(2) {
            assert!((w[0].0, w[0].1) > (w[1].0, w[1].1), "{w:?}");
            assert!(compare_versions(w[0].2, w[1].2).is_gt(), "{w:?}");
        }
        assert_eq!(parse_cuda("12.4.1"), Some((12, 4)));
        assert_eq!(parse_cuda("12"), Some((12, 0)));
        assert_eq!(parse_cuda("11.8.89~11.8.0-5~deb12u1"), Some((11, 8)));
        assert_eq!(parse_cuda("x"), None);
        assert!(cuda_supported((12, 2), (12, 2)) && cuda_supported((11, 8), (12, 2)));
        assert!(!cuda_supported((12, 10), (12, 9)) && !cuda_supported((13, 0), (12, 9)));
    }

    #[test]
    fn rootfs_newer_than_the_driver_fails_with_what_to_do() {
        let t = tempfile::tempdir().unwrap();
        let rootfs = |cuda: Option<&'static str>| RootfsCuda {
            name: "cuda",
            tree: t.path(),
            cuda_version: cuda,
            disable_require: false,
        };
        let nvml = driver("535.309.01", Some((12, 2)));
        assert_eq!(check(&rootfs(None), &nvml, &[]).unwrap(), Compat::NoCuda);
        assert_eq!(
            check(&rootfs(Some("12.2.140")), &nvml, &[]).unwrap(),
            Compat::Supported { rootfs: (12, 2), driver: (12, 2) }
        );
        let e = check(&rootfs(Some("12.4.1")), &nvml, &[]).unwrap_err().to_string();
        assert_eq!(
            e,
            "rootfs 'cuda' has CUDA 12.4 but the host's NVIDIA driver 535.309.01 supports CUDA 12.2 at most (NVML): \
             CUDA would fail inside the job (error 35/803); upgrade the driver to >= 550.54.14, use a rootfs with \
             CUDA <= 12.2 (`--rootfs auto` picks one), or on data-center GPUs install cuda-compat-12-4 in the rootfs"
        );
        assert_eq!(e.lines().count(), 1);
        // Without NVML the table answers, and says so.
        let no_nvml = driver("535.309.01", None);
        let e = check(&rootfs(Some("12.4")), &no_nvml, &[]).unwrap_err().to_string();
        assert!(e.contains("CUDA 12.2 at most (driver table, no NVML)"), "{e}");
        // NVIDIA_DISABLE_REQUIRE=1 in the job's environment skips it (as the toolkit).
        let env = |v: &str| vec![("NVIDIA_DISABLE_REQUIRE".to_string(), v.to_string())];
        assert!(disable_require(&env("1")) && disable_require(&env("true")));
        assert!(!disable_require(&env("false")) && !disable_require(&env("0")) && !disable_require(&[]));
        let off = RootfsCuda { disable_require: true, ..rootfs(Some("12.4")) };
        assert_eq!(check(&off, &nvml, &[]).unwrap(), Compat::Disabled);
        // A driver the table does not know: the job runs, with a warning.
        let c = check(&rootfs(Some("13.1")), &driver("595.1.1", None), &[]).unwrap();
        assert!(c.is_warning() && c.to_string().contains("newer than the CUDA/driver table"), "{c}");
    }

    #[test]
    fn forward_compatibility_libraries_let_a_newer_rootfs_run() {
        let t = tempfile::tempdir().unwrap();
        let compat = t.path().join("usr/local/cuda-12.4/compat");
        std::fs::create_dir_all(&compat).unwrap();
        std::os::unix::fs::symlink("cuda-12.4", t.path().join("usr/local/cuda")).unwrap();
        std::fs::write(compat.join("libcuda.so.550.54.15"), b"elf").unwrap();
        std::os::unix::fs::symlink("libcuda.so.550.54.15", compat.join("libcuda.so.1")).unwrap();
        let r = RootfsCuda { name: "cuda", tree: t.path(), cuda_version: Some("12.4.1"), disable_require: false };
        assert_eq!(forward_compat_dirs(t.path()), vec![PathBuf::from("/usr/local/cuda-12.4/compat")]);
        let c = check(&r, &driver("535.309.01", Some((12, 2))), &[gpu("NVIDIA H100 80GB HBM3")]).unwrap();
        assert_eq!(
            c,
            Compat::ForwardCompat {
                rootfs: (12, 4),
                driver: (12, 2),
                dir: "/usr/local/cuda-12.4/compat".into(),
                compat_driver: "550.54.15".into()
            }
        );
        let mut e = crate::edits::ContainerEdits {
            ld_library_dirs: vec![super::super::inject::LIB_DIR.into()],
            ..Default::default()
        };
        c.apply(&mut e);
        assert_eq!(
            e.ld_library_dirs,
            vec![PathBuf::from("/usr/local/cuda-12.4/compat"), PathBuf::from(super::super::inject::LIB_DIR)]
        );
        // Not on GeForce boards (error 804 there).
        let err = check(&r, &driver("535.309.01", Some((12, 2))), &[gpu("NVIDIA GeForce RTX 4090")]).unwrap_err();
        assert!(err.to_string().contains("data-center GPUs only (CUDA error 804)"), "{err}");
        // Compat libraries too old for the rootfs's CUDA do not help.
        let r6 = RootfsCuda { cuda_version: Some("12.6"), ..r };
        assert!(check(&r6, &driver("535.309.01", Some((12, 2))), &[]).is_err());
        // A host driver newer than the compat libraries: plain support, compat unused.
        let c = check(&r, &driver("560.35.03", Some((12, 6))), &[]).unwrap();
        assert_eq!(c, Compat::Supported { rootfs: (12, 4), driver: (12, 6) });
        let mut e2 = e.clone();
        c.apply(&mut e2);
        assert_eq!(e2, e);
    }
}

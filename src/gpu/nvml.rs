//! The GPU inventory behind a trait: NVML (dlopened by nvml-wrapper) in production,
//! fakes in tests.

use super::{GpuInfo, GpuSource};
use anyhow::{anyhow, bail, Result};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

pub trait GpuInventory {
    /// `535.309.01`. An error means "no usable NVML" and says why.
    fn driver_version(&self) -> Result<String>;
    /// CUDA driver API version, e.g. (12, 2).
    fn cuda_driver_version(&self) -> Result<(u32, u32)>;
    fn gpus(&self) -> Result<Vec<GpuInfo>>;
    /// The MIG devices of the MIG-enabled GPUs (each with [`GpuInfo::mig`] set).
    fn mig_devices(&self) -> Result<Vec<GpuInfo>> {
        Ok(Vec::new())
    }
    /// Host directory the NVML library was loaded from.
    fn library_dir(&self) -> Option<PathBuf>;
}

/// Present when the NVIDIA kernel module is loaded (also inside containers).
pub const KERNEL_MODULE_FILE: &str = "/proc/driver/nvidia/version";

/// NVML through nvml-wrapper. Construction never fails: when the library can't be
/// loaded or initialized, every call returns that reason.
pub struct NvmlInventory {
    nvml: std::result::Result<nvml_wrapper::Nvml, String>,
    lib_dir: Option<PathBuf>,
}

impl NvmlInventory {
    /// Loads `libnvidia-ml.so.1`: for driver root `/` through the normal search path
    /// first, then from `extra_lib_dirs`; for another root, from that root's linker
    /// cache entry and its `extra_lib_dirs` (like `nvidia-ctk --driver-root`).
    ///
    /// NVML is not even loaded when the host has no NVIDIA kernel module (no
    /// `/proc/driver/nvidia/version`): it could not answer anyway, and NVML running as
    /// root creates `/dev/nvidiactl` on the host as a side effect of `nvmlInit` (seen with
    /// Debian's 535 libnvidia-ml on a host without a GPU).
    pub fn load(driver_root: &Path, extra_lib_dirs: &[PathBuf]) -> NvmlInventory {
        Self::load_with_module_check(driver_root, extra_lib_dirs, Path::new(KERNEL_MODULE_FILE))
    }

    /// [`NvmlInventory::load`] with the kernel-module marker file given (tests).
    pub fn load_with_module_check(driver_root: &Path, extra_lib_dirs: &[PathBuf], module_file: &Path) -> NvmlInventory {
        if !module_file.exists() {
            return NvmlInventory {
                nvml: Err(format!("the NVIDIA kernel module is not loaded on this host: no {}", module_file.display())),
                lib_dir: None,
            };
        }
        let mut tries: Vec<PathBuf> = Vec::new();
        let system_root = driver_root == Path::new("/");
        if system_root {
            tries.push(PathBuf::from("libnvidia-ml.so.1"));
        } else if let Ok(cache) = super::ldcache::LdCache::load(driver_root) {
            for e in cache.lookup("libnvidia-ml.so.1") {
                if let Ok(p) = super::paths::resolve_host(driver_root, &e.path) {
                    tries.push(p);
                }
            }
        }
        for d in extra_lib_dirs {
            if let Ok(p) = super::paths::resolve_host(driver_root, &d.join("libnvidia-ml.so.1")) {
                if !tries.contains(&p) {
                    tries.push(p);
                }
            }
        }
        let mut errors = Vec::new();
        for lib in &tries {
            match nvml_wrapper::Nvml::builder().lib_path(OsStr::new(lib)).init() {
                Ok(nvml) => return NvmlInventory { nvml: Ok(nvml), lib_dir: loaded_nvml_dir() },
                Err(e) => errors.push(format!("{}: {}", lib.display(), describe(&e))),
            }
        }
        let why =
            if errors.is_empty() { format!("not found under {}", driver_root.display()) } else { errors.join("; ") };
        NvmlInventory { nvml: Err(why), lib_dir: None }
    }

    fn nvml(&self) -> Result<&nvml_wrapper::Nvml> {
        self.nvml.as_ref().map_err(|e| anyhow!("{e}"))
    }
}

fn describe(e: &nvml_wrapper::error::NvmlError) -> String {
    use nvml_wrapper::error::NvmlError as E;
    match e {
        E::LibloadingError(l) => format!("cannot load the library: {l}"),
        E::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".into(),
        E::NoPermission => "no permission to talk to the driver".into(),
        other => other.to_string(),
    }
}

/// Where the dynamic loader actually found libnvidia-ml (from /proc/self/maps).
fn loaded_nvml_dir() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libnvidia-ml.so"))
        .and_then(|p| Path::new(p).parent().map(Path::to_path_buf))
}

impl GpuInventory for NvmlInventory {
    fn driver_version(&self) -> Result<String> {
        Ok(self.nvml()?.sys_driver_version()?)
    }

    fn cuda_driver_version(&self) -> Result<(u32, u32)> {
        let v = self.nvml()?.sys_cuda_driver_version()?;
        Ok(cuda_version_from_int(v))
    }

    fn gpus(&self) -> Result<Vec<GpuInfo>> {
        let nvml = self.nvml()?;
        let n = nvml.device_count()?;
        let mut out = Vec::with_capacity(n as usize);
        for index in 0..n {
            let d = nvml.device_by_index(index)?;
            out.push(GpuInfo {
                index,
                uuid: Some(d.uuid()?),
                name: d.name().unwrap_or_else(|_| "unknown".into()),
                minor: d.minor_number()?,
                memory_total_bytes: d.memory_info().ok().map(|m| m.total),
                compute_capability: d.cuda_compute_capability().ok().map(|c| (c.major as u32, c.minor as u32)),
                mig_enabled: d.mig_mode().ok().map(|m| m.current == 1),
                pci_bus_id: d.pci_info().ok().map(|p| p.bus_id),
                source: GpuSource::Nvml,
                mig: None,
            });
        }
        Ok(out)
    }

    fn mig_devices(&self) -> Result<Vec<GpuInfo>> {
        let nvml = self.nvml()?;
        let mut out = Vec::new();
        for index in 0..nvml.device_count()? {
            let d = nvml.device_by_index(index)?;
            if !d.mig_mode().is_ok_and(|m| m.current == 1) {
                continue;
            }
            let minor = d.minor_number()?;
            // The most MIG devices the GPU can have; empty slots answer NotFound.
            for slot in 0..d.mig_device_count()? {
                let Ok(m) = d.mig_device_by_index(slot) else { continue };
                let (gi, ci) = crate::sys::nvml_mig::instance_ids(nvml, &m)
                    .map_err(|e| anyhow!("MIG device {slot} of GPU {index}: {e}"))?;
                out.push(GpuInfo {
                    index,
                    uuid: Some(m.uuid()?),
                    name: m.name().unwrap_or_else(|_| "MIG device".into()),
                    minor,
                    memory_total_bytes: m.memory_info().ok().map(|x| x.total),
                    compute_capability: d.cuda_compute_capability().ok().map(|c| (c.major as u32, c.minor as u32)),
                    mig_enabled: Some(true),
                    pci_bus_id: d.pci_info().ok().map(|p| p.bus_id),
                    source: GpuSource::Nvml,
                    mig: Some(super::MigInstance { gi, ci }),
                });
            }
        }
        Ok(out)
    }

    fn library_dir(&self) -> Option<PathBuf> {
        self.lib_dir.clone()
    }
}

/// NVML's `12040` -> (12, 4).
pub fn cuda_version_from_int(v: i32) -> (u32, u32) {
    let v = v.max(0) as u32;
    (v / 1000, (v % 1000) / 10)
}

/// No NVML at all (e.g. `--gpus none`, or tests of the device-node path).
pub struct NoInventory {
    pub reason: String,
}

impl GpuInventory for NoInventory {
    fn driver_version(&self) -> Result<String> {
        bail!("{}", self.reason)
    }
    fn cuda_driver_version(&self) -> Result<(u32, u32)> {
        bail!("{}", self.reason)
    }
    fn gpus(&self) -> Result<Vec<GpuInfo>> {
        bail!("{}", self.reason)
    }
    fn library_dir(&self) -> Option<PathBuf> {
        None
    }
}

/// A scripted inventory for tests of the GPU-present path.
#[derive(Debug, Clone, Default)]
pub struct FakeInventory {
    pub version: String,
    pub cuda: (u32, u32),
    pub gpus: Vec<GpuInfo>,
    pub mig: Vec<GpuInfo>,
    pub lib_dir: Option<PathBuf>,
}

impl FakeInventory {
    /// `n` GPUs with minors 0..n and UUIDs `GPU-00000000-0000-0000-0000-00000000000<i>`.
    pub fn with_gpus(version: &str, n: u32) -> FakeInventory {
        FakeInventory {
            version: version.into(),
            cuda: (12, 2),
            gpus: (0..n)
                .map(|i| GpuInfo {
                    index: i,
                    uuid: Some(format!("GPU-00000000-0000-0000-0000-{i:012}")),
                    name: "NVIDIA H100 80GB HBM3".into(),
                    minor: i,
                    memory_total_bytes: Some(80 << 30),
                    compute_capability: Some((9, 0)),
                    mig_enabled: Some(false),
                    pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + i)),
                    source: GpuSource::Nvml,
                    mig: None,
                })
                .collect(),
            mig: Vec::new(),
            lib_dir: None,
        }
    }

    /// Turns MIG on for GPU `index` with one MIG device per `(gi, ci)`, UUIDs
    /// `MIG-00000000-0000-0000-0000-<index><gi><ci>`.
    pub fn with_mig(mut self, index: u32, instances: &[(u32, u32)]) -> FakeInventory {
        let parent = self.gpus.iter_mut().find(|g| g.index == index).expect("a GPU of that index");
        parent.mig_enabled = Some(true);
        let parent = parent.clone();
        for &(gi, ci) in instances {
            self.mig.push(GpuInfo {
                uuid: Some(format!("MIG-00000000-0000-0000-0000-{index:04}{gi:04}{ci:04}")),
                name: "NVIDIA H100 80GB HBM3 MIG 1g.10gb".into(),
                memory_total_bytes: Some(10 << 30),
                mig: Some(super::MigInstance { gi, ci }),
                ..parent.clone()
            });
        }
        self
    }
}

impl GpuInventory for FakeInventory {
    fn driver_version(&self) -> Result<String> {
        Ok(self.version.clone())
    }
    fn cuda_driver_version(&self) -> Result<(u32, u32)> {
        Ok(self.cuda)
    }
    fn gpus(&self) -> Result<Vec<GpuInfo>> {
        Ok(self.gpus.clone())
    }
    fn mig_devices(&self) -> Result<Vec<GpuInfo>> {
        Ok(self.mig.clone())
    }
    fn library_dir(&self) -> Option<PathBuf> {
        self.lib_dir.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_versions() {
        assert_eq!(cuda_version_from_int(12040), (12, 4));
        assert_eq!(cuda_version_from_int(12020), (12, 2));
        assert_eq!(cuda_version_from_int(11080), (11, 8));
    }

    /// On a host without the NVIDIA driver this must be a clean error, not a panic; on a
    /// GPU host NVML must answer.
    #[test]
    fn real_nvml_loads_or_says_why() {
        let t = tempfile::tempdir().unwrap();
        let inv = NvmlInventory::load(Path::new("/"), &[t.path().to_path_buf()]);
        match inv.driver_version() {
            Ok(v) => {
                assert!(super::super::is_driver_version(&v), "{v}");
                assert!(inv.library_dir().is_some());
            }
            Err(e) => {
                let host_has_module = Path::new(KERNEL_MODULE_FILE).exists();
                let e = e.to_string();
                if host_has_module {
                    assert!(e.contains("libnvidia-ml.so.1"), "{e}");
                } else {
                    assert!(e.contains("kernel module is not loaded"), "{e}");
                }
                assert!(inv.gpus().is_err());
                assert_eq!(inv.library_dir(), None);
            }
        }
    }

    /// With the module "loaded" and an empty driver root, the library is simply absent.
    #[test]
    fn nvml_absent_from_driver_root() {
        let root = tempfile::tempdir().unwrap();
        let marker = root.path().join("version");
        std::fs::write(&marker, "NVRM version: fake").unwrap();
        let inv =
            NvmlInventory::load_with_module_check(root.path(), &[PathBuf::from("/usr/local/nvidia/lib64")], &marker);
        let e = inv.driver_version().unwrap_err().to_string();
        assert!(e.contains("not found under"), "{e}");
        // A root with an unloadable libnvidia-ml.so.1: the loader's reason is kept.
        let lib = root.path().join("usr/local/nvidia/lib64");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libnvidia-ml.so.1"), b"not an ELF file").unwrap();
        let inv =
            NvmlInventory::load_with_module_check(root.path(), &[PathBuf::from("/usr/local/nvidia/lib64")], &marker);
        let e = inv.driver_version().unwrap_err().to_string();
        assert!(e.contains("libnvidia-ml.so.1: cannot load the library"), "{e}");
    }
}

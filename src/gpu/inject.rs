//! Discovered driver + chosen GPUs -> [`ContainerEdits`] for one sandbox.
//!
//! # Where the libraries go, and why host libraries win
//! Each driver library is bind-mounted read-only into [`LIB_DIR`], its SONAME links are
//! created next to it, and the sandbox's linker cache is rebuilt (`update_ldcache`) with
//! [`LIB_DIR`] written to [`LDCONF_D_FILE`]. glibc's ldconfig scans the directories in
//! the order it reads them (`/etc/ld.so.conf`'s `include ld.so.conf.d/*.conf` is expanded
//! in sorted order, and the trusted `/lib`, `/usr/lib` dirs come last), and ld.so takes
//! the *first* cache entry for a SONAME. Checked on glibc 2.36 (Debian 12) with two
//! directories holding different `libfoo.so.1`: the directory of the conf file sorting
//! first won (`000-a.conf` vs `999-b.conf`, both orders), and a `000-` conf file won
//! over a copy in `/usr/lib/x86_64-linux-gnu` listed by Debian's `x86_64-linux-gnu.conf`;
//! a conf file sorting after `x86_64-linux-gnu.conf` lost. So `000-azp-sandbox-nvidia.conf`
//! makes the host driver win over a rootfs `libcuda1` from Debian's CUDA toolkit, also
//! when a job's `apt-get install` reruns ldconfig.
//!
//! That is not enough against `LD_LIBRARY_PATH`, RUNPATH or dlopen by absolute path of a
//! rootfs copy, nor a conf file sorting before `000-`. [`rootfs_overrides`] closes those:
//! it bind-mounts the host library over every driver-library file the rootfs carries
//! (found through the rootfs's own linker cache and CUDA forward-compat dirs that are
//! not newer than the host driver).

use super::driver::Capabilities;
use super::found::Library;
use super::graphics::{DriverFile, FileCap};
use super::ldcache::LdCache;
use super::paths::{host_path, resolve_in_root};
use super::{split_so_name, Driver, GpuInfo};
use crate::edits::{BindMount, ContainerEdits, DeviceNode};
use anyhow::{anyhow, bail, Result};
use std::cmp::Ordering;
use std::path::{Path, PathBuf};

/// Container directory holding the driver libraries.
pub const LIB_DIR: &str = "/usr/local/azp-sandbox/nvidia/lib64";
/// The ld.so.conf.d entry the sandbox writes (`ld_library_dirs`, one per line).
pub const LDCONF_D_FILE: &str = "/etc/ld.so.conf.d/000-azp-sandbox-nvidia.conf";
/// Binaries are bind-mounted to `/usr/bin/<name>` (on every PATH; no PATH change needed).
pub const BIN_DIR: &str = "/usr/bin";
/// Options of every read-only file bind.
pub const RO_BIND: [&str; 4] = ["ro", "nosuid", "nodev", "bind"];

/// Unversioned links created for linking (`-lcuda`), when the library is injected.
const DEV_LINKS: &[(&str, &str)] = &[
    ("libcuda", "libcuda.so"),
    ("libnvidia-ml", "libnvidia-ml.so"),
    ("libnvcuvid", "libnvcuvid.so"),
    ("libnvidia-encode", "libnvidia-encode.so"),
    ("libnvidia-opticalflow", "libnvidia-opticalflow.so"),
];

fn ro_bind(host: &Path, container: impl Into<PathBuf>, optional: bool) -> BindMount {
    BindMount {
        host_path: host.to_path_buf(),
        container_path: container.into(),
        options: RO_BIND.iter().map(|s| s.to_string()).collect(),
        optional,
    }
}

fn node(d: &super::devices::DeviceFile) -> DeviceNode {
    DeviceNode {
        path: d.path.clone(),
        host_path: d.host_path.clone(),
        kind: d.kind,
        major: d.major,
        minor: d.minor,
        file_mode: d.mode,
        uid: d.uid,
        gid: d.gid,
        access: "rwm".into(),
    }
}

/// Libraries of `driver` that `caps` brings.
pub fn libraries_for<'a>(driver: &'a Driver, caps: &Capabilities) -> Vec<&'a Library> {
    let groups = caps.groups();
    driver.libraries.iter().filter(|l| groups.contains(&l.group)).collect()
}

/// Graphics/display files of `driver` that `caps` brings: `graphics` (or `display`) the
/// loader JSON files whose libraries are all among `libs` (see [`super::graphics`]),
/// `display` also the Xorg modules and configuration.
pub fn files_for<'a>(driver: &'a Driver, caps: &Capabilities, libs: &[&Library]) -> Vec<&'a DriverFile> {
    driver
        .files
        .iter()
        .filter(|f| match f.cap {
            FileCap::Graphics => caps.graphics || caps.display,
            FileCap::Display => caps.display,
        })
        .filter(|f| f.libraries.iter().all(|r| libs.iter().any(|l| l.name == r.library)))
        .collect()
}

/// The edits giving a sandbox exactly `selected` (nodes of those GPUs only) with the
/// driver parts `caps` asks for. Empty `selected` gives empty edits.
pub fn edits(driver: &Driver, selected: &[GpuInfo], caps: &Capabilities) -> Result<ContainerEdits> {
    let mut e = ContainerEdits::default();
    if selected.is_empty() {
        return Ok(e);
    }
    let dev = &driver.devices;
    let root_dev = driver.root.join("dev");

    // Device nodes: the chosen GPUs (a MIG device: its GPU's node and its instance's
    // capability nodes), then the control nodes.
    for g in selected {
        let n = dev.gpu_node(g.minor).ok_or_else(|| {
            anyhow!(
                "GPU {} needs /dev/nvidia{} but {} has no such node: run `nvidia-modprobe -c {}` on the host",
                g.index,
                g.minor,
                root_dev.display(),
                g.minor
            )
        })?;
        let mut nodes = vec![n];
        if let Some(mig) = g.mig {
            nodes.extend(dev.mig_caps(&driver.root, g.minor, mig).map_err(|e| anyhow!("{e}"))?);
        }
        for n in nodes {
            if !e.device_nodes.iter().any(|d| d.path == n.path) {
                e.device_nodes.push(node(n));
            }
        }
    }
    let ctl = dev.ctl.as_ref().ok_or_else(|| {
        anyhow!(
            "no /dev/nvidiactl under {}: load the nvidia kernel module (modprobe nvidia) on the host",
            root_dev.display()
        )
    })?;
    e.device_nodes.push(node(ctl));
    if caps.compute {
        if dev.uvm.is_none() {
            bail!(
                "no /dev/nvidia-uvm under {}: CUDA needs it; run `nvidia-modprobe -u -c=0` on the host, or request only the utility capability",
                root_dev.display()
            );
        }
        if let Some(s) = dev.stale.first() {
            bail!("{s}");
        }
    }
    for n in [&dev.uvm, &dev.uvm_tools, &dev.modeset, &dev.gdrdrv].into_iter().flatten() {
        e.device_nodes.push(node(n));
    }

    // Libraries.
    let Some(version) = &driver.version else {
        bail!(
            "no NVIDIA driver libraries found under {}: {}",
            driver.root.display(),
            driver
                .missing
                .iter()
                .find(|m| m.item == "driver libraries")
                .map(|m| m.why.as_str())
                .unwrap_or("unknown driver version")
        );
    };
    for (needed, cap_on, cap) in [("libnvidia-ml", caps.utility, "utility"), ("libcuda", caps.compute, "compute")] {
        if cap_on && driver.library(needed).is_none() {
            bail!(
                "{needed}.so.{version} not found (needed for the {cap} capability): it is neither in {}/etc/ld.so.cache nor in the extra lib dirs; add the driver's library dir to the configuration",
                driver.root.display()
            );
        }
    }
    let libs = libraries_for(driver, caps);
    let dir = Path::new(LIB_DIR);
    for l in &libs {
        e.mounts.push(ro_bind(&l.host_path, dir.join(&l.file_name), false));
        if l.soname != l.file_name {
            e.symlinks.push((dir.join(&l.soname), PathBuf::from(&l.file_name)));
        }
        if let Some((_, link)) = DEV_LINKS.iter().find(|(n, _)| *n == l.name) {
            e.symlinks.push((dir.join(link), PathBuf::from(&l.soname)));
        }
    }
    if !libs.is_empty() {
        e.update_ldcache = true;
        e.ld_library_dirs.push(dir.to_path_buf());
    }

    // Binaries.
    let groups = caps.groups();
    for b in driver.binaries.iter().filter(|b| groups.contains(&b.group)) {
        e.mounts.push(ro_bind(&b.host_path, Path::new(BIN_DIR).join(&b.name), false));
    }

    // Graphics/display files, and their libraries where a file names them by path.
    for f in files_for(driver, caps, &libs) {
        e.mounts.push(ro_bind(&f.host_path, f.container_path.clone(), false));
        for r in &f.libraries {
            let (Some(at), Some(lib)) = (&r.bind_at, libs.iter().find(|l| l.name == r.library)) else {
                continue;
            };
            if !e.mounts.iter().any(|m| &m.container_path == at) {
                e.mounts.push(ro_bind(&lib.host_path, at.clone(), false));
            }
        }
    }

    // Optional: firmware, sockets, MPS pipe dir.
    for f in &driver.firmware {
        e.mounts.push(ro_bind(&f.host_path, f.container_path.clone(), true));
    }
    for s in &driver.sockets {
        e.mounts.push(ro_bind(&s.host_path, s.container_path.clone(), true));
    }
    if let (true, Some(d)) = (caps.compute, &driver.mps_pipe_dir) {
        e.mounts.push(BindMount {
            host_path: d.clone(),
            container_path: PathBuf::from(super::driver::MPS_PIPE_DIR),
            options: vec!["nosuid".into(), "nodev".into(), "bind".into()],
            optional: true,
        });
    }

    // Environment.
    // UUIDs when every GPU has one (stable across reboots), else indexes.
    let visible = match selected.iter().map(|g| g.uuid.clone()).collect::<Option<Vec<_>>>() {
        Some(uuids) => uuids.join(","),
        None => selected.iter().map(|g| g.index.to_string()).collect::<Vec<_>>().join(","),
    };
    e.env.push(("NVIDIA_VISIBLE_DEVICES".into(), visible));
    e.env.push((
        "CUDA_VISIBLE_DEVICES".into(),
        (0..selected.len()).map(|i| i.to_string()).collect::<Vec<_>>().join(","),
    ));
    e.env.push(("NVIDIA_DRIVER_CAPABILITIES".into(), caps.to_string()));
    // libvdpau loads its driver from a dir compiled into it (`/usr/lib/<arch>/vdpau`,
    // `/usr/lib64/vdpau`), unless this names another.
    if libs.iter().any(|l| l.name == "libvdpau_nvidia") {
        e.env.push(("VDPAU_DRIVER_PATH".into(), LIB_DIR.into()));
    }
    Ok(e)
}

/// Extra read-only binds of the host libraries over the driver libraries a rootfs ships
/// (`rootfs` is the host path of the sandbox's lower layer). Returns the mounts and notes
/// about what was left alone. See the module doc for why.
pub fn rootfs_overrides(driver: &Driver, caps: &Capabilities, rootfs: &Path) -> Result<(Vec<BindMount>, Vec<String>)> {
    let mut mounts: Vec<BindMount> = Vec::new();
    let mut notes = Vec::new();
    let Some(version) = &driver.version else {
        return Ok((mounts, notes));
    };
    let libs = libraries_for(driver, caps);
    let find = |base: &str| libs.iter().find(|l| l.name == base).copied();
    let add = |lib: &Library, target: PathBuf, mounts: &mut Vec<BindMount>| {
        if !target.starts_with(LIB_DIR) && !mounts.iter().any(|m| m.container_path == target) {
            mounts.push(ro_bind(&lib.host_path, target, false));
        }
    };

    if let Ok(cache) = LdCache::load(rootfs) {
        for entry in cache.entries.iter().filter(|e| e.is_host_native()) {
            let Some((base, _)) = split_so_name(&entry.name) else {
                continue;
            };
            let Some(lib) = find(base) else { continue };
            if let Ok(real) = resolve_in_root(rootfs, &entry.path) {
                if host_path(rootfs, &real).is_file() {
                    add(lib, real, &mut mounts);
                }
            }
        }
    }

    // CUDA forward-compat libraries (/usr/local/cuda*/compat): shadowed unless newer.
    if let Ok(rd) = std::fs::read_dir(rootfs.join("usr/local")) {
        let mut dirs: Vec<_> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("cuda"))
            .map(|e| PathBuf::from("/usr/local").join(e.file_name()).join("compat"))
            .collect();
        dirs.sort();
        for d in dirs {
            let Ok(real_dir) = resolve_in_root(rootfs, &d) else {
                continue;
            };
            let Ok(rd) = std::fs::read_dir(host_path(rootfs, &real_dir)) else {
                continue;
            };
            let mut names: Vec<String> = rd.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
            names.sort();
            for name in names {
                let Some((base, v)) = split_so_name(&name) else {
                    continue;
                };
                let Some(lib) = find(base) else { continue };
                if !super::is_driver_version(v) {
                    continue;
                }
                let target = real_dir.join(&name);
                if !host_path(rootfs, &target).is_file() {
                    continue;
                }
                if compare_versions(v, version) == Ordering::Greater {
                    notes.push(format!(
                        "{} (forward compatibility, {v}) is newer than the host driver {version}: left in place",
                        target.display()
                    ));
                } else {
                    add(lib, target, &mut mounts);
                }
            }
        }
    }
    Ok((mounts, notes))
}

/// Numeric, dot-separated comparison (`535.309.01` < `550.54.15`).
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let pa: Vec<u64> = a.split('.').map(|x| x.parse().unwrap_or(0)).collect();
    let pb: Vec<u64> = b.split('.').map(|x| x.parse().unwrap_or(0)).collect();
    pa.cmp(&pb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(compare_versions("535.309.01", "550.54.15"), Ordering::Less);
        assert_eq!(compare_versions("550.54.15", "550.54.15"), Ordering::Equal);
        assert_eq!(compare_versions("550.100", "550.54.15"), Ordering::Greater);
    }
}

//! NVIDIA device nodes under `<driver_root>/dev`, with type/major/minor/mode read from
//! the nodes themselves (nvidia-uvm's major is dynamic: never assumed).

use super::{paths::host_path, MigInstance, Missing};
use crate::edits::DeviceKind;
use serde::Serialize;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceFile {
    /// Path inside the driver root and the sandbox: `/dev/nvidia0`.
    pub path: PathBuf,
    pub host_path: PathBuf,
    pub kind: DeviceKind,
    pub major: i64,
    pub minor: i64,
    /// Permission bits (`0o666`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Devices {
    pub ctl: Option<DeviceFile>,
    pub uvm: Option<DeviceFile>,
    pub uvm_tools: Option<DeviceFile>,
    pub modeset: Option<DeviceFile>,
    /// `/dev/nvidia<N>`, sorted by minor.
    pub gpus: Vec<DeviceFile>,
    /// `/dev/nvidia-caps/*` (MIG capabilities).
    pub caps: Vec<DeviceFile>,
    /// `/dev/gdrdrv` (GPUDirect RDMA), if loaded.
    pub gdrdrv: Option<DeviceFile>,
    /// Problems that make a node unusable (e.g. a stale nvidia-uvm major).
    pub stale: Vec<String>,
    pub notes: Vec<String>,
}

impl Devices {
    /// The node of the GPU with this minor number.
    pub fn gpu_node(&self, minor: u32) -> Option<&DeviceFile> {
        self.gpus.iter().find(|d| d.minor == minor as i64)
    }

    /// The nodes every GPU job gets (present ones only).
    pub fn control_nodes(&self) -> Vec<&DeviceFile> {
        [&self.ctl, &self.uvm, &self.uvm_tools, &self.modeset].into_iter().flatten().collect()
    }

    pub(crate) fn missing_caps_reason(&self) -> Vec<Missing> {
        self.caps
            .iter()
            .map(|c| Missing {
                item: format!("{} (optional)", c.path.display()),
                why: "MIG capability node: a job gets only those of the MIG devices it is given (--gpus MIG-<uuid>)"
                    .into(),
            })
            .collect()
    }

    /// The `/dev/nvidia-caps` nodes a job given MIG device `mig` of the GPU with node
    /// minor `minor` needs: its GPU instance's and its compute instance's access
    /// capabilities, whose minors the driver publishes in procfs under `root`.
    pub fn mig_caps(&self, root: &Path, minor: u32, mig: MigInstance) -> Result<Vec<&DeviceFile>, String> {
        let gi = format!("{MIG_CAPS_PROC}/gpu{minor}/mig/gi{}", mig.gi);
        let mut out = Vec::new();
        for access in [format!("{gi}/access"), format!("{gi}/ci{}/access", mig.ci)] {
            let host = root.join(&access);
            let text = std::fs::read_to_string(&host).map_err(|e| {
                format!(
                    "MIG device gi{}/ci{} of /dev/nvidia{minor}: cannot read {}: {e}; does the instance still exist (nvidia-smi mig -lci)?",
                    mig.gi,
                    mig.ci,
                    host.display()
                )
            })?;
            let cap = parse_cap_minor(&text).ok_or_else(|| {
                format!("{}: no DeviceFileMinor line (a driver without MIG capabilities?)", host.display())
            })?;
            let path = PathBuf::from(format!("/dev/nvidia-caps/nvidia-cap{cap}"));
            let node = self.caps.iter().find(|c| c.path == path).ok_or_else(|| {
                format!(
                    "MIG device gi{}/ci{} of /dev/nvidia{minor} needs {} but {} has no such node: create it (nvidia-modprobe -f /{access})",
                    mig.gi,
                    mig.ci,
                    path.display(),
                    root.join("dev/nvidia-caps").display()
                )
            })?;
            out.push(node);
        }
        Ok(out)
    }
}

/// The driver's MIG capability files, under the driver root.
pub const MIG_CAPS_PROC: &str = "proc/driver/nvidia/capabilities";

/// `DeviceFileMinor: 12` of a capability's `access` file.
pub fn parse_cap_minor(text: &str) -> Option<u32> {
    text.lines().find_map(|l| l.strip_prefix("DeviceFileMinor:")?.trim().parse().ok())
}

/// Reads one node; `Ok(None)` when absent, a note when it exists but is not a device.
pub fn stat_node(root: &Path, path: &Path) -> Result<Option<DeviceFile>, String> {
    let host = host_path(root, path);
    let meta = match std::fs::metadata(&host) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot stat {}: {e}", host.display())),
    };
    let ft = meta.file_type();
    let kind = if ft.is_char_device() {
        DeviceKind::Char
    } else if ft.is_block_device() {
        DeviceKind::Block
    } else {
        return Err(format!("{} exists but is not a device node", host.display()));
    };
    let rdev = meta.rdev();
    Ok(Some(DeviceFile {
        path: path.to_path_buf(),
        host_path: host,
        kind,
        major: libc::major(rdev) as i64,
        minor: libc::minor(rdev) as i64,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
    }))
}

pub fn scan(root: &Path) -> Devices {
    let mut d = Devices::default();
    let one = |d: &mut Devices, name: &str| -> Option<DeviceFile> {
        match stat_node(root, &Path::new("/dev").join(name)) {
            Ok(n) => n,
            Err(e) => {
                d.notes.push(e);
                None
            }
        }
    };
    d.ctl = one(&mut d, "nvidiactl");
    d.uvm = one(&mut d, "nvidia-uvm");
    d.uvm_tools = one(&mut d, "nvidia-uvm-tools");
    d.modeset = one(&mut d, "nvidia-modeset");
    d.gdrdrv = one(&mut d, "gdrdrv");

    if let Ok(rd) = std::fs::read_dir(root.join("dev")) {
        let mut names: Vec<(u32, String)> = rd
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| n.strip_prefix("nvidia")?.parse::<u32>().ok().map(|i| (i, n.clone())))
            .collect();
        names.sort();
        for (n, name) in names {
            if let Some(node) = one(&mut d, &name) {
                if node.minor != n as i64 {
                    d.notes.push(format!("/dev/{name} has minor {} (expected {n})", node.minor));
                }
                d.gpus.push(node);
            }
        }
    }
    d.gpus.sort_by_key(|n| n.minor);
    if let Ok(rd) = std::fs::read_dir(root.join("dev/nvidia-caps")) {
        let mut names: Vec<String> = rd.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
        names.sort();
        for name in names {
            if let Some(node) = one(&mut d, &format!("nvidia-caps/{name}")) {
                d.caps.push(node);
            }
        }
    }

    // Cross-check the dynamic majors with /proc/devices when the root has one.
    if let Ok(text) = std::fs::read_to_string(root.join("proc/devices")) {
        let majors = parse_proc_devices(&text);
        let checks: Vec<(&Option<DeviceFile>, &str)> = vec![(&d.uvm, "nvidia-uvm"), (&d.uvm_tools, "nvidia-uvm")];
        let mut stale = Vec::new();
        for (node, driver) in checks {
            if let (Some(node), Some(m)) = (node, majors.iter().find(|(_, n)| n == driver).map(|(m, _)| *m)) {
                if node.major != m {
                    stale.push(format!(
                        "{} is {}:{} but {} says {driver} has major {m}: the node is stale, recreate it (`rm {}; nvidia-modprobe -u -c=0`)",
                        node.host_path.display(),
                        node.major,
                        node.minor,
                        root.join("proc/devices").display(),
                        node.host_path.display()
                    ));
                }
            }
        }
        d.stale = stale;
    }
    d
}

/// Character-device majors from `/proc/devices`: `(major, name)`.
pub fn parse_proc_devices(text: &str) -> Vec<(i64, String)> {
    let mut out = Vec::new();
    let mut in_char = false;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with("Character devices") {
            in_char = true;
            continue;
        }
        if l.starts_with("Block devices") {
            in_char = false;
            continue;
        }
        if in_char {
            if let Some((m, n)) = l.split_once(char::is_whitespace) {
                if let Ok(m) = m.parse() {
                    out.push((m, n.trim().to_string()));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_capability_minors() {
        assert_eq!(parse_cap_minor("DeviceFileMinor: 12\nDeviceFileMode: 292\nDeviceFileModify: 1\n"), Some(12));
        assert_eq!(parse_cap_minor("DeviceFileMode: 292\n"), None);
        // Without procfs files or nodes: errors that say what to do.
        let t = tempfile::tempdir().unwrap();
        let d = Devices::default();
        let e = d.mig_caps(t.path(), 0, MigInstance { gi: 1, ci: 0 }).unwrap_err();
        assert!(e.contains("capabilities/gpu0/mig/gi1/access") && e.contains("nvidia-smi mig -lci"), "{e}");
        let gi = t.path().join(MIG_CAPS_PROC).join("gpu0/mig/gi1");
        std::fs::create_dir_all(gi.join("ci0")).unwrap();
        std::fs::write(gi.join("access"), "DeviceFileMinor: 12\n").unwrap();
        std::fs::write(gi.join("ci0/access"), "DeviceFileMinor: 13\n").unwrap();
        let e = d.mig_caps(t.path(), 0, MigInstance { gi: 1, ci: 0 }).unwrap_err();
        assert!(e.contains("needs /dev/nvidia-caps/nvidia-cap12") && e.contains("nvidia-modprobe -f"), "{e}");
    }

    #[test]
    fn proc_devices() {
        let t = "Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-caps\n511 nvidia-uvm\n\nBlock devices:\n  8 sd\n511 fake\n";
        let m = parse_proc_devices(t);
        assert!(m.contains(&(511, "nvidia-uvm".into())));
        assert!(m.contains(&(195, "nvidia-frontend".into())));
        assert!(!m.contains(&(511, "fake".into())));
        assert!(!m.contains(&(8, "sd".into())));
    }

    #[test]
    fn host_dev_null_and_non_devices() {
        // /dev/null is 1:3 everywhere.
        let n = stat_node(Path::new("/"), Path::new("/dev/null")).unwrap().unwrap();
        assert_eq!((n.kind, n.major, n.minor), (DeviceKind::Char, 1, 3));
        assert_eq!(stat_node(Path::new("/"), Path::new("/dev/definitely-absent")).unwrap(), None);
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("dev")).unwrap();
        std::fs::write(t.path().join("dev/nvidia0"), b"").unwrap();
        assert!(stat_node(t.path(), Path::new("/dev/nvidia0")).unwrap_err().contains("not a device node"));
        let d = scan(t.path());
        assert!(d.gpus.is_empty());
        assert_eq!(d.notes.len(), 1, "{:?}", d.notes);
    }
}

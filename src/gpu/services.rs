//! Host-side NVIDIA services a GPU job silently depends on, and `gpu list`'s warnings
//! when one is expected but absent: without them jobs do not fail at start but later and
//! obscurely (CUDA error 802 "system not yet initialized" on NVSwitch systems without
//! the fabric manager, seconds of driver re-initialization per job without
//! nvidia-persistenced, no CUDA device in a job given a whole MIG-enabled GPU).
//!
//! [`scan`] reads what is there under the driver root; [`warnings`] is the decision, a
//! pure function of that and the GPUs, unit-tested on fake trees.

use super::paths::{host_path, resolve_host};
use super::{Devices, GpuInfo};
use serde::Serialize;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

const PERSISTENCED: &[&str] = &[
    "/run/nvidia-persistenced/socket",
    "/var/run/nvidia-persistenced/socket",
    "/run/nvidia-persistenced/nvidia-persistenced.pid",
    "/var/run/nvidia-persistenced/nvidia-persistenced.pid",
];
const FABRICMANAGER: &[&str] = &[
    "/run/nvidia-fabricmanager/socket",
    "/var/run/nvidia-fabricmanager/socket",
    "/run/nvidia-fabricmanager/nv-fabricmanager.pid",
    "/var/run/nvidia-fabricmanager/nv-fabricmanager.pid",
];
/// The IMEX daemon's configuration: present when the admin set up multi-node NVLink.
const IMEX_CONFIG: &[&str] = &["/etc/nvidia-imex/nodes_config.cfg", "/etc/nvidia-imex/config.cfg"];
pub const IMEX_CHANNELS_DIR: &str = "/dev/nvidia-caps-imex-channels";
/// Written by the driver when MIG capabilities exist (MIG-capable GPUs, R450+).
const MIG_CONFIG_CAP: &str = "/proc/driver/nvidia/capabilities/mig/config";

/// What [`scan`] found (paths inside the driver root).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Services {
    /// nvidia-persistenced's socket or pid file.
    pub persistenced: Option<PathBuf>,
    /// nv-fabricmanager's socket or pid file.
    pub fabricmanager: Option<PathBuf>,
    /// NVSwitch devices: `/dev/nvidia-nvswitch<N>` nodes and
    /// `/proc/driver/nvidia-nvswitch/devices/*` entries.
    pub nvswitches: Vec<PathBuf>,
    /// The IMEX daemon's configuration file, when there is one.
    pub imex_config: Option<PathBuf>,
    /// `/dev/nvidia-caps-imex-channels/channel<N>` nodes.
    pub imex_channels: Vec<PathBuf>,
    /// `/proc/driver/nvidia/capabilities/mig/config` exists.
    pub mig_capable: bool,
}

fn first_present(root: &Path, candidates: &[&str], sockets_only: bool) -> Option<PathBuf> {
    candidates.iter().map(Path::new).find_map(|p| {
        let meta = std::fs::metadata(resolve_host(root, p).ok()?).ok()?;
        let ok = if p.extension().is_some_and(|e| e == "pid") {
            !sockets_only && meta.is_file()
        } else {
            meta.file_type().is_socket()
        };
        ok.then(|| p.to_path_buf())
    })
}

fn entries(root: &Path, dir: &str, prefix: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(host_path(root, Path::new(dir))) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .map(|n| Path::new(dir).join(n))
        .collect();
    v.sort();
    v
}

/// Reads the services' traces under `root`.
pub fn scan(root: &Path) -> Services {
    let mut nvswitches: Vec<PathBuf> = entries(root, "/dev", "nvidia-nvswitch")
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "nvidia-nvswitchctl"))
        .collect();
    nvswitches.extend(entries(root, "/proc/driver/nvidia-nvswitch/devices", ""));
    Services {
        persistenced: first_present(root, PERSISTENCED, false),
        fabricmanager: first_present(root, FABRICMANAGER, false),
        nvswitches,
        imex_config: IMEX_CONFIG.iter().map(Path::new).find(|p| host_path(root, p).is_file()).map(Path::to_path_buf),
        imex_channels: entries(root, IMEX_CHANNELS_DIR, "channel"),
        mig_capable: host_path(root, Path::new(MIG_CONFIG_CAP)).exists(),
    }
}

/// What a sysadmin should fix before GPU jobs run here, one line each.
pub fn warnings(s: &Services, gpus: &[GpuInfo], devices: &Devices) -> Vec<String> {
    let mut w = Vec::new();
    if gpus.is_empty() {
        return w;
    }
    if s.persistenced.is_none() {
        w.push(format!(
            "nvidia-persistenced is not running (no {}): without it the driver tears the GPUs down whenever no job uses them, and each job's first CUDA call re-initializes them (seconds); start it (systemctl enable --now nvidia-persistenced)",
            PERSISTENCED[0]
        ));
    }
    if !s.nvswitches.is_empty() && s.fabricmanager.is_none() {
        w.push(format!(
            "{} NVSwitch device(s) ({}) but the fabric manager is not running (no {}): CUDA fails on these GPUs with error 802 (system not yet initialized); start it (systemctl enable --now nvidia-fabricmanager, same version as the driver)",
            s.nvswitches.len(),
            s.nvswitches[0].display(),
            FABRICMANAGER[0]
        ));
    }
    if let (Some(cfg), true) = (&s.imex_config, s.imex_channels.is_empty()) {
        w.push(format!(
            "IMEX is configured ({}) but {IMEX_CHANNELS_DIR} has no channel nodes: multi-node NVLink memory sharing fails in jobs; load the driver with NVreg_CreateImexChannel0=1 or create channel0 with the major of nvidia-caps-imex-channels in /proc/devices",
            cfg.display()
        ));
    }
    let mig: Vec<&GpuInfo> = gpus.iter().filter(|g| g.mig_enabled == Some(true)).collect();
    if !mig.is_empty() {
        let list = mig.iter().map(|g| g.index.to_string()).collect::<Vec<_>>().join(", ");
        if devices.caps.is_empty() {
            w.push(format!(
                "MIG is enabled on GPU {list} but /dev/nvidia-caps has no capability nodes: MIG instances cannot be opened; create them (nvidia-modprobe -f /proc/driver/nvidia/capabilities/mig/config, or any nvidia-smi mig command as root)"
            ));
        }
        w.push(format!(
            "MIG is enabled on GPU {list}: a job given the whole GPU sees no CUDA device; give jobs its MIG devices (exec --gpus MIG-<uuid>; the agent runner's slots take whole GPUs only) or disable MIG there (nvidia-smi -i N -mig 0)"
        ));
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuSource;

    fn gpu(index: u32, mig: Option<bool>) -> GpuInfo {
        GpuInfo {
            index,
            uuid: None,
            name: "NVIDIA H100 80GB HBM3".into(),
            minor: index,
            memory_total_bytes: None,
            compute_capability: None,
            mig_enabled: mig,
            pci_bus_id: None,
            source: GpuSource::Nvml,
            mig: None,
        }
    }

    fn touch(root: &Path, p: &str) {
        let h = root.join(p.trim_start_matches('/'));
        std::fs::create_dir_all(h.parent().unwrap()).unwrap();
        std::fs::write(h, b"").unwrap();
    }

    #[test]
    fn a_plain_host_without_persistenced() {
        let t = tempfile::tempdir().unwrap();
        let s = scan(t.path());
        assert_eq!(s, Services::default());
        assert!(warnings(&s, &[], &Devices::default()).is_empty(), "no GPU, nothing expected");
        let w = warnings(&s, &[gpu(0, Some(false))], &Devices::default());
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("nvidia-persistenced is not running (no /run/nvidia-persistenced/socket)"), "{w:?}");
        // Its pid file (or socket) is enough; a socket path that is a plain file is not.
        touch(t.path(), "/run/nvidia-persistenced/socket");
        assert_eq!(scan(t.path()).persistenced, None);
        touch(t.path(), "/var/run/nvidia-persistenced/nvidia-persistenced.pid");
        let s = scan(t.path());
        assert_eq!(s.persistenced, Some(PathBuf::from("/var/run/nvidia-persistenced/nvidia-persistenced.pid")));
        assert!(warnings(&s, &[gpu(0, Some(false))], &Devices::default()).is_empty());
    }

    #[test]
    fn nvswitch_without_fabric_manager() {
        let t = tempfile::tempdir().unwrap();
        touch(t.path(), "/run/nvidia-persistenced/nvidia-persistenced.pid");
        touch(t.path(), "/dev/nvidia-nvswitchctl");
        let s = scan(t.path());
        assert!(s.nvswitches.is_empty(), "the control node alone is not a switch");
        for n in 0..4 {
            touch(t.path(), &format!("/dev/nvidia-nvswitch{n}"));
        }
        let s = scan(t.path());
        assert_eq!(s.nvswitches.len(), 4);
        let w = warnings(&s, &[gpu(0, Some(false))], &Devices::default());
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("4 NVSwitch device(s) (/dev/nvidia-nvswitch0) but the fabric manager is not running"));
        assert!(w[0].contains("error 802"));
        // The procfs listing alone also says there are switches.
        let t2 = tempfile::tempdir().unwrap();
        touch(t2.path(), "/proc/driver/nvidia-nvswitch/devices/0000:05:00.0");
        assert_eq!(
            scan(t2.path()).nvswitches,
            vec![PathBuf::from("/proc/driver/nvidia-nvswitch/devices/0000:05:00.0")]
        );
        // With the fabric manager running: no warning.
        let sock = t.path().join("run/nvidia-fabricmanager/socket");
        std::fs::create_dir_all(sock.parent().unwrap()).unwrap();
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let s = scan(t.path());
        assert_eq!(s.fabricmanager, Some(PathBuf::from("/run/nvidia-fabricmanager/socket")));
        assert!(warnings(&s, &[gpu(0, Some(false))], &Devices::default()).is_empty());
    }

    #[test]
    fn imex_configured_without_channels() {
        let t = tempfile::tempdir().unwrap();
        touch(t.path(), "/run/nvidia-persistenced/nvidia-persistenced.pid");
        // Channels without the daemon configured: nothing expected, nothing said.
        let s = scan(t.path());
        assert!(warnings(&s, &[gpu(0, None)], &Devices::default()).is_empty());
        touch(t.path(), "/etc/nvidia-imex/nodes_config.cfg");
        let w = warnings(&scan(t.path()), &[gpu(0, None)], &Devices::default());
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with(
            "IMEX is configured (/etc/nvidia-imex/nodes_config.cfg) but /dev/nvidia-caps-imex-channels has no channel nodes"
        ));
        touch(t.path(), "/dev/nvidia-caps-imex-channels/channel0");
        let s = scan(t.path());
        assert_eq!(s.imex_channels, vec![PathBuf::from("/dev/nvidia-caps-imex-channels/channel0")]);
        assert!(warnings(&s, &[gpu(0, None)], &Devices::default()).is_empty());
    }

    #[test]
    fn mig_enabled_gpus() {
        let t = tempfile::tempdir().unwrap();
        touch(t.path(), "/run/nvidia-persistenced/nvidia-persistenced.pid");
        touch(t.path(), "/proc/driver/nvidia/capabilities/mig/config");
        let s = scan(t.path());
        assert!(s.mig_capable);
        let gpus = [gpu(0, Some(false)), gpu(1, Some(true))];
        let w = warnings(&s, &gpus, &Devices::default());
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].starts_with("MIG is enabled on GPU 1 but /dev/nvidia-caps has no capability nodes"), "{w:?}");
        assert!(w[1].starts_with("MIG is enabled on GPU 1: a job given the whole GPU sees no CUDA device"), "{w:?}");
        // With the capability nodes there, only the second remains.
        let mut d = Devices::default();
        d.caps.push(crate::gpu::devices::DeviceFile {
            path: "/dev/nvidia-caps/nvidia-cap1".into(),
            host_path: "/x".into(),
            kind: crate::edits::DeviceKind::Char,
            major: 508,
            minor: 1,
            mode: 0o400,
            uid: 0,
            gid: 0,
        });
        let w = warnings(&s, &gpus, &d);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("MIG is enabled on GPU 1:"));
        // MIG off everywhere: nothing about MIG.
        assert!(warnings(&s, &[gpu(0, Some(false))], &Devices::default()).is_empty());
    }
}

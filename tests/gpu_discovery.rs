//! GPU discovery, selection, injection and CDI against a real NVIDIA driver tree built
//! from Debian's non-free packages (scripts/make-driver-tree.sh), with fake device nodes.
//! No GPU needed; root needed (the script makes device nodes). Skipped, visibly, when
//! not root or when the packages cannot be downloaded and no cached copy exists.

#[path = "common/skip.rs"]
mod skip;

use azp_sandbox::edits::{BindMount, ContainerEdits, DeviceKind};
use azp_sandbox::gpu::cdi::{self, Registry};
use azp_sandbox::gpu::inject::{self, LIB_DIR};
use azp_sandbox::gpu::ldcache::{CacheEntry, LdCache};
use azp_sandbox::gpu::report::Report;
use azp_sandbox::gpu::select::{self, split};
use azp_sandbox::gpu::{
    discover, edits_for, Capabilities, DiscoverOptions, Driver, FakeInventory, GpuRequest, GpuSource, NoInventory,
    PerAgent,
};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

struct Tree {
    root: PathBuf,
    /// Upstream driver version of the packages (`535.309.01`), from their control files.
    version: String,
}

fn fixtures_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let target = if target.is_absolute() { target } else { Path::new(env!("CARGO_MANIFEST_DIR")).join(target) };
    target.join("fixtures")
}

/// Builds (once per process; the script itself is idempotent and locked) the tree; an
/// error says why it cannot be had here.
fn tree() -> Result<&'static Tree, &'static str> {
    static TREE: OnceLock<Result<Tree, String>> = OnceLock::new();
    TREE.get_or_init(|| {
        if !nix::unistd::geteuid().is_root() {
            return Err("needs root: scripts/make-driver-tree.sh makes device nodes".into());
        }
        let root = fixtures_dir().join("driver-tree");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/make-driver-tree.sh");
        let out = Command::new("bash").arg(&script).arg(&root).output().expect("run make-driver-tree.sh");
        let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        match out.status.code() {
            Some(0) => {}
            Some(75) => {
                let why = log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
                return Err(format!("cannot download Debian's NVIDIA driver packages (no network?): {why}"));
            }
            _ => panic!("make-driver-tree.sh failed ({}):\n{log}", out.status),
        }
        let root = root.canonicalize().unwrap();
        let manifest = std::fs::read_to_string(root.join(".azp-driver-tree.manifest")).unwrap();
        let full =
            manifest.lines().find_map(|l| l.strip_prefix("libcuda1 ")).expect("libcuda1 in the manifest").to_string();
        let version = full.split('-').next().unwrap().to_string();
        Ok(Tree { root, version })
    })
    .as_ref()
    .map_err(String::as_str)
}

macro_rules! tree_or_skip {
    () => {
        match tree() {
            Ok(t) => t,
            Err(why) => return skip::skip(why),
        }
    };
}

fn opts(root: &Path) -> DiscoverOptions {
    DiscoverOptions { driver_root: root.to_path_buf(), extra_lib_dirs: Vec::new(), cdi_spec: None }
}

fn no_nvml() -> NoInventory {
    NoInventory { reason: "libnvidia-ml.so.1: cannot open shared object file: No such file or directory".into() }
}

fn discover_tree(t: &Tree) -> Driver {
    discover(&opts(&t.root), &no_nvml()).unwrap()
}

fn node_list(e: &ContainerEdits) -> Vec<(String, i64, i64)> {
    e.device_nodes.iter().map(|n| (n.path.display().to_string(), n.major, n.minor)).collect()
}

fn mount_set(e: &ContainerEdits) -> BTreeSet<(String, String, bool)> {
    e.mounts
        .iter()
        .map(|m| (m.container_path.display().to_string(), m.host_path.display().to_string(), m.optional))
        .collect()
}

fn env(e: &ContainerEdits, k: &str) -> Option<String> {
    e.env.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v.clone())
}

/// A unique scratch dir on the fixtures' filesystem (hard links to the tree work).
fn scratch(name: &str) -> PathBuf {
    let d = fixtures_dir().join(format!("scratch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn link_or_copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to).unwrap();
    }
}

// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: scripts/make-driver-tree.sh makes device nodes")]
fn ld_cache_of_the_tree() {
    let t = tree_or_skip!();
    let cache = LdCache::load(&t.root).unwrap();
    let names: BTreeSet<&str> = cache.entries.iter().map(|e| e.name.as_str()).collect();
    let pkcs = format!("libnvidia-pkcs11-openssl3.so.{}", t.version);
    let [eglcore, glcore, glsi, tls, glvkspirv, rtcore] =
        ["eglcore", "glcore", "glsi", "tls", "glvkspirv", "rtcore"].map(|n| format!("libnvidia-{n}.so.{}", t.version));
    let want: BTreeSet<&str> = [
        "libcuda.so.1",
        "libnvidia-ml.so.1",
        "libnvidia-ptxjitcompiler.so.1",
        "libnvidia-cfg.so.1",
        "libnvidia-allocator.so.1",
        "libnvcuvid.so.1",
        "libnvidia-encode.so.1",
        pkcs.as_str(),
        // video and graphics packages
        "libnvidia-opticalflow.so.1",
        "libvdpau_nvidia.so.1",
        "libEGL_nvidia.so.0",
        "libGLX_nvidia.so.0",
        "libGLESv1_CM_nvidia.so.1",
        "libGLESv2_nvidia.so.2",
        "libnvidia-egl-wayland.so.1",
        eglcore.as_str(),
        glcore.as_str(),
        glsi.as_str(),
        tls.as_str(),
        glvkspirv.as_str(),
        rtcore.as_str(),
    ]
    .into();
    assert_eq!(names, want);
    for name in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        let e: Vec<&CacheEntry> = cache.lookup(name).collect();
        assert_eq!(e.len(), 1, "{name}");
        assert_eq!(e[0].path, Path::new("/usr/lib/x86_64-linux-gnu").join(name));
        assert_eq!(e[0].flags, 0x0303);
    }
    // Same view as glibc's own reader.
    let out = Command::new("ldconfig").arg("-p").arg("-C").arg(t.root.join("etc/ld.so.cache")).output().unwrap();
    let theirs: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('\t'))
        .map(|l| l.trim().split(" (").next().unwrap().to_string())
        .collect();
    assert_eq!(theirs, want.iter().map(|s| s.to_string()).collect());
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: scripts/make-driver-tree.sh makes device nodes")]
fn discovers_the_exact_driver_files() {
    let t = tree_or_skip!();
    let d = discover_tree(t);
    let v = &t.version;
    assert_eq!(d.version.as_deref(), Some(v.as_str()));
    assert!(d.version_source.as_deref().unwrap().contains(&format!("libnvidia-ml.so.{v}")), "{:?}", d.version_source);
    assert!(!d.nvml.loaded);
    assert_eq!(d.cuda_version, None);

    let nv = "usr/lib/x86_64-linux-gnu/nvidia/current";
    let libs: BTreeSet<(String, String, String, PathBuf)> = d
        .libraries
        .iter()
        .map(|l| (l.name.clone(), l.file_name.clone(), l.soname.clone(), l.host_path.clone()))
        .collect();
    let lib = |name: &str, soname: &str, dir: &str| {
        let file = format!("{name}.so.{v}");
        let soname = if soname.is_empty() { file.clone() } else { soname.to_string() };
        (name.to_string(), file.clone(), soname, t.root.join(dir).join(&file))
    };
    let want: BTreeSet<_> = [
        lib("libcuda", "libcuda.so.1", nv),
        lib("libnvidia-ml", "libnvidia-ml.so.1", nv),
        lib("libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1", nv),
        lib("libnvidia-cfg", "libnvidia-cfg.so.1", nv),
        lib("libnvidia-allocator", "libnvidia-allocator.so.1", nv),
        lib("libnvcuvid", "libnvcuvid.so.1", nv),
        lib("libnvidia-encode", "libnvidia-encode.so.1", nv),
        lib("libnvidia-pkcs11-openssl3", "", "usr/lib/x86_64-linux-gnu"),
        lib("libnvidia-opticalflow", "libnvidia-opticalflow.so.1", nv),
        lib("libvdpau_nvidia", "libvdpau_nvidia.so.1", nv),
        lib("libEGL_nvidia", "libEGL_nvidia.so.0", nv),
        lib("libGLX_nvidia", "libGLX_nvidia.so.0", nv),
        lib("libGLESv1_CM_nvidia", "libGLESv1_CM_nvidia.so.1", nv),
        lib("libGLESv2_nvidia", "libGLESv2_nvidia.so.2", nv),
        lib("libnvidia-eglcore", "", "usr/lib/x86_64-linux-gnu"),
        lib("libnvidia-glcore", "", "usr/lib/x86_64-linux-gnu"),
        lib("libnvidia-glsi", "", "usr/lib/x86_64-linux-gnu"),
        lib("libnvidia-tls", "", "usr/lib/x86_64-linux-gnu"),
        lib("libnvidia-glvkspirv", "", "usr/lib/x86_64-linux-gnu"),
        lib("libnvidia-rtcore", "", "usr/lib/x86_64-linux-gnu"),
        // No SONAME, not in the linker cache: found next to libcuda.
        lib("libnvidia-vulkan-producer", "", nv),
        // Its own version, not the driver's.
        (
            "libnvidia-egl-wayland".to_string(),
            "libnvidia-egl-wayland.so.1.1.10".to_string(),
            "libnvidia-egl-wayland.so.1".to_string(),
            t.root.join("usr/lib/x86_64-linux-gnu/libnvidia-egl-wayland.so.1.1.10"),
        ),
    ]
    .into();
    assert_eq!(libs, want);
    for l in &d.libraries {
        let want = if l.name == "libnvidia-vulkan-producer" {
            format!("driver library dir /{nv}")
        } else {
            "ld.so.cache".to_string()
        };
        assert!(l.found_via.starts_with(&want), "{l:?}");
    }

    let bins: BTreeSet<(String, PathBuf)> = d.binaries.iter().map(|b| (b.name.clone(), b.host_path.clone())).collect();
    assert_eq!(
        bins,
        [
            ("nvidia-smi".to_string(), t.root.join("usr/lib/nvidia/current/nvidia-smi")),
            ("nvidia-cuda-mps-control".to_string(), t.root.join("usr/bin/nvidia-cuda-mps-control")),
            ("nvidia-cuda-mps-server".to_string(), t.root.join("usr/sbin/nvidia-cuda-mps-server")),
        ]
        .into()
    );
    let smi = d.binaries.iter().find(|b| b.name == "nvidia-smi").unwrap();
    assert_eq!(smi.found_at, Path::new("/usr/bin/nvidia-smi"));
    for absent in ["nvidia-debugdump (utility)", "nvidia-persistenced (utility)"] {
        assert!(d.missing.iter().any(|m| m.item == absent), "{absent} not reported missing");
    }

    let fw: BTreeSet<String> = d.firmware.iter().map(|f| f.container_path.display().to_string()).collect();
    assert_eq!(
        fw,
        [format!("/lib/firmware/nvidia/{v}/gsp_ga10x.bin"), format!("/lib/firmware/nvidia/{v}/gsp_tu10x.bin")].into()
    );
    assert!(d.sockets.is_empty());
    assert!(d.missing.iter().any(|m| m.item.starts_with("/run/nvidia-persistenced/socket")));

    let dev = &d.devices;
    let mm = |n: &Option<azp_sandbox::gpu::devices::DeviceFile>| n.as_ref().map(|n| (n.kind, n.major, n.minor));
    assert_eq!(mm(&dev.ctl), Some((DeviceKind::Char, 195, 255)));
    assert_eq!(mm(&dev.uvm), Some((DeviceKind::Char, 511, 0)));
    assert_eq!(mm(&dev.uvm_tools), Some((DeviceKind::Char, 511, 1)));
    assert_eq!(mm(&dev.modeset), Some((DeviceKind::Char, 195, 254)));
    assert_eq!(dev.gpus.iter().map(|n| (n.major, n.minor)).collect::<Vec<_>>(), vec![(195, 0), (195, 1)]);
    assert_eq!(dev.caps.iter().map(|n| (n.major, n.minor)).collect::<Vec<_>>(), vec![(508, 1), (508, 2)]);
    assert_eq!(dev.gdrdrv, None);
    assert!(dev.stale.is_empty(), "{:?}", dev.stale);

    // No NVML: the GPUs come from the nodes, and say so.
    assert_eq!(d.gpu_source, Some(GpuSource::DeviceNodes));
    assert_eq!(
        d.gpus.iter().map(|g| (g.index, g.minor, g.uuid.clone())).collect::<Vec<_>>(),
        vec![(0, 0, None), (1, 1, None)]
    );
    assert!(d.unavailable_reason().is_none());
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: scripts/make-driver-tree.sh makes device nodes")]
fn default_injection_is_exact() {
    let t = tree_or_skip!();
    let d = discover_tree(t);
    let v = &t.version;
    let gpus = select::select(&d, &GpuRequest::All).unwrap();
    let e = inject::edits(&d, &gpus, &Capabilities::default()).unwrap();
    assert_eq!(
        node_list(&e),
        vec![
            ("/dev/nvidia0".into(), 195, 0),
            ("/dev/nvidia1".into(), 195, 1),
            ("/dev/nvidiactl".into(), 195, 255),
            ("/dev/nvidia-uvm".into(), 511, 0),
            ("/dev/nvidia-uvm-tools".into(), 511, 1),
            ("/dev/nvidia-modeset".into(), 195, 254),
        ]
    );
    for n in &e.device_nodes {
        assert_eq!(n.access, "rwm");
        assert_eq!(n.file_mode, 0o666);
        assert_eq!(n.host_path, t.root.join(n.path.strip_prefix("/").unwrap()));
    }
    let nv = t.root.join("usr/lib/x86_64-linux-gnu/nvidia/current");
    let lib = |name: &str, dir: &Path| {
        let f = format!("{name}.so.{v}");
        (format!("{LIB_DIR}/{f}"), dir.join(&f).display().to_string(), false)
    };
    let mut want: BTreeSet<(String, String, bool)> = [
        lib("libcuda", &nv),
        lib("libnvidia-ml", &nv),
        lib("libnvidia-ptxjitcompiler", &nv),
        lib("libnvidia-cfg", &nv),
        lib("libnvidia-allocator", &nv),
        lib("libnvidia-pkcs11-openssl3", &t.root.join("usr/lib/x86_64-linux-gnu")),
        ("/usr/bin/nvidia-smi".into(), t.root.join("usr/lib/nvidia/current/nvidia-smi").display().to_string(), false),
        (
            "/usr/bin/nvidia-cuda-mps-control".into(),
            t.root.join("usr/bin/nvidia-cuda-mps-control").display().to_string(),
            false,
        ),
        (
            "/usr/bin/nvidia-cuda-mps-server".into(),
            t.root.join("usr/sbin/nvidia-cuda-mps-server").display().to_string(),
            false,
        ),
    ]
    .into();
    for fw in ["gsp_ga10x.bin", "gsp_tu10x.bin"] {
        want.insert((
            format!("/lib/firmware/nvidia/{v}/{fw}"),
            t.root.join(format!("lib/firmware/nvidia/{v}/{fw}")).display().to_string(),
            true,
        ));
    }
    assert_eq!(mount_set(&e), want);
    for m in &e.mounts {
        assert_eq!(m.options, vec!["ro", "nosuid", "nodev", "bind"], "{m:?}");
    }
    let links: BTreeSet<(String, String)> =
        e.symlinks.iter().map(|(l, t)| (l.display().to_string(), t.display().to_string())).collect();
    let so1 = |n: &str| (format!("{LIB_DIR}/{n}.so.1"), format!("{n}.so.{v}"));
    assert_eq!(
        links,
        [
            so1("libcuda"),
            so1("libnvidia-ml"),
            so1("libnvidia-ptxjitcompiler"),
            so1("libnvidia-cfg"),
            so1("libnvidia-allocator"),
            (format!("{LIB_DIR}/libcuda.so"), "libcuda.so.1".to_string()),
            (format!("{LIB_DIR}/libnvidia-ml.so"), "libnvidia-ml.so.1".to_string()),
        ]
        .into()
    );
    assert!(e.update_ldcache);
    assert_eq!(e.ld_library_dirs, vec![PathBuf::from(LIB_DIR)]);
    assert_eq!(env(&e, "NVIDIA_VISIBLE_DEVICES").as_deref(), Some("0,1"));
    assert_eq!(env(&e, "CUDA_VISIBLE_DEVICES").as_deref(), Some("0,1"));
    assert_eq!(env(&e, "NVIDIA_DRIVER_CAPABILITIES").as_deref(), Some("compute,utility"));
    assert!(e.hooks.is_empty());

    // video adds the video libraries (and their -l links).
    let caps: Capabilities = "compute,utility,video".parse().unwrap();
    let ev = inject::edits(&d, &gpus, &caps).unwrap();
    let added: BTreeSet<_> = mount_set(&ev).difference(&mount_set(&e)).cloned().collect();
    assert_eq!(
        added,
        [
            lib("libnvcuvid", &nv),
            lib("libnvidia-encode", &nv),
            lib("libnvidia-opticalflow", &nv),
            lib("libvdpau_nvidia", &nv)
        ]
        .into()
    );
    assert!(ev.symlinks.contains(&(PathBuf::from(LIB_DIR).join("libnvcuvid.so"), PathBuf::from("libnvcuvid.so.1"))));

    // utility only: NVML and nvidia-smi, no CUDA.
    let eu = inject::edits(&d, &gpus, &"utility".parse().unwrap()).unwrap();
    let targets: BTreeSet<String> =
        eu.mounts.iter().filter(|m| !m.optional).map(|m| m.container_path.display().to_string()).collect();
    assert_eq!(
        targets,
        [
            format!("{LIB_DIR}/libnvidia-ml.so.{v}"),
            format!("{LIB_DIR}/libnvidia-cfg.so.{v}"),
            "/usr/bin/nvidia-smi".into()
        ]
        .into()
    );
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: scripts/make-driver-tree.sh makes device nodes")]
fn gpu_1_gets_only_its_own_node() {
    let t = tree_or_skip!();
    let d = discover_tree(t);
    let e = edits_for(Some(&d), None, &GpuRequest::parse("1").unwrap(), &Capabilities::default()).unwrap();
    let paths: Vec<String> = node_list(&e).into_iter().map(|(p, _, _)| p).collect();
    assert!(paths.contains(&"/dev/nvidia1".to_string()), "{paths:?}");
    assert!(!paths.contains(&"/dev/nvidia0".to_string()), "{paths:?}");
    assert_eq!(env(&e, "NVIDIA_VISIBLE_DEVICES").as_deref(), Some("1"));
    assert_eq!(env(&e, "CUDA_VISIBLE_DEVICES").as_deref(), Some("0"));

    let err =
        edits_for(Some(&d), None, &GpuRequest::parse("5").unwrap(), &Capabilities::default()).unwrap_err().to_string();
    assert!(err.contains("no GPU '5'") && err.contains("available: 0 (/dev/nvidia0"), "{err}");
    // The one-call path with the real NVML loader (no kernel module here: the GPUs come
    // from the tree's nodes).
    let e2 =
        azp_sandbox::gpu::job_edits(&opts(&t.root), &GpuRequest::parse("1").unwrap(), &Capabilities::default(), None)
            .unwrap();
    assert_eq!(node_list(&e2), node_list(&e));
    assert_eq!(mount_set(&e2), mount_set(&e));
    // --gpus none never needs a driver.
    assert!(azp_sandbox::gpu::job_edits(
        &opts(Path::new("/nonexistent")),
        &GpuRequest::None,
        &Capabilities::default(),
        None
    )
    .unwrap()
    .is_empty());
    assert!(edits_for(None, None, &GpuRequest::None, &Capabilities::default()).unwrap().is_empty());
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: scripts/make-driver-tree.sh makes device nodes")]
fn fake_nvml_with_four_gpus() {
    let t = tree_or_skip!();
    let inv = FakeInventory::with_gpus(&t.version, 4);
    let d = discover(&opts(&t.root), &inv).unwrap();
    assert_eq!(d.version_source.as_deref(), Some("NVML"));
    assert_eq!(d.cuda_version, Some((12, 2)));
    assert_eq!(d.gpu_source, Some(GpuSource::Nvml));
    assert_eq!(d.gpus.len(), 4);
    assert_eq!(d.libraries.len(), 22);
    // The tree has nodes for GPUs 0 and 1 only.
    assert!(d.missing.iter().any(|m| m.item.starts_with("/dev/nvidia2 (GPU 2)")));

    let slots = split(&d.gpus, 2, PerAgent::Count(2)).unwrap();
    assert_eq!(
        slots.iter().map(|s| s.iter().map(|g| g.index).collect::<Vec<_>>()).collect::<Vec<_>>(),
        vec![vec![0, 1], vec![2, 3]]
    );
    let slots = split(&d.gpus, 4, PerAgent::default()).unwrap();
    assert_eq!(slots.iter().map(|s| s[0].index).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    assert_eq!(
        split(&d.gpus, 3, PerAgent::Count(2)).unwrap_err().to_string(),
        "cannot give 3 agents 2 GPUs each: this host has 4 GPUs; lower the agent count or --gpus-per-agent"
    );

    // Slot 0 (GPUs 0,1): UUIDs in NVIDIA_VISIBLE_DEVICES, its nodes only.
    let e = inject::edits(&d, &slots[0..2].concat(), &Capabilities::default()).unwrap();
    assert_eq!(
        env(&e, "NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some("GPU-00000000-0000-0000-0000-000000000000,GPU-00000000-0000-0000-0000-000000000001")
    );
    let e1 = inject::edits(&d, &slots[1], &Capabilities::default()).unwrap();
    let paths: Vec<String> = node_list(&e1).into_iter().map(|(p, _, _)| p).collect();
    assert!(paths.contains(&"/dev/nvidia1".into()) && !paths.contains(&"/dev/nvidia0".into()), "{paths:?}");
    // GPU 2 has no node in the tree: a clear error.
    let err = inject::edits(&d, &slots[2], &Capabilities::default()).unwrap_err().to_string();
    assert!(err.starts_with("GPU 2 needs /dev/nvidia2 but"), "{err}");

    // NVML reporting another driver version than the files: nothing of the wrong version.
    let other = FakeInventory::with_gpus("550.54.15", 2);
    let d = discover(&opts(&t.root), &other).unwrap();
    assert!(d.libraries.is_empty());
    assert!(d.notes.iter().any(|n| n.contains(&format!("version {}", t.version))), "{:?}", d.notes);
    let err = inject::edits(&d, &d.gpus, &Capabilities::default()).unwrap_err().to_string();
    assert!(err.starts_with("libnvidia-ml.so.550.54.15 not found"), "{err}");
}

#[test]
fn no_driver_found() {
    let empty = tempfile::tempdir().unwrap();
    let d = discover(&opts(empty.path()), &no_nvml()).unwrap();
    assert!(d.gpus.is_empty());
    assert_eq!(d.version, None);
    let err = select::select(&d, &GpuRequest::All).unwrap_err().to_string();
    assert!(
        err.starts_with("no NVIDIA driver found: libnvidia-ml.so.1 could not be loaded (libnvidia-ml.so.1: cannot open shared object file"),
        "{err}"
    );
    assert!(err.ends_with("install the driver or use --gpus none"), "{err}");
    let err = edits_for(Some(&d), None, &GpuRequest::parse("0").unwrap(), &Capabilities::default()).unwrap_err();
    assert!(err.to_string().starts_with("no NVIDIA driver found"), "{err}");
    // --gpus none is unaffected.
    assert!(edits_for(Some(&d), None, &GpuRequest::parse("none").unwrap(), &Capabilities::default())
        .unwrap()
        .is_empty());
    // NVML present but no GPU.
    let d = discover(&opts(empty.path()), &FakeInventory::with_gpus("550.54.15", 0)).unwrap();
    assert!(select::select(&d, &GpuRequest::All).unwrap_err().to_string().starts_with("no NVIDIA GPU found"));
    let r = Report::build(&d, &Capabilities::default(), None);
    assert!(r.error.as_deref().unwrap().starts_with("no NVIDIA GPU found"));
    assert!(discover(&opts(&empty.path().join("absent")), &no_nvml())
        .unwrap_err()
        .to_string()
        .contains("--driver-root"));
}

/// Drivers outside the linker cache (/usr/local/nvidia/lib64 on Kubernetes nodes and on
/// the lent GPU machine): found through the extra lib dirs and through NVML's dir; a
/// 32-bit copy is skipped.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: scripts/make-driver-tree.sh makes device nodes")]
fn driver_outside_the_linker_cache() {
    let t = tree_or_skip!();
    let v = &t.version;
    let root = scratch("k8s");
    let lib64 = root.join("usr/local/nvidia/lib64");
    let nv = t.root.join("usr/lib/x86_64-linux-gnu/nvidia/current");
    for name in ["libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"] {
        link_or_copy(&nv.join(format!("{name}.so.{v}")), &lib64.join(format!("{name}.so.{v}")));
        std::os::unix::fs::symlink(format!("{name}.so.{v}"), lib64.join(format!("{name}.so.1"))).unwrap();
    }
    link_or_copy(&t.root.join("usr/lib/nvidia/current/nvidia-smi"), &root.join("usr/local/nvidia/bin/nvidia-smi"));
    // As on the lent H200: /usr/bin/nvidia-smi, first on PATH, is a wrapper script.
    let wrapper = root.join("usr/bin/nvidia-smi");
    std::fs::create_dir_all(wrapper.parent().unwrap()).unwrap();
    std::fs::write(&wrapper, "#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n").unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let lib32 = root.join("usr/local/nvidia/lib");
    std::fs::create_dir_all(&lib32).unwrap();
    std::fs::write(lib32.join(format!("libcuda.so.{v}")), azp_sandbox::gpu::elf::fake_elf32_header(3)).unwrap();

    let o = DiscoverOptions {
        driver_root: root.clone(),
        extra_lib_dirs: vec!["/usr/local/nvidia/lib".into(), "/usr/local/nvidia/lib64".into()],
        cdi_spec: None,
    };
    let d = discover(&o, &no_nvml()).unwrap();
    assert_eq!(d.version.as_deref(), Some(v.as_str()));
    let libs: BTreeSet<(String, PathBuf, String)> =
        d.libraries.iter().map(|l| (l.name.clone(), l.host_path.clone(), l.soname.clone())).collect();
    assert_eq!(
        libs,
        ["libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"]
            .map(|n| (n.to_string(), lib64.join(format!("{n}.so.{v}")), format!("{n}.so.1")))
            .into()
    );
    assert!(d.notes.iter().any(|n| n.contains("32-bit i386")), "{:?}", d.notes);
    assert_eq!(
        d.binaries.iter().map(|b| (b.name.as_str(), b.host_path.clone())).collect::<Vec<_>>(),
        vec![("nvidia-smi", root.join("usr/local/nvidia/bin/nvidia-smi"))],
        "the program, not the wrapper script that execs it"
    );

    // Same files, found only through the directory NVML was loaded from.
    let mut inv = FakeInventory::with_gpus(v, 1);
    inv.lib_dir = Some(lib64.clone());
    let d = discover(&opts(&root), &inv).unwrap();
    assert_eq!(d.libraries.len(), 3);
    assert!(d.libraries.iter().all(|l| l.found_via.starts_with("NVML library dir")), "{:?}", d.libraries);

    // A script with no program anywhere is still better than nothing.
    std::fs::remove_file(root.join("usr/local/nvidia/bin/nvidia-smi")).unwrap();
    let d = discover(&opts(&root), &inv).unwrap();
    assert_eq!(d.binaries.iter().map(|b| b.host_path.clone()).collect::<Vec<_>>(), vec![wrapper]);
    std::fs::remove_dir_all(&root).unwrap();

    // A prefix of no standard dir (/opt/nv): its program is found in the `bin` beside the
    // dir its libraries came from.
    let root = scratch("opt-nv");
    let lib64 = root.join("opt/nv/lib64");
    for name in ["libcuda", "libnvidia-ml"] {
        link_or_copy(&nv.join(format!("{name}.so.{v}")), &lib64.join(format!("{name}.so.{v}")));
        std::os::unix::fs::symlink(format!("{name}.so.{v}"), lib64.join(format!("{name}.so.1"))).unwrap();
    }
    link_or_copy(&t.root.join("usr/lib/nvidia/current/nvidia-smi"), &root.join("opt/nv/bin/nvidia-smi"));
    let mut inv = FakeInventory::with_gpus(v, 1);
    inv.lib_dir = Some(lib64.clone());
    let d = discover(&opts(&root), &inv).unwrap();
    assert_eq!(
        d.binaries.iter().map(|b| b.host_path.clone()).collect::<Vec<_>>(),
        vec![root.join("opt/nv/bin/nvidia-smi")],
        "{:?}",
        d.missing
    );
    std::fs::remove_dir_all(&root).unwrap();
}

/// The ld.so.cache precedence the injection relies on (see gpu::inject): for one
/// SONAME, the directory of the conf.d file that sorts first wins in the cache.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: scripts/make-driver-tree.sh makes device nodes")]
fn ldconfig_keeps_the_first_scanned_directory_first() {
    let t = tree_or_skip!();
    let v = &t.version;
    let base = scratch("ldprec");
    let real = t.root.join(format!("usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.{v}"));
    for d in ["ours", "rootfs"] {
        link_or_copy(&real, &base.join(d).join(format!("libnvidia-ml.so.{v}")));
        std::os::unix::fs::symlink(format!("libnvidia-ml.so.{v}"), base.join(d).join("libnvidia-ml.so.1")).unwrap();
    }
    let first_dir = |our_conf: &str| -> PathBuf {
        let conf_d = base.join(format!("conf.d-{our_conf}"));
        std::fs::create_dir_all(&conf_d).unwrap();
        std::fs::write(conf_d.join(our_conf), format!("{}\n", base.join("ours").display())).unwrap();
        std::fs::write(conf_d.join("x86_64-linux-gnu.conf"), format!("{}\n", base.join("rootfs").display())).unwrap();
        let conf = base.join(format!("{our_conf}.ld.so.conf"));
        std::fs::write(&conf, format!("include {}/*.conf\n", conf_d.display())).unwrap();
        let cache = base.join(format!("{our_conf}.cache"));
        let st = Command::new("ldconfig").arg("-X").arg("-f").arg(&conf).arg("-C").arg(&cache).status().unwrap();
        assert!(st.success());
        let c = LdCache::load_file(&cache).unwrap();
        let first = c.lookup("libnvidia-ml.so.1").next().expect("libnvidia-ml.so.1 in cache").path.clone();
        first.parent().unwrap().to_path_buf()
    };
    assert_eq!(first_dir("000-azp-sandbox-nvidia.conf"), base.join("ours"));
    assert_eq!(first_dir("zzz-azp-sandbox-nvidia.conf"), base.join("rootfs"));
    std::fs::remove_dir_all(&base).unwrap();
}

/// A rootfs carrying Debian's own libcuda1 and CUDA forward-compat libraries.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: scripts/make-driver-tree.sh makes device nodes")]
fn rootfs_driver_copies_are_shadowed() {
    let t = tree_or_skip!();
    let v = &t.version;
    let d = discover_tree(t);
    let rootfs = scratch("rootfs");
    let real = t.root.join(format!("usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.{v}"));
    let old = "usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.530.30.02";
    link_or_copy(&real, &rootfs.join(old));
    std::os::unix::fs::symlink(
        "/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.530.30.02",
        rootfs.join("usr/lib/x86_64-linux-gnu/libcuda.so.1"),
    )
    .unwrap();
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    std::fs::write(rootfs.join("etc/ld.so.conf"), "/usr/lib/x86_64-linux-gnu\n").unwrap();
    assert!(Command::new("ldconfig").arg("-X").arg("-r").arg(&rootfs).status().unwrap().success());
    link_or_copy(&real, &rootfs.join("usr/local/cuda-11.8/compat/libcuda.so.520.61.05"));
    link_or_copy(&real, &rootfs.join("usr/local/cuda-12.4/compat/libcuda.so.999.1.1"));

    let (mounts, notes) = inject::rootfs_overrides(&d, &Capabilities::default(), &rootfs).unwrap();
    let got: BTreeSet<(String, PathBuf)> =
        mounts.iter().map(|m: &BindMount| (m.container_path.display().to_string(), m.host_path.clone())).collect();
    assert_eq!(
        got,
        [
            (format!("/{old}"), real.clone()),
            ("/usr/local/cuda-11.8/compat/libcuda.so.520.61.05".to_string(), real.clone()),
        ]
        .into()
    );
    assert!(mounts.iter().all(|m| m.options == ["ro", "nosuid", "nodev", "bind"] && !m.optional));
    assert!(
        notes.iter().any(|n| n.contains("cuda-12.4/compat/libcuda.so.999.1.1") && n.contains("left in place")),
        "{notes:?}"
    );
    std::fs::remove_dir_all(&rootfs).unwrap();
}

/// A spec in the exact shape `nvidia-ctk cdi generate --driver-root T --dev-root T` writes.
fn nvidia_ctk_spec(t: &Tree, uvm_major: i64) -> String {
    let r = t.root.display();
    let v = &t.version;
    format!(
        r#"---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
      hostPath: {r}/dev/nvidia0
- name: "1"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
      hostPath: {r}/dev/nvidia1
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
      hostPath: {r}/dev/nvidia0
    - path: /dev/nvidia1
      hostPath: {r}/dev/nvidia1
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidia-modeset
    hostPath: {r}/dev/nvidia-modeset
  - path: /dev/nvidia-uvm
    hostPath: {r}/dev/nvidia-uvm
    type: c
    major: {uvm_major}
    minor: 0
  - path: /dev/nvidia-uvm-tools
    hostPath: {r}/dev/nvidia-uvm-tools
  - path: /dev/nvidiactl
    hostPath: {r}/dev/nvidiactl
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args:
    - nvidia-cdi-hook
    - create-symlinks
    - --link
    - libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args:
    - nvidia-cdi-hook
    - update-ldcache
    - --folder
    - /usr/lib/x86_64-linux-gnu
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args:
    - nvidia-cdi-hook
    - chmod
    - --mode
    - "755"
    - --path
    - /dev/dri
  mounts:
  - hostPath: {r}/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.{v}
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{v}
    options:
    - ro
    - nosuid
    - nodev
    - bind
  - hostPath: {r}/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.{v}
    containerPath: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{v}
    options:
    - ro
    - nosuid
    - nodev
    - bind
  - hostPath: {r}/usr/lib/nvidia/current/nvidia-smi
    containerPath: /usr/bin/nvidia-smi
    options:
    - ro
    - nosuid
    - nodev
    - bind
"#
    )
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: scripts/make-driver-tree.sh makes device nodes")]
fn cdi_spec_is_applied_and_stale_majors_refused() {
    let t = tree_or_skip!();
    let v = &t.version;
    let root = scratch("cdi");
    std::fs::create_dir_all(root.join("etc/cdi")).unwrap();
    let yaml = root.join("etc/cdi/nvidia.yaml");
    std::fs::write(&yaml, nvidia_ctk_spec(t, 511)).unwrap();
    // The same spec as JSON, in the higher-priority dir.
    std::fs::create_dir_all(root.join("var/run/cdi")).unwrap();
    let parsed: cdi::Spec = serde_yaml::from_str(&nvidia_ctk_spec(t, 511)).unwrap();
    let json = root.join("var/run/cdi/nvidia.json");
    std::fs::write(&json, serde_json::to_string_pretty(&parsed).unwrap()).unwrap();

    let o = opts(&root);
    let reg = Registry::load(&o).unwrap();
    assert!(reg.errors.is_empty(), "{:?}", reg.errors);
    assert_eq!(reg.specs.len(), 2);
    assert!(!reg.explicit);
    assert_eq!(reg.device_names(), vec!["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=all"]);
    assert_eq!(reg.resolve("0").unwrap().0.file, json, "/var/run/cdi must win over /etc/cdi");

    let e =
        edits_for(None, Some(&reg), &GpuRequest::parse("nvidia.com/gpu=0").unwrap(), &Capabilities::default()).unwrap();
    assert_eq!(
        node_list(&e),
        vec![
            ("/dev/nvidia-modeset".into(), 195, 254),
            ("/dev/nvidia-uvm".into(), 511, 0),
            ("/dev/nvidia-uvm-tools".into(), 511, 1),
            ("/dev/nvidiactl".into(), 195, 255),
            ("/dev/nvidia0".into(), 195, 0),
        ]
    );
    assert_eq!(e.device_nodes[4].host_path, t.root.join("dev/nvidia0"));
    assert_eq!(e.device_nodes[4].access, "rwm");
    assert_eq!(
        mount_set(&e),
        [
            (
                format!("/usr/lib/x86_64-linux-gnu/libcuda.so.{v}"),
                t.root.join(format!("usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.{v}")).display().to_string(),
                false
            ),
            (
                format!("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{v}"),
                t.root
                    .join(format!("usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.{v}"))
                    .display()
                    .to_string(),
                false
            ),
            (
                "/usr/bin/nvidia-smi".into(),
                t.root.join("usr/lib/nvidia/current/nvidia-smi").display().to_string(),
                false
            ),
        ]
        .into()
    );
    assert!(e.mounts.iter().all(|m| m.options == ["ro", "nosuid", "nodev", "bind"]));
    assert_eq!(
        e.symlinks,
        vec![(PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so"), PathBuf::from("libcuda.so.1"))]
    );
    assert!(e.update_ldcache);
    assert_eq!(e.ld_library_dirs, vec![PathBuf::from("/usr/lib/x86_64-linux-gnu")]);
    assert_eq!(e.hooks.len(), 1, "only the chmod hook is passed through");
    assert_eq!(e.hooks[0].args[1], "chmod");
    assert_eq!(env(&e, "NVIDIA_VISIBLE_DEVICES").as_deref(), Some("void"));

    // Bare names mean nvidia.com/gpu; `all` brings both GPU nodes, once each.
    let all = cdi::edits(&reg, &["all".into(), "1".into()]).unwrap();
    let gpu_nodes: Vec<String> = node_list(&all)
        .into_iter()
        .map(|(p, _, _)| p)
        .filter(|p| p.starts_with("/dev/nvidia") && p[11..].parse::<u32>().is_ok())
        .collect();
    assert_eq!(gpu_nodes, vec!["/dev/nvidia0", "/dev/nvidia1"]);
    let err = cdi::edits(&reg, &["nvidia.com/gpu=7".into()]).unwrap_err().to_string();
    assert!(err.contains("unknown CDI device 'nvidia.com/gpu=7'; available: nvidia.com/gpu=0"), "{err}");

    // --cdi-spec with a stale nvidia-uvm major: refused, with the fix.
    let stale = root.join("stale.yaml");
    std::fs::write(&stale, nvidia_ctk_spec(t, 235)).unwrap();
    let reg = Registry::load(&DiscoverOptions { cdi_spec: Some(stale.clone()), ..opts(&root) }).unwrap();
    assert!(reg.explicit);
    // With --cdi-spec, a plain `--gpus 0` goes through CDI too.
    let err = edits_for(None, Some(&reg), &GpuRequest::parse("0").unwrap(), &Capabilities::default())
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        format!(
            "CDI spec {} is stale: /dev/nvidia-uvm (host node {}) is 235:0 in the spec but 511:0 on the host; regenerate it with `nvidia-ctk cdi generate`",
            stale.display(),
            t.root.join("dev/nvidia-uvm").display()
        )
    );
    // A broken file in a spec dir is reported, not fatal.
    std::fs::write(root.join("etc/cdi/broken.yaml"), "cdiVersion: 9.9.9\nkind: nvidia.com/gpu\n").unwrap();
    let reg = Registry::load(&o).unwrap();
    assert_eq!(reg.specs.len(), 2);
    assert!(reg.errors[0].contains("unsupported cdiVersion '9.9.9'"), "{:?}", reg.errors);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: scripts/make-driver-tree.sh makes device nodes")]
fn report_table_and_json() {
    let t = tree_or_skip!();
    let d = discover_tree(t);
    let r = Report::build(&d, &Capabilities::default(), Some(&Registry::default()));
    assert_eq!(r.error, None);
    let text = r.to_string();
    for needle in [
        format!("NVIDIA driver   {}", t.version),
        "GPUs (from device nodes (NVML unavailable)):".to_string(),
        "/dev/nvidia-uvm".to_string(),
        "c 511:0 rw-rw-rw-".to_string(),
        format!("{LIB_DIR}/libcuda.so.1"),
        "/usr/bin/nvidia-smi".to_string(),
        "nvidia-persistenced (utility)".to_string(),
        "NVIDIA_VISIBLE_DEVICES=0,1".to_string(),
    ] {
        assert!(text.contains(&needle), "missing {needle:?} in:\n{text}");
    }
    let j: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(j["driver_version"], t.version.as_str());
    assert_eq!(j["gpu_source"], "DeviceNodes");
    assert!(j["error"].is_null());
    let items = j["items"].as_array().unwrap();
    let cuda = items
        .iter()
        .find(|i| {
            i["kind"] == "library"
                && i["container_path"].as_str().unwrap().ends_with(&format!("libcuda.so.{}", t.version))
        })
        .expect("libcuda item");
    assert!(cuda["source"].as_str().unwrap().starts_with(t.root.to_str().unwrap()));
    assert!(items.iter().any(|i| i["kind"] == "device" && i["container_path"] == "/dev/nvidia1"));

    let listed = azp_sandbox::gpu::list(&opts(&t.root), &Capabilities::default()).unwrap();
    assert_eq!(listed.items, r.items);
    assert_eq!(listed.cdi.as_ref().unwrap().specs.len(), 0);

    // Without a driver the report says why a GPU job would fail.
    let empty = tempfile::tempdir().unwrap();
    let d = discover(&opts(empty.path()), &no_nvml()).unwrap();
    let r = Report::build(&d, &Capabilities::default(), None);
    assert!(r.error.as_deref().unwrap().starts_with("no NVIDIA driver found"));
    assert!(r.to_string().contains("A GPU job would fail now: no NVIDIA driver found"));
}

/// `graphics` brings the EGL/GLX/GLES/Vulkan libraries and the loaders' JSON files, each
/// naming a library the sandbox gets; `display` adds the Xorg modules; `video` the codec
/// libraries; the default (`compute,utility`) none of them.
#[test]
fn graphics_video_and_display_capabilities() {
    let t = tree_or_skip!();
    let d = discover_tree(t);
    let v = &t.version;
    let gpus = select::select(&d, &GpuRequest::All).unwrap();
    let edits = |caps: &str| inject::edits(&d, &gpus, &caps.parse().unwrap()).unwrap();
    let targets = |e: &ContainerEdits| -> BTreeSet<String> {
        e.mounts.iter().filter(|m| !m.optional).map(|m| m.container_path.display().to_string()).collect()
    };
    let graphics_libs: BTreeSet<String> = [
        "libEGL_nvidia",
        "libGLX_nvidia",
        "libGLESv1_CM_nvidia",
        "libGLESv2_nvidia",
        "libnvidia-eglcore",
        "libnvidia-glcore",
        "libnvidia-glsi",
        "libnvidia-tls",
        "libnvidia-glvkspirv",
        "libnvidia-rtcore",
        "libnvidia-vulkan-producer",
    ]
    .iter()
    .map(|n| format!("{LIB_DIR}/{n}.so.{v}"))
    .chain([format!("{LIB_DIR}/libnvidia-egl-wayland.so.1.1.10")])
    .collect();
    let json_files: BTreeSet<String> = [
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
        "/usr/share/vulkan/icd.d/nvidia_icd.json",
        "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
    ]
    .map(String::from)
    .into();
    let xorg: BTreeSet<String> =
        ["/usr/lib/xorg/modules/drivers/nvidia_drv.so", "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so"]
            .map(String::from)
            .into();
    let video_libs: BTreeSet<String> = ["libnvcuvid", "libnvidia-encode", "libnvidia-opticalflow", "libvdpau_nvidia"]
        .iter()
        .map(|n| format!("{LIB_DIR}/{n}.so.{v}"))
        .collect();

    let base = targets(&edits("compute,utility"));
    for absent in graphics_libs.iter().chain(&json_files).chain(&xorg).chain(&video_libs) {
        assert!(!base.contains(absent), "the default brings {absent}");
    }

    let g = edits("compute,utility,graphics");
    let added: BTreeSet<String> = targets(&g).difference(&base).cloned().collect();
    assert_eq!(added, graphics_libs.union(&json_files).cloned().collect());
    // Every JSON file names, as a bare SONAME, a library the sandbox has under that name
    // in LIB_DIR (a link made there, or the file itself), which ldconfig puts in the cache.
    let names_in_lib_dir: BTreeSet<String> = g
        .symlinks
        .iter()
        .map(|(l, _)| l.clone())
        .chain(g.mounts.iter().map(|m| m.container_path.clone()))
        .filter(|p| p.starts_with(LIB_DIR))
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for m in g.mounts.iter().filter(|m| json_files.contains(&m.container_path.display().to_string())) {
        let named = azp_sandbox::gpu::graphics::library_paths(&std::fs::read(&m.host_path).unwrap()).unwrap();
        assert!(!named.is_empty());
        for lib in named {
            assert!(!lib.contains('/'), "Debian's files name SONAMEs: {lib}");
            assert!(names_in_lib_dir.contains(&lib), "{} names {lib}, not in {LIB_DIR}", m.container_path.display());
        }
    }
    assert!(g.update_ldcache && g.ld_library_dirs == vec![PathBuf::from(LIB_DIR)]);
    assert_eq!(env(&g, "NVIDIA_DRIVER_CAPABILITIES").as_deref(), Some("compute,utility,graphics"));

    // display: the graphics stack and the X server's modules (real files, found through
    // the alternatives links at the Xorg module paths).
    let disp = edits("compute,utility,display");
    let added: BTreeSet<String> = targets(&disp).difference(&base).cloned().collect();
    assert_eq!(added, graphics_libs.union(&json_files).chain(&xorg).cloned().collect());
    let glx = disp.mounts.iter().find(|m| m.container_path.ends_with("libglxserver_nvidia.so")).unwrap();
    assert_eq!(glx.host_path, t.root.join(format!("usr/lib/nvidia/current/libglxserver_nvidia.so.{v}")));

    // video: the codec libraries, libvdpau told where its driver is, no JSON files.
    let vid = edits("compute,utility,video");
    let added: BTreeSet<String> = targets(&vid).difference(&base).cloned().collect();
    assert_eq!(added, video_libs);
    assert_eq!(env(&vid, "VDPAU_DRIVER_PATH").as_deref(), Some(LIB_DIR));
    assert_eq!(env(&edits("compute,utility"), "VDPAU_DRIVER_PATH"), None);
    assert!(vid.symlinks.contains(&(
        PathBuf::from(LIB_DIR).join("libnvidia-opticalflow.so"),
        PathBuf::from("libnvidia-opticalflow.so.1")
    )));

    // The per-job discovery looks for these files only when the job asks for them.
    let job = azp_sandbox::gpu::discover_for_job(&opts(&t.root), &no_nvml(), &Capabilities::default()).unwrap();
    assert!(job.files.is_empty() && job.libraries == d.libraries);
    let gj = azp_sandbox::gpu::job_edits(
        &opts(&t.root),
        &GpuRequest::All,
        &"compute,utility,graphics".parse().unwrap(),
        None,
    )
    .unwrap();
    assert_eq!(mount_set(&gj), mount_set(&g));

    // gpu list shows the files with the library each names.
    let r = Report::build(&d, &"graphics".parse().unwrap(), None);
    let text = r.to_string();
    assert!(
        text.lines()
            .any(|l| l.contains("/usr/share/vulkan/icd.d/nvidia_icd.json") && l.contains("names libGLX_nvidia.so.0")),
        "{text}"
    );
}

/// `gpu list` on the driver tree: GPUs but no nvidia-persistenced, a warning; with NVML
/// saying MIG is on for GPU 1, a warning that a whole-GPU job sees no device there (the
/// tree has the /dev/nvidia-caps nodes, so no warning about them), and the capability
/// nodes are listed as not injected.
#[test]
fn gpu_list_warns_about_absent_services() {
    let t = tree_or_skip!();
    let d = discover_tree(t);
    let r = Report::build(&d, &Capabilities::default(), None);
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    assert!(r.warnings[0].starts_with("nvidia-persistenced is not running"), "{:?}", r.warnings);
    let text = r.to_string();
    assert!(text.contains("Warnings:\n  nvidia-persistenced is not running"), "{text}");
    assert!(text.contains("/dev/nvidia-caps/nvidia-cap1 (optional)"), "{text}");

    let mut inv = FakeInventory::with_gpus(&t.version, 2);
    inv.gpus[1].mig_enabled = Some(true);
    let d = discover(&opts(&t.root), &inv).unwrap();
    let r = Report::build(&d, &Capabilities::default(), None);
    assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
    assert!(r.warnings[1].starts_with("MIG is enabled on GPU 1: a job given the whole GPU sees no CUDA device"));
    let j: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(j["warnings"].as_array().unwrap().len(), 2);
}

/// A MIG device (`--gpus MIG-<uuid>`): its GPU's node and the two capability nodes the
/// driver's procfs names for its GPU and compute instance, nothing of the other GPU.
#[test]
fn mig_device_gets_its_capability_nodes() {
    let t = tree_or_skip!();
    // NVML (faked) reports MIG on GPU 0 with instances gi1/ci0 (in the tree's procfs:
    // nvidia-cap1, nvidia-cap2) and gi2/ci0 (not there).
    let inv = FakeInventory::with_gpus(&t.version, 2).with_mig(0, &[(1, 0), (2, 0)]);
    let d = discover(&opts(&t.root), &inv).unwrap();
    assert_eq!(d.mig_devices.len(), 2);
    let uuid = d.mig_devices[0].uuid.clone().unwrap();
    let e = edits_for(Some(&d), None, &GpuRequest::parse(&uuid).unwrap(), &Capabilities::default()).unwrap();
    assert_eq!(
        node_list(&e),
        vec![
            ("/dev/nvidia0".into(), 195, 0),
            ("/dev/nvidia-caps/nvidia-cap1".into(), 508, 1),
            ("/dev/nvidia-caps/nvidia-cap2".into(), 508, 2),
            ("/dev/nvidiactl".into(), 195, 255),
            ("/dev/nvidia-uvm".into(), 511, 0),
            ("/dev/nvidia-uvm-tools".into(), 511, 1),
            ("/dev/nvidia-modeset".into(), 195, 254),
        ]
    );
    assert_eq!(env(&e, "NVIDIA_VISIBLE_DEVICES"), Some(uuid.clone()));
    assert_eq!(env(&e, "CUDA_VISIBLE_DEVICES").as_deref(), Some("0"));
    // The whole GPU 0 gets no capability node.
    let whole = edits_for(Some(&d), None, &GpuRequest::parse("0").unwrap(), &Capabilities::default()).unwrap();
    assert!(node_list(&whole).iter().all(|(p, _, _)| !p.starts_with("/dev/nvidia-caps")));
    // An instance the driver does not list: one line saying what to check.
    let gone = d.mig_devices[1].uuid.clone().unwrap();
    let err = edits_for(Some(&d), None, &GpuRequest::parse(&gone).unwrap(), &Capabilities::default())
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("MIG device gi2/ci0 of /dev/nvidia0: cannot read"), "{err}");
    assert!(err.contains("nvidia-smi mig -lci") && err.lines().count() == 1, "{err}");
    // gpu list shows the MIG devices under their GPU.
    let text = Report::build(&d, &Capabilities::default(), None).to_string();
    assert!(text.lines().any(|l| l.trim_start().starts_with("0:gi1/ci0") && l.contains(&uuid)), "{text}");
}

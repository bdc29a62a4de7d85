//! GPU injection into real sandboxes, against the NVIDIA driver tree built from Debian's
//! non-free packages (no GPU needed: nvidia-smi fails the way it does on a host whose
//! kernel module is not loaded).

mod common;
use common::*;
use std::os::unix::fs::MetadataExt;

const LIB_DIR: &str = "/usr/local/azp-sandbox/nvidia/lib64";

fn gpu_exec(h: &TestHome, tree: &std::path::Path, gpus: &str, script: &str) -> (i32, String, String) {
    let out = h
        .command()
        .arg("--driver-root")
        .arg(tree)
        .args(["exec", "--rootfs", "deb", "--gpus", gpus, "--", "bash", "-c", script])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn gpu_job_gets_its_gpu_the_host_driver_and_nvidia_smi() {
    require_root!();
    let tree = or_skip!(driver_tree());
    let h = TestHome::new("gpu-inject");
    h.import(&debian_tar(), "deb");
    // A driver library of another version inside the rootfs (as Debian's CUDA toolkit
    // installs libcuda1): the host's must win.
    let rootfs_lib = h.dir.join("rootfs/deb/tree/usr/lib/x86_64-linux-gnu");
    let host_libcuda = std::fs::read_dir(tree.join("usr/lib/x86_64-linux-gnu/nvidia/current"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("libcuda.so.5"))
        .expect("libcuda.so.<ver> in the driver tree");
    std::fs::copy(&host_libcuda, rootfs_lib.join("libcuda.so.470.1.2")).unwrap();
    std::os::unix::fs::symlink("libcuda.so.470.1.2", rootfs_lib.join("libcuda.so.1")).unwrap();

    let script = format!(
        "ls /dev | grep nvidia | sort | tr '\\n' ' '; echo; \
         ldconfig -p | grep -F 'libcuda.so.1 ' | head -1; ldconfig -p | grep -F 'libnvidia-ml.so.1 ' | head -1; \
         ldconfig -p | grep -c 'libcuda.so.1 '; \
         stat -Lc '%i' {LIB_DIR}/libcuda.so.1; \
         echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; \
         mknod /dev/nvidia0 c 195 0 2>/dev/null && echo MKNOD-OK; \
         nvidia-smi; echo smi=$?"
    );
    let (code, out, err) = gpu_exec(&h, &tree, "1", &script);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0].trim(), "nvidia-modeset nvidia-uvm nvidia-uvm-tools nvidia1 nvidiactl", "{out}");
    assert!(
        lines[1].contains(&format!("libcuda.so.1 (libc6,x86-64) => {LIB_DIR}/libcuda.so.1")),
        "host libcuda must win: {out}"
    );
    assert!(lines[2].contains(&format!("libnvidia-ml.so.1 (libc6,x86-64) => {LIB_DIR}/libnvidia-ml.so.1")), "{out}");
    // The library inside is the host's file (same inode), bound read-only.
    let meta = std::fs::metadata(&host_libcuda).unwrap();
    assert_eq!(lines[3], "2", "the rootfs copy is in the cache too, listed second: {out}");
    // (The inode only: the device number is the job's overlay's, a new one per mount.)
    assert_eq!(lines[4], meta.ino().to_string(), "{out}");
    assert_eq!(lines[5], "NVIDIA_VISIBLE_DEVICES=1 CUDA_VISIBLE_DEVICES=0");
    assert!(!out.contains("MKNOD-OK"), "CAP_MKNOD must be dropped");
    assert!(out.contains("couldn't communicate with the NVIDIA driver"), "{out}\n{err}");
    assert!(out.ends_with("smi=9\n"), "{out}");
    // The driver's binds, links and linker cache were built once into an edit layer
    // (src/sandbox/editlayer.rs), and the next GPU job runs over it (no ldconfig run)
    // with the same result.
    let layers = h.dir.join("cache/edit-layers");
    let built: Vec<_> = std::fs::read_dir(&layers).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(built.len(), 1, "{built:?}");
    let cache = built[0].join("tree/etc/ld.so.cache");
    assert!(cache.is_file(), "the layer holds the linker cache");
    assert!(built[0].join(format!("tree{LIB_DIR}/libcuda.so.1")).is_symlink(), "and the SONAME links");
    // The layer holds the driver files as hard links where it can (root, one
    // filesystem): a job then has no driver binds. Elsewhere they stay binds.
    let same_fs = std::fs::metadata(&host_libcuda).unwrap().dev() == std::fs::metadata(&h.dir).unwrap().dev();
    let linked = std::fs::read_to_string(built[0].join("linked")).unwrap();
    // Driver files bound, not device nodes: those are binds too in a user namespace of
    // the job's own (root mode since issue 19, rootless always), mounted on /dev/nvidia*.
    let (code, mounts, err) =
        gpu_exec(&h, &tree, "1", "grep nvidia /proc/self/mountinfo | grep -vc ' /dev/nvidia'; true");
    assert_eq!(code, 0, "{err}");
    let binds: usize = mounts.trim().parse().unwrap();
    if linked.is_empty() {
        assert!(binds > 0, "without links the driver files are bound");
    } else {
        assert!(linked.contains(&format!("{LIB_DIR}/libcuda.so.5")), "{linked}");
        assert_eq!(binds, 0, "linked driver files are not bound as well");
    }
    if same_fs && !rootless() {
        assert!(!linked.is_empty(), "as root on one filesystem the driver files are linked");
    } else if !rootless() {
        skip_part(format!(
            "the driver tree is on another filesystem than the home: that root links the driver files is not checked ({binds} binds)"
        ));
    } else {
        eprintln!("NOTE: rootless: {binds} binds, links: {linked:?}");
    }
    let (code, again, err) = gpu_exec(&h, &tree, "1", &script);
    assert_eq!(code, 0, "{err}");
    assert_eq!(again, out, "a job over the edit layer sees the same libraries");
    // Proof that the second job really ran over the layer: with its linker cache replaced
    // by garbage, a job's linker cache is that garbage (ldconfig -p finds no libcuda).
    std::fs::write(&cache, b"not a linker cache").unwrap();
    let (code, garbage, err) = gpu_exec(&h, &tree, "1", "ldconfig -p | grep -c libcuda.so.1; true");
    assert_eq!((code, garbage.trim()), (0, "0"), "{err}");
    assert_eq!(std::fs::read_dir(&layers).unwrap().count(), 1, "no second layer for the same rootfs and driver");
    // A layer damaged by hand (its tree deleted) is replaced by the next job, which works.
    std::fs::remove_dir_all(built[0].join("tree")).unwrap();
    let (code, again, err) = gpu_exec(&h, &tree, "1", &script);
    assert_eq!(code, 0, "{err}");
    assert_eq!(again, out, "a rebuilt layer gives the same view");
    assert!(cache.is_file(), "rebuilt under the same key");
    // Without the rootfs the layer is of no use: `rootfs rm` removes it.
    let o = h.command().args(["rootfs", "rm", "deb"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read_dir(&layers).unwrap().count(), 0, "edit layers of a removed rootfs are pruned");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn no_gpus_means_no_driver_files_and_no_driver_needed() {
    require_root!();
    let tree = or_skip!(driver_tree());
    let h = TestHome::new("gpu-none");
    h.import(&debian_tar(), "deb");
    let (code, out, err) = gpu_exec(
        &h,
        &tree,
        "none",
        "ls /dev | grep -c nvidia; ldconfig -p | grep -c libcuda; command -v nvidia-smi || echo no-smi",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "0\n0\nno-smi\n");
    // A GPU request on a host without a driver fails before anything is created.
    let empty = h.dir.join("empty-driver-root");
    std::fs::create_dir_all(&empty).unwrap();
    let (code, _, err) = gpu_exec(&h, &empty, "all", "true");
    assert_eq!(code, 125);
    assert!(err.contains("no NVIDIA driver found") && err.lines().count() == 1, "{err}");
    // An unknown GPU index names the ones there are.
    let (code, _, err) = gpu_exec(&h, &tree, "7", "true");
    assert_eq!(code, 125);
    assert!(err.contains('7') && err.lines().count() == 1, "{err}");
    h.assert_no_residue(&[]);
}

fn gpu_exec_caps(h: &TestHome, tree: &std::path::Path, caps: &str, script: &str) -> (i32, String, String) {
    let out = h
        .command()
        .arg("--driver-root")
        .arg(tree)
        .args(["exec", "--rootfs", "deb", "--gpus", "0", "--gpu-capabilities", caps, "--", "bash", "-c", script])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// In a real sandbox: with `graphics` each loader JSON file is there and the library it
/// names is found by the sandbox's linker, as the EGL/Vulkan loaders will look it up;
/// `video` has the codec libraries; the default has neither.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn graphics_and_video_capabilities_in_a_sandbox() {
    require_root!();
    let tree = or_skip!(driver_tree());
    let h = TestHome::new("gpu-graphics");
    h.import(&debian_tar(), "deb");
    let json = [
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
        "/usr/share/vulkan/icd.d/nvidia_icd.json",
        "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
    ];
    // For each file: its library_path, then where the linker cache puts that name and
    // whether that path opens (`test -r` follows the SONAME link to the bound file).
    let script = format!(
        "for f in {}; do \
           if [ -f $f ]; then lib=$(sed -n 's/.*\"library_path\" *: *\"\\([^\"]*\\)\".*/\\1/p' $f); \
             at=$(ldconfig -p | grep -F \"$lib (\" | head -1 | sed 's/.*=> //'); \
             test -r \"$at\" && ok=readable || ok=unreadable; echo \"$f $lib $at $ok\"; \
           else echo \"$f absent\"; fi; \
         done; \
         for l in libnvcuvid.so.1 libnvidia-encode.so.1 libnvidia-opticalflow.so.1 libvdpau_nvidia.so.1 libEGL_nvidia.so.0; do \
           ldconfig -p | grep -qF \"$l (\" && echo \"$l cached\" || echo \"$l uncached\"; \
         done; echo VDPAU_DRIVER_PATH=$VDPAU_DRIVER_PATH",
        json.join(" ")
    );
    let (code, out, err) = gpu_exec_caps(&h, &tree, "compute,utility,graphics", &script);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    let want_lib = ["libEGL_nvidia.so.0", "libnvidia-egl-wayland.so.1", "libGLX_nvidia.so.0", "libGLX_nvidia.so.0"];
    for (i, (f, lib)) in json.iter().zip(want_lib).enumerate() {
        assert_eq!(lines[i], format!("{f} {lib} {LIB_DIR}/{lib} readable"), "{out}");
    }
    assert_eq!(
        &lines[4..],
        [
            "libnvcuvid.so.1 uncached",
            "libnvidia-encode.so.1 uncached",
            "libnvidia-opticalflow.so.1 uncached",
            "libvdpau_nvidia.so.1 uncached",
            "libEGL_nvidia.so.0 cached",
            "VDPAU_DRIVER_PATH=",
        ],
        "{out}"
    );

    let (code, out, err) = gpu_exec_caps(&h, &tree, "compute,utility,video", &script);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    for (i, f) in json.iter().enumerate() {
        assert_eq!(lines[i], format!("{f} absent"), "{out}");
    }
    assert_eq!(
        &lines[4..],
        [
            "libnvcuvid.so.1 cached",
            "libnvidia-encode.so.1 cached",
            "libnvidia-opticalflow.so.1 cached",
            "libvdpau_nvidia.so.1 cached",
            "libEGL_nvidia.so.0 uncached",
            &format!("VDPAU_DRIVER_PATH={LIB_DIR}"),
        ],
        "{out}"
    );

    let (code, out, err) = gpu_exec_caps(&h, &tree, "compute,utility", &script);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    for (i, f) in json.iter().enumerate() {
        assert_eq!(lines[i], format!("{f} absent"), "{out}");
    }
    assert!(lines[4..9].iter().all(|l| l.ends_with(" uncached")), "{out}");
    h.assert_no_residue(&[]);
}

/// Sets the CUDA version the store records for a rootfs (as an import of a CUDA rootfs
/// would have found in its `usr/local/cuda/version.json`).
fn set_rootfs_cuda(h: &TestHome, name: &str, cuda: &str) {
    let meta = h.dir.join(format!("rootfs/{name}/meta.json"));
    let mut j: serde_json::Value = serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    j["cuda_version"] = cuda.into();
    std::fs::write(&meta, serde_json::to_vec(&j).unwrap()).unwrap();
}

/// A rootfs whose CUDA the driver cannot run fails before the job, in one line that
/// says what to do; with forward-compatibility libraries it runs on them.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn rootfs_cuda_newer_than_the_driver() {
    require_root!();
    let tree = or_skip!(driver_tree());
    let h = TestHome::new("gpu-compat");
    h.import(&debian_tar(), "deb");
    // No NVML here (no kernel module): the driver's CUDA comes from the table, 535 -> 12.2.
    set_rootfs_cuda(&h, "deb", "12.2.140");
    let (code, out, err) = gpu_exec(&h, &tree, "0", "echo ran");
    assert_eq!((code, out.as_str()), (0, "ran\n"), "{err}");

    set_rootfs_cuda(&h, "deb", "12.4.1");
    let (code, out, err) = gpu_exec(&h, &tree, "0", "echo ran");
    assert_eq!((code, out.as_str()), (125, ""), "{err}");
    let line = err.trim_end();
    assert_eq!(line.lines().count(), 1, "{err}");
    for needle in [
        "rootfs 'deb' has CUDA 12.4",
        "driver 535.309.01 supports CUDA 12.2 at most (driver table, no NVML)",
        "upgrade the driver to >= 550.54.14",
        "cuda-compat-12-4",
    ] {
        assert!(line.contains(needle), "missing {needle:?}: {line}");
    }
    // No GPU, no check; and NVIDIA_DISABLE_REQUIRE skips it, as with the toolkit.
    let (code, out, err) = gpu_exec(&h, &tree, "none", "echo ran");
    assert_eq!((code, out.as_str()), (0, "ran\n"), "{err}");
    let o = h
        .command()
        .arg("--driver-root")
        .arg(&tree)
        .args(["exec", "--rootfs", "deb", "--gpus", "0", "-e", "NVIDIA_DISABLE_REQUIRE=1", "--", "echo", "ran"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ran\n", "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("NVIDIA_DISABLE_REQUIRE"), "a warning says it was skipped");

    // cuda-compat-12-4's layout: a newer libcuda in /usr/local/cuda-12.4/compat. The
    // job runs, and that libcuda comes first in its linker cache (the host's second).
    let compat = h.dir.join("rootfs/deb/tree/usr/local/cuda-12.4/compat");
    std::fs::create_dir_all(&compat).unwrap();
    let host_libcuda = std::fs::read_dir(tree.join("usr/lib/x86_64-linux-gnu/nvidia/current"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("libcuda.so.5"))
        .unwrap();
    std::fs::copy(&host_libcuda, compat.join("libcuda.so.550.54.15")).unwrap();
    std::os::unix::fs::symlink("libcuda.so.550.54.15", compat.join("libcuda.so.1")).unwrap();
    let (code, out, err) = gpu_exec(&h, &tree, "0", "ldconfig -p | grep -F 'libcuda.so.1 ' | sed 's/.*=> //'");
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, format!("/usr/local/cuda-12.4/compat/libcuda.so.1\n{LIB_DIR}/libcuda.so.1\n"), "{err}");
    assert!(err.contains("forward-compatibility libraries /usr/local/cuda-12.4/compat (driver 550.54.15"), "{err}");
    h.assert_no_residue(&[]);
}

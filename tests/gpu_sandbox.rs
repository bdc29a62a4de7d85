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
    let (code, mounts, err) = gpu_exec(&h, &tree, "1", "grep -c nvidia /proc/self/mountinfo; true");
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

//! scripts/gpu-proof.sh against the Debian driver tree (fake device nodes, no GPU): it
//! must get as far as a machine without a GPU allows, say "SKIPPED: no GPU" on every row
//! that needs one, and fail (exit 1, a FAIL row) when the driver is not there. On a GPU
//! machine the same script fills BENCHMARKS.md's "real GPU" section.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs the script; returns (exit status, the Markdown it wrote, stderr).
fn proof(name: &str, driver_root: &Path, envs: &[(&str, &str)]) -> (i32, String, String) {
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("gpu-proof-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let out_md = work.with_extension("md");
    let mut cmd = Command::new(repo().join("scripts/gpu-proof.sh"));
    cmd.arg("--bin").arg(bin()).arg("--driver-root").arg(driver_root).arg("--out").arg(&out_md);
    // As TestHome::command: the jobs run in the machine's own network namespace, whose
    // IPv6 uplink is the real network's (an `auto` job would turn on its force_forwarding
    // until gc).
    cmd.arg("--work").arg(&work).env_remove("AZP_SANDBOX_HOME").env("AZP_SANDBOX_IPV6", "off");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let started = std::time::Instant::now();
    let o = cmd.output().unwrap();
    eprintln!("gpu-proof.sh ({name}) took {:.1}s", started.elapsed().as_secs_f64());
    let md = std::fs::read_to_string(&out_md).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_file(&out_md);
    (o.status.code().unwrap_or(-1), md, String::from_utf8_lossy(&o.stderr).into_owned())
}

/// The result column of the table row whose check column is `check`.
fn result<'a>(md: &'a str, check: &str) -> &'a str {
    md.lines()
        .find(|l| l.starts_with(&format!("| {check} |")))
        .and_then(|l| l.trim_end_matches(" |").rsplit(" | ").next())
        .unwrap_or_else(|| panic!("no row '{check}' in:\n{md}"))
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: the proof script imports a rootfs and runs sandboxes as root")]
fn proof_script_on_the_driver_tree_skips_what_needs_a_gpu() {
    require_root!();
    if rootless() {
        return skip("the proof script runs as root");
    }
    let tree = or_skip!(driver_tree());
    // A stand-in for PyTorch on the host's python3 (a test double: no GPU, no torch
    // here) to carry the script through its read-only-volume path.
    let fake = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fake-torch-{}", std::process::id()));
    std::fs::create_dir_all(fake.join("torch")).unwrap();
    std::fs::write(
        fake.join("torch/__init__.py"),
        "__version__ = '0.0.0+test-double'\nclass cuda:\n    @staticmethod\n    def is_available():\n        return False\n",
    )
    .unwrap();
    let (code, md, err) = proof("tree", &tree, &[("PYTHONPATH", fake.to_str().unwrap())]);
    assert_eq!(code, 0, "{md}\n{err}");
    for check in [
        "driver found by azp-sandbox",
        "rootfs from this machine, imported",
        "--gpus all: device nodes",
        "--gpus 1: only GPU 1's node",
        "nvidia-smi injected, runs (exit status)",
        "rootfs with CUDA 99.0 refused before the job",
        "graphics: /usr/share/glvnd/egl_vendor.d/10_nvidia.json and its library",
    ] {
        assert_eq!(result(&md, check), "PASS", "{check}:\n{md}");
    }
    // The default network needs nft as root: without it, that row says so and the GPU
    // rows run with --network none.
    let net = result(&md, "a job with the default network (isolated)");
    if azp_sandbox::sandbox::network::firewall::nft().is_ok() {
        assert_eq!(net, "PASS", "{md}");
    } else {
        assert!(net.starts_with("SKIPPED: a package is missing here"), "{md}");
    }
    for check in [
        "nvidia-smi -L (exit status)",
        "--gpus 1: nvidia-smi sees only GPU 1",
        "CUDA device query (nvcc)",
        "device-to-device copy, GB/s",
        "SGEMM 4096, GFLOP/s",
        "torch.cuda sees the GPU",
    ] {
        assert_eq!(result(&md, check), "SKIPPED: no GPU", "{check}:\n{md}");
    }
    // cuprobe needs a C compiler; with one, libcuda loads through the sandbox's linker.
    let cc = Command::new("sh").args(["-c", "command -v cc || command -v gcc"]).output().unwrap().status.success();
    if cc {
        assert_eq!(result(&md, "libcuda loads via the linker (cuprobe)"), "PASS", "{md}");
        assert!(md.contains("libcuda.so.1, cuDriverGetVersion 12020"), "535 is CUDA 12.2:\n{md}");
        assert_eq!(result(&md, "libcuda: cuInit, devices (cuprobe)"), "SKIPPED: no GPU");
    } else {
        eprintln!("NOTE: no C compiler: the cuprobe rows are skipped");
    }
    let py = Command::new("python3").arg("-c").arg("pass").output().is_ok_and(|o| o.status.success());
    if py {
        assert_eq!(result(&md, "PyTorch imports (read-only volume)"), "PASS", "{md}");
        assert!(md.contains("| 0.0.0+test-double | 0.0.0+test-double "), "{md}");
    } else {
        eprintln!("NOTE: no python3: the PyTorch rows are skipped");
    }
    assert_eq!(result(&md, "a job's set-up: --gpus all vs none (us)"), "INFO: median of 5 each, interleaved");
    assert!(md.contains("NVML loaded in "), "the -v job's timing line:\n{md}");
    assert!(md.contains("- no GPU here: each row that needs one says SKIPPED: no GPU"), "{md}");
    assert!(md.contains(" 0 failed in "), "{md}");
    let _ = std::fs::remove_dir_all(&fake);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: the proof script imports a rootfs and runs sandboxes as root")]
fn proof_script_fails_without_a_driver() {
    require_root!();
    if rootless() {
        return skip("the proof script runs as root");
    }
    let empty = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("no-driver-{}", std::process::id()));
    std::fs::create_dir_all(empty.join("dev")).unwrap();
    let (code, md, err) = proof("nodriver", &empty, &[]);
    assert_eq!(code, 1, "{md}\n{err}");
    assert_eq!(result(&md, "driver found by azp-sandbox"), "FAIL: gpu list found no driver", "{md}");
    assert!(result(&md, "--gpus all: device nodes").starts_with("FAIL: expected nvidiactl nvidia-uvm"), "{md}");
    assert!(!md.contains(" 0 failed in "), "{md}");
    // Bad usage: exit 2, nothing written.
    let o = Command::new(repo().join("scripts/gpu-proof.sh")).arg("--bogus").output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&empty);
}

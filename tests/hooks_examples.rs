//! The example hooks shipped in hooks/, run against a stub nvidia-smi that answers the
//! way the real one does (CSV, noheader, nounits).

mod common;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

fn stub(dir: &Path, output: &str, code: i32) {
    let p = dir.join("nvidia-smi");
    std::fs::write(
        &p,
        format!("#!/bin/sh\necho \"$@\" >> {}/args\nprintf '%s' '{output}'\nexit {code}\n", dir.display()),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn run_hook(name: &str, dir: &Path, gpus: &str) -> (i32, String) {
    let out = Command::new(common::repo().join("hooks").join(name))
        .env("PATH", format!("{}:/usr/bin:/bin", dir.display()))
        .env("AZP_GPU_UUIDS", gpus)
        .env("AZP_SLOT", "0")
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn gpu_health_pauses_on_ecc_errors() {
    let t = tempfile::tempdir().unwrap();
    stub(t.path(), "0, No\n", 0);
    assert_eq!(run_hook("pre-job.d/10-gpu-health", t.path(), "GPU-aaa").0, 0);
    stub(t.path(), "3, No\n", 0);
    let (code, out) = run_hook("pre-job.d/10-gpu-health", t.path(), "GPU-aaa");
    assert_eq!(code, 1);
    assert!(out.contains("GPU GPU-aaa: 3 uncorrected ECC errors"), "{out}");
    stub(t.path(), "[N/A], Yes\n", 0);
    let (code, out) = run_hook("pre-job.d/10-gpu-health", t.path(), "GPU-aaa");
    assert_eq!(code, 1);
    assert!(out.contains("retired pages pending"), "{out}");
    // A CPU-only slot never calls nvidia-smi.
    assert_eq!(run_hook("pre-job.d/10-gpu-health", t.path(), "").0, 0);
    let args = std::fs::read_to_string(t.path().join("args")).unwrap();
    assert_eq!(args.lines().count(), 3, "{args}");
    assert!(args.contains("--id=GPU-aaa"), "{args}");
}

#[test]
fn gpu_idle_pauses_when_a_process_holds_the_gpu() {
    let t = tempfile::tempdir().unwrap();
    stub(t.path(), "", 0);
    assert_eq!(run_hook("post-job.d/10-gpu-idle", t.path(), "GPU-aaa,GPU-bbb").0, 0);
    stub(t.path(), "4242, python3, 1024 MiB\n", 0);
    let (code, out) = run_hook("post-job.d/10-gpu-idle", t.path(), "GPU-aaa,GPU-bbb");
    assert_eq!(code, 1);
    assert!(out.contains("still in use") && out.contains("4242"), "{out}");
}

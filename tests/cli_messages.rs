//! What a person sees of the command line itself: terminal messages without timestamps
//! (logs keep them), `rootfs import` naming from the file, `rootfs build --list`,
//! `service install --dry-run` and `--unit-dir -`.

mod common;

use common::pty::PtySession;
use common::TestHome;
use std::process::Stdio;
use std::time::Duration;

/// `2026-11-24T13:52:20.991831Z  WARN ...`: the log format of files, pipes and journald.
fn starts_with_timestamp(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 20 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && b[10] == b'T' && line.contains("Z ")
}

/// `service install --dry-run` of a binary in cargo's build tree warns about it and writes
/// nothing: a warning every test run can provoke without root or a sandbox.
fn dry_run_args(unit_dir: &str) -> Vec<String> {
    ["service", "install", "--dry-run", "--unit-dir", unit_dir, "--config", "/nonexistent/c.toml"]
        .map(String::from)
        .to_vec()
}

fn in_build_tree() -> bool {
    let b = common::bin().display().to_string();
    b.contains("/target/debug/") || b.contains("/target/release/")
}

#[test]
fn terminal_messages_are_plain_and_logs_keep_timestamps() {
    if !in_build_tree() {
        return common::skip("the test binary is not under target/debug or target/release: no build-tree warning");
    }
    let h = TestHome::new("msgs");
    let unit_dir = h.dir.join("units");
    let args = dry_run_args(unit_dir.to_str().unwrap());

    // A terminal: what a person reads.
    let mut cmd = h.command();
    cmd.args(&args);
    let mut tty = PtySession::spawn(cmd, 24, 200);
    let (st, seen) = tty.wait(Duration::from_secs(30));
    assert!(st.success(), "{st}: {seen}");
    let warning = seen.lines().find(|l| l.contains("cargo build tree")).unwrap_or_else(|| panic!("{seen}"));
    assert!(warning.trim_start_matches('\r').starts_with("warning: the unit runs "), "{warning:?}");
    assert!(!seen.contains("WARN") && !seen.lines().any(starts_with_timestamp), "no timestamps: {seen}");
    assert!(!seen.contains('\x1b'), "no colour codes: {seen:?}");

    // A pipe (as journald reads a service) and a file: timestamps and levels stay.
    let out = h.command().args(&args).stdout(Stdio::null()).stderr(Stdio::piped()).output().unwrap();
    let piped = String::from_utf8_lossy(&out.stderr);
    let line = piped.lines().find(|l| l.contains("cargo build tree")).unwrap_or_else(|| panic!("{piped}"));
    assert!(starts_with_timestamp(line) && line.contains(" WARN "), "{line:?}");
    assert!(!piped.contains('\x1b'), "{piped:?}");

    let log = h.dir.join("log");
    let file = std::fs::File::create(&log).unwrap();
    let st = h.command().args(&args).stdout(Stdio::null()).stderr(file).status().unwrap();
    assert!(st.success());
    let logged = std::fs::read_to_string(&log).unwrap();
    let line = logged.lines().find(|l| l.contains("cargo build tree")).unwrap_or_else(|| panic!("{logged}"));
    assert!(starts_with_timestamp(line) && line.contains(" WARN "), "{line:?}");
    assert!(!unit_dir.exists(), "--dry-run wrote {}", unit_dir.display());
}

#[test]
fn service_dry_run_prints_the_unit_and_writes_nothing() {
    let h = TestHome::new("svc-dry");
    let cwd = h.dir.join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    if let Some(u) = common::test_user() {
        nix::unistd::chown(&cwd, Some(u.uid), Some(u.gid)).unwrap();
    }
    for unit_dir in ["-", "units"] {
        let out = h.command().current_dir(&cwd).args(dry_run_args(unit_dir)).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{unit_dir}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.starts_with("[Unit]") && stdout.contains("\nExecStart="), "{unit_dir}: {stdout}");
        assert!(stdout.contains("run --config /nonexistent/c.toml"), "{stdout}");
    }
    let left: Vec<_> = std::fs::read_dir(&cwd).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "a dry run created {left:?}");
    let out = h.command().args(["service", "install", "--dry-run", "--name", "a/b"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.trim_end().lines().count() == 1 && err.contains("bad service --name 'a/b'"), "{err}");
}

#[test]
fn rootfs_build_list_names_each_recipe_with_what_it_builds() {
    let h = TestHome::new("recipes");
    let out = h.ok(&["rootfs", "build", "--list"]);
    let line = out.lines().find(|l| l.starts_with("debian-bookworm-minbase ")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("busybox"), "{line}");
    assert!(out.lines().any(|l| l.starts_with("debian-trixie-cuda12.4 ") && l.contains("CUDA 12.4")), "{out}");
    let out = h.run(&["rootfs", "build", "--list", "debian-bookworm-minbase"]);
    assert!(!out.status.success(), "--list takes no recipe");
}

#[test]
fn rootfs_import_names_the_rootfs_after_the_file() {
    let h = TestHome::new("import-name");
    let dir = h.dir.join("archives");
    std::fs::create_dir(&dir).unwrap();
    let good = dir.join("mini-1.0.tar");
    std::fs::copy(common::busybox_tar(), &good).unwrap();
    let bad = dir.join("my rootfs.tar");
    std::fs::copy(common::busybox_tar(), &bad).unwrap();
    for f in [&dir, &good, &bad] {
        if let Some(u) = common::test_user() {
            nix::unistd::chown(f, Some(u.uid), Some(u.gid)).unwrap();
        }
    }

    h.ok(&["rootfs", "import", good.to_str().unwrap()]);
    let listed = h.ok(&["rootfs", "list", "--json"]);
    let names: Vec<String> = serde_json::from_str::<Vec<serde_json::Value>>(&listed)
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["mini-1.0"]);

    let out = h.run(&["rootfs", "import", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("invalid rootfs name 'my rootfs'") && err.contains("--name"), "{err}");

    let out = h.run(&["rootfs", "import", "-"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--name NAME"), "{err}");
    assert_eq!(h.ok(&["rootfs", "list", "--json"]), listed, "a refused import changed the store");
}

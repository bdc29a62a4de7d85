//! `azp-sandbox exec` end to end: real namespaces, overlay, cgroups (CI runs as root).

mod common;
use common::*;
use std::time::{Duration, Instant};

fn exec_out(h: &TestHome, args: &[&str]) -> (i32, String, String) {
    let mut full = vec!["exec", "--rootfs", "bb"];
    full.extend_from_slice(args);
    let out = h.run(&full);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn command_is_pid_1_and_exit_codes_propagate() {
    require_root!();
    let h = TestHome::with_busybox("pid1");
    let (code, out, err) = exec_out(&h, &["--name", "pid1-a", "--", "sh", "-c", "echo pid=$$; hostname"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "pid=1\npid1-a\n");
    let (code, _, _) = exec_out(&h, &["--", "sh", "-c", "exit 7"]);
    assert_eq!(code, 7);
    let (code, _, err) = exec_out(&h, &["--", "/bin/no-such-command"]);
    assert_eq!(code, 125, "{err}");
    assert!(err.contains("no-such-command"), "{err}");
    h.assert_no_residue(&["pid1-a"]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn host_processes_are_invisible() {
    require_root!();
    let h = TestHome::with_busybox("procs");
    let (code, out, err) = exec_out(&h, &["--", "sh", "-c", "ls /proc | grep -c '^[0-9]'"]);
    assert_eq!(code, 0, "{err}");
    // sh, ls and grep at most.
    let n: u32 = out.trim().parse().unwrap();
    assert!(n <= 3, "job sees {n} processes");
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn dataset_is_read_only_and_announced() {
    require_root!();
    let h = TestHome::with_busybox("dataset");
    let data = h.dir.join("dataset");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("labels.txt"), "cat\ndog\n").unwrap();
    let vol = format!("{}:/datasets/animals:ANIMALS", data.display());
    let (code, out, err) = exec_out(
        &h,
        &[
            "--volume",
            &vol,
            "--",
            "sh",
            "-c",
            "cat $ANIMALS/labels.txt; touch $ANIMALS/x && echo WROTE || echo readonly",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "cat\ndog\nreadonly\n");
    assert!(!data.join("x").exists());
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn writes_do_not_reach_the_next_job_or_the_rootfs() {
    require_root!();
    let h = TestHome::with_busybox("isolation");
    let (code, _, err) =
        exec_out(&h, &["--", "sh", "-c", "echo secret > /etc/leak; echo x > /root/leak; test -f /etc/leak"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = exec_out(&h, &["--", "sh", "-c", "ls /etc/leak /root/leak 2>&1; echo done"]);
    assert_eq!(code, 0);
    assert!(out.contains("No such file") && out.ends_with("done\n"), "{out}");
    let tree = h.dir.join("rootfs/bb/tree");
    assert!(tree.join("etc/passwd").exists(), "store layout changed? {}", tree.display());
    assert!(!tree.join("etc/leak").exists(), "lower layer was modified");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn resolv_conf_and_hosts_come_from_the_host() {
    require_root!();
    let h = TestHome::with_busybox("dns");
    let (code, out, err) = exec_out(&h, &["--", "cat", "/etc/hosts"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, std::fs::read_to_string("/etc/hosts").unwrap());
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn network_none_has_only_loopback() {
    require_root!();
    let h = TestHome::with_busybox("netns");
    let (code, out, err) =
        exec_out(&h, &["--network", "none", "--", "sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), vec!["lo"]);
    let (_, out, _) = exec_out(&h, &["--network", "host", "--", "sh", "-c", "tail -n +3 /proc/net/dev | wc -l"]);
    let host_ifaces = std::fs::read_to_string("/proc/net/dev").unwrap().lines().count() - 2;
    assert_eq!(out.trim(), host_ifaces.to_string(), "--network host shares the host network");
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn memory_limit_kills_an_allocation_over_it() {
    require_root!();
    let h = TestHome::with_busybox("memory");
    // awk doubles a string until the allocation fails or the job is OOM-killed.
    let hog = "BEGIN { s = \"x\"; for (i = 0; i < 40; i++) s = s s; print length(s) }";
    let started = Instant::now();
    let (code, _, err) = exec_out(&h, &["--name", "mem-hog", "--memory", "64M", "--", "awk", hog]);
    assert_eq!(code, 137, "expected SIGKILL by the OOM killer: {err}");
    assert!(started.elapsed() < Duration::from_secs(60));
    // Under the limit the same program completes (2^20 bytes).
    let small = "BEGIN { s = \"x\"; for (i = 0; i < 20; i++) s = s s; print length(s) }";
    let (code, out, err) = exec_out(&h, &["--memory", "64M", "--", "awk", small]);
    assert_eq!((code, out.as_str()), (0, "1048576\n"), "{err}");
    h.assert_no_residue(&["mem-hog"]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn fork_bomb_is_contained_by_the_pids_limit() {
    require_root!();
    let h = TestHome::with_busybox("forkbomb");
    let name = unique("bomb");
    let mut child = h
        .command()
        .args(["exec", "--rootfs", "bb", "--name", &name, "--pids", "64", "--", "sh", "-c"])
        .arg("bomb() { bomb | bomb & }; bomb; exec sleep 4")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut max = 0u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(p) = pids_current(&name) {
            if let Ok(s) = std::fs::read_to_string(p) {
                max = max.max(s.trim().parse().unwrap_or(0));
            }
        }
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "fork bomb job did not end");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "pid 1 (sleep) exits 0 after 4 s: {status}");
    assert!(max <= 64, "pids.current reached {max} > 64");
    assert!(max >= 32, "the bomb never got going (max {max}): test is not testing");
    h.assert_no_residue(&[&name]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn sigterm_is_forwarded_then_the_job_is_killed() {
    require_root!();
    let h = TestHome::with_busybox("sigterm");
    let name = unique("term");
    // A job that traps TERM exits on it with its own code.
    let mut child = h
        .command()
        .args(["exec", "--rootfs", "bb", "--name", &name, "--", "sh", "-c"])
        .arg("trap 'exit 42' TERM; echo ready; while true; do sleep 0.1; done")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line, "ready\n");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGTERM).unwrap();
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(42));
    h.assert_no_residue(&[&name]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn sigkill_of_exec_and_helper_then_gc_leaves_nothing() {
    require_root!();
    let h = TestHome::with_busybox("crash");
    let name = unique("crash");
    let marker = "sleep 1777";
    let mut child = h
        .command()
        .args(["exec", "--rootfs", "bb", "--name", &name, "--", "sh", "-c"])
        .arg(format!("{marker}; true"))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while processes_matching(marker).iter().all(|(_, c)| !c.starts_with("sleep")) {
        assert!(Instant::now() < deadline, "job never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let job_dir = h.jobs_dir().join(&name);
    // The helper is exec's child (forked, or re-executed by a threaded runner).
    let helpers = children_of(child.id() as i32);
    assert!(!helpers.is_empty(), "no helper process found");
    for pid in helpers {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // The job itself survives its supervisors: exactly what gc is for.
    assert!(!cgroup_dirs_of(&name).is_empty(), "cgroup should still exist before gc");
    assert!(job_dir.exists());
    let out = h.run(&["gc"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains(&format!("job {name}")), "gc log: {log}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_matching(marker).iter().any(|(_, c)| c.starts_with("sleep")) {
        assert!(Instant::now() < deadline, "job process survived gc");
        std::thread::sleep(Duration::from_millis(20));
    }
    h.assert_no_residue(&[&name]);
}

#[test]
fn bad_input_gives_one_line_errors() {
    let h = TestHome::new("badinput");
    let cases: &[(&[&str], &str)] = &[
        (&["exec", "--rootfs", "bb", "--volume", "relative:/x", "--", "true"], "malformed --volume"),
        (&["exec", "--rootfs", "bb", "--memory", "12X", "--", "true"], "bad size"),
        (&["exec", "--rootfs", "bb", "--pids", "0", "--", "true"], "bad --pids"),
        (&["exec", "--rootfs", "bb", "--cpus=-1", "--", "true"], "bad --cpus"),
        (&["exec", "--rootfs", "bb", "--name", "../x", "--", "true"], "bad --name"),
    ];
    for (args, want) in cases {
        let out = h.run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    if !is_root() {
        return skip_part(
            "needs root: the errors of an unknown rootfs and of `--rootfs auto` come from real sandboxes",
        );
    }
    let out = h.run(&["exec", "--rootfs", "nope", "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125));
    assert!(err.contains("unknown rootfs 'nope'") && err.lines().count() == 1, "{err}");
    h.import(&busybox_tar(), "bb");
    // No NVIDIA driver on this host: auto cannot choose, and says why.
    let out = h
        .command()
        .args(["--driver-root"])
        .arg(&h.dir)
        .args(["exec", "--rootfs", "auto", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--rootfs auto") && err.contains("no NVIDIA driver") && err.lines().count() == 1, "{err}");
    let out = h.run(&["exec", "--rootfs", "bb", "--volume", "/no/such/dir:/data", "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("volume source /no/such/dir does not exist") && err.lines().count() == 1, "{err}");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn rootfs_in_use_cannot_be_removed() {
    require_root!();
    let h = TestHome::with_busybox("rm-in-use");
    let mut child = h
        .command()
        .args(["exec", "--rootfs", "bb", "--", "sh", "-c", "echo up; sleep 3"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let out = h.run(&["rootfs", "rm", "bb"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(child.wait().unwrap().success());
    h.ok(&["rootfs", "rm", "bb"]);
    assert!(!h.ok(&["rootfs", "list"]).contains("bb "));
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn debian_minbase_rootfs() {
    require_root!();
    let h = TestHome::new("debian");
    h.import(&debian_tar(), "deb");
    let run = |cmd: &str| {
        let out = h.run(&["exec", "--rootfs", "deb", "--memory", "512M", "--pids", "256", "--", "bash", "-c", cmd]);
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) =
        run("echo pid=$$; cat /etc/debian_version; id -u; dpkg -s coreutils | grep -c '^Status: install ok installed'");
    assert_eq!(code, 0, "{err}");
    let lines: Vec<_> = out.lines().collect();
    assert_eq!(lines[0], "pid=1");
    assert!(lines[1].starts_with("12."), "{out}");
    assert_eq!(&lines[2..], ["0", "1"]);
    let (code, _, err) = run("echo hi > /etc/motd.d-test && apt-get --version >/dev/null");
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = run("test -e /etc/motd.d-test && echo leaked || echo clean");
    assert_eq!(out, "clean\n");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn job_cannot_raise_its_own_limits_or_mount() {
    require_root!();
    let h = TestHome::with_busybox("limits-ro");
    let script = "for f in /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory.max; do \
                    echo 9999999999 > $f 2>/dev/null && echo RAISED $f; done; \
                  mount -t tmpfs x /tmp 2>/dev/null && echo MOUNTED; \
                  mknod /tmp/null c 1 3 2>/dev/null && echo MKNOD; echo end";
    let (code, out, err) = exec_out(&h, &["--memory", "64M", "--", "sh", "-c", script]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "end\n");
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn seccomp_profile_is_enforced() {
    require_root!();
    let h = TestHome::with_busybox("seccomp");
    // An unprivileged user namespace needs no capability: only seccomp stops it.
    let (code, out, err) =
        exec_out(&h, &["--", "sh", "-c", "unshare -U true 2>&1 && echo UNSHARED; grep Seccomp: /proc/self/status"]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("UNSHARED"), "{out}");
    assert!(out.contains("Seccomp:\t2"), "filter mode expected: {out}");
}

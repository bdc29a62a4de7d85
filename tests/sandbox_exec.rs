//! `azp-sandbox exec` end to end: real namespaces, overlay, cgroups (CI runs as root).

mod common;
use common::pty::{PtySession, CTRL_C};
use common::*;
use std::io::Write;
use std::process::{Command, Stdio};
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
fn the_init_is_pid_1_and_exit_codes_propagate() {
    require_root!();
    let h = TestHome::with_busybox("pid1");
    let script = "echo pid=$$; hostname; tr '\\0' ' ' < /proc/1/cmdline; echo";
    let (code, out, err) = exec_out(&h, &["--name", "pid1-a", "--", "sh", "-c", script]);
    assert_eq!(code, 0, "{err}");
    // The command is the init's child, the first process after it; the init installed the
    // job's seccomp filter first.
    assert_eq!(out, format!("pid=2\npid1-a\n/dev/.azp-init --seccomp -- sh -c {script} \n"));
    let (code, _, _) = exec_out(&h, &["--", "sh", "-c", "exit 7"]);
    assert_eq!(code, 7);
    let (code, _, _) = exec_out(&h, &["--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(code, 143, "killed by SIGTERM: 128 + 15");
    h.assert_no_residue(&["pid1-a"]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn a_command_that_cannot_run_gets_one_line_and_exit_127_or_126() {
    require_root!();
    let h = TestHome::with_busybox("cmd127");
    // The first job on a fresh host also says that it made the jobs' nftables table (an
    // info line, as it turns IPv4 forwarding on): one job first, so stderr below is the
    // command's error alone.
    let (code, _, err) = exec_out(&h, &["--", "true"]);
    assert_eq!(code, 0, "{err}");
    // As docker and podman: 127 for a command that does not exist, 126 for one that
    // cannot be executed; one line, and nothing from the container library before it.
    for (cmd, code, line) in [
        ("/bin/no-such-command", 127, "azp-sandbox: /bin/no-such-command: command not found"),
        ("no-such-command", 127, "azp-sandbox: no-such-command: command not found"),
        ("/etc/passwd", 126, "azp-sandbox: /etc/passwd: permission denied (not an executable file)"),
        ("/etc", 126, "azp-sandbox: /etc: permission denied (not an executable file)"),
    ] {
        let (got, out, err) = exec_out(&h, &["--", cmd]);
        assert_eq!((got, out.as_str(), err.as_str()), (code, "", format!("{line}\n").as_str()), "{cmd}");
    }
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn output_into_a_file_keeps_every_line_in_order() {
    require_root!();
    let h = TestHome::with_busybox("outfile");
    // Lines alternate between stdout and stderr, with pauses so that each copier waits
    // for data in between (where the lost writes happened, issue 21).
    let script = "for i in 1 2 3 4 5 6; do echo out$i; sleep 0.05; echo err$i >&2; sleep 0.05; done";
    let expected: String = (1..=6).map(|i| format!("out{i}\nerr{i}\n")).collect();
    let file = h.dir.join("out.txt");
    // -q: only the job's lines in the files (azp-sandbox's own INFO lines, e.g. when this
    // exec is the one that makes the jobs' nftables table again, go to the same stderr).
    let exec = format!("{} --home {} -q exec --rootfs bb -- sh -c '{script}'", bin().display(), h.dir.display());
    let run = |redirect: &str| {
        let mut c = Command::new("sh");
        c.arg("-c").arg(format!("{exec} {redirect}"));
        as_test_user(&mut c);
        let st = c.status().unwrap();
        assert!(st.success(), "{redirect}: {st}");
    };
    if let Some(u) = test_user() {
        std::fs::write(&file, "").unwrap();
        nix::unistd::chown(&file, Some(u.uid), Some(u.gid)).unwrap();
    }
    run(&format!("> {} 2>&1", file.display()));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), expected, "> f 2>&1");
    run(&format!(">> {} 2>&1", file.display()));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), format!("{expected}{expected}"), ">> f 2>&1");
    // Separate files, and a pipe.
    let err = h.dir.join("err.txt");
    if let Some(u) = test_user() {
        std::fs::write(&err, "").unwrap();
        nix::unistd::chown(&err, Some(u.uid), Some(u.gid)).unwrap();
    }
    run(&format!("> {} 2> {}", file.display(), err.display()));
    let only = |p: &str| (1..=6).map(|i| format!("{p}{i}\n")).collect::<String>();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), only("out"));
    assert_eq!(std::fs::read_to_string(&err).unwrap(), only("err"));
    let mut c = Command::new("sh");
    c.arg("-c").arg(format!("{exec} 2>&1 | cat"));
    as_test_user(&mut c);
    let o = c.output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), expected, "through a pipe");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn exec_without_a_command_runs_the_rootfs_shell() {
    require_root!();
    let h = TestHome::with_busybox("noshell");
    let mut c = h.command();
    c.args(["exec", "--rootfs", "bb"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"echo shell=$0 uid=$(id -u); exit 4\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", String::from_utf8_lossy(&o.stderr));
    // The busybox rootfs's passwd gives root /bin/sh.
    assert_eq!(String::from_utf8_lossy(&o.stdout), "shell=/bin/sh uid=0\n");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn host_processes_are_invisible() {
    require_root!();
    let h = TestHome::with_busybox("procs");
    let (code, out, err) = exec_out(&h, &["--", "sh", "-c", "ls /proc | grep -c '^[0-9]'"]);
    assert_eq!(code, 0, "{err}");
    // The init, sh, ls and grep at most.
    let n: u32 = out.trim().parse().unwrap();
    assert!(n <= 4, "job sees {n} processes");
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
    // The host's own network namespace (not its interface count: other tests' jobs add
    // and remove links meanwhile).
    let (code, out, err) = exec_out(&h, &["--network", "host", "--", "readlink", "/proc/self/ns/net"]);
    assert_eq!(code, 0, "{err}");
    let host_ns = std::fs::read_link("/proc/self/ns/net").unwrap();
    assert_eq!(out.trim(), host_ns.to_str().unwrap(), "--network host shares the host network");
}

/// A CDI spec's hooks reach libcontainer: a poststart hook (passed through as it is, see
/// `gpu::cdi`) runs once, after the job started, and the spec's env is the job's.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn a_cdi_poststart_hook_runs() {
    require_root!();
    if rootless() {
        return skip("CDI hooks run as root (the hook runs in the runtime's namespaces)");
    }
    let h = TestHome::with_busybox("cdi-hook");
    let marker = h.dir.join("poststart-ran");
    let spec = h.dir.join("test-cdi.yaml");
    std::fs::write(
        &spec,
        format!(
            "cdiVersion: \"0.6.0\"\nkind: example.com/test\ndevices:\n- name: x\n  containerEdits:\n    env: [\"CDI_TEST=1\"]\n\
             containerEdits:\n  hooks:\n  - hookName: poststart\n    path: /bin/sh\n    args: [\"sh\", \"-c\", \"echo ran >> {}\"]\n",
            marker.display()
        ),
    )
    .unwrap();
    let args = ["--network", "none", "--cdi-spec", spec.to_str().unwrap(), "--gpus", "example.com/test=x"];
    let (code, out, err) = exec_out(&h, &[&args[..], &["--", "sh", "-c", "echo CDI_TEST=$CDI_TEST"]].concat());
    assert_eq!((code, out.as_str()), (0, "CDI_TEST=1\n"), "{err}");
    assert_eq!(std::fs::read_to_string(&marker).unwrap_or_default(), "ran\n", "the poststart hook, once");
}

/// The helper absorbs SIGPIPE (a hook may exit without reading the state on its stdin);
/// the job still has SIGPIPE's default action (not ignored: a handler goes at execve).
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn a_job_does_not_ignore_sigpipe() {
    require_root!();
    let h = TestHome::with_busybox("sig-ign");
    let (code, out, err) = exec_out(&h, &["--network", "none", "--", "/bin/cat", "/proc/self/status"]);
    assert_eq!(code, 0, "{err}");
    let ign = out.lines().find(|l| l.starts_with("SigIgn:")).unwrap_or_default();
    let mask = u64::from_str_radix(ign.split_whitespace().nth(1).unwrap_or("x"), 16).expect(ign);
    assert_eq!(mask & (1 << (libc::SIGPIPE - 1)), 0, "{out}");
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
    // The bomb goes off in a child: pid 1's own fork (`&`) comes before the bomb exists,
    // and `exec sleep` needs none, so pid 1 cannot lose a fork race to it (it did once,
    // when pid 1 itself ran `bomb | bomb &` and its second fork met a full pids limit).
    let mut child = h
        .command()
        .args(["exec", "--rootfs", "bb", "--name", &name, "--pids", "64", "--", "sh", "-c"])
        .arg("bomb() { bomb | bomb & }; bomb & exec sleep 4")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut max = 0u64;
    // The kernel's own count of forks refused at the limit (pids.events "max"): the bomb
    // can reach the limit and die out between two samples of pids.current.
    let mut refused = 0u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(p) = pids_current(&name) {
            if let Ok(s) = std::fs::read_to_string(&p) {
                max = max.max(s.trim().parse().unwrap_or(0));
            }
            if let Ok(e) = std::fs::read_to_string(p.with_file_name("pids.events")) {
                let n = e.lines().find_map(|l| l.strip_prefix("max ")).and_then(|n| n.trim().parse().ok());
                refused = refused.max(n.unwrap_or(0));
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
    assert!(
        max >= 32 || refused > 0,
        "the bomb never got going (max {max}, no fork refused at the limit): test is not testing"
    );
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
fn sigkill_of_exec_and_helper_ends_the_job_and_gc_leaves_nothing() {
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
    // The job dies with its supervisors (its init's lifeline, issue 25), without gc...
    let deadline = Instant::now() + Duration::from_secs(1);
    while processes_matching(marker).iter().any(|(_, c)| c.starts_with("sleep")) {
        assert!(Instant::now() < deadline, "the job outlived its helper and exec by 1 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // ...and what it leaves on disk is gc's.
    assert!(job_dir.exists());
    let out = h.run(&["gc"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains(&format!("job {name}")), "gc log: {log}");
    h.assert_no_residue(&[&name]);
}

#[test]
fn bad_input_gives_one_line_errors() {
    let h = TestHome::new("badinput");
    let cases: &[(&[&str], &str)] = &[
        (&["exec", "--rootfs", "bb", "--volume", "relative:/x", "--", "true"], "malformed --volume"),
        (&["exec", "--rootfs", "bb", "--memory", "12X", "--", "true"], "bad --memory '12X'"),
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
    assert_eq!(lines[0], "pid=2", "the init is pid 1");
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

// ---------------------------------------------------------------------------------------
// A user's terminal (a pty of the test's own: exec is its session leader and foreground
// process group, as in a shell)
// ---------------------------------------------------------------------------------------

const LONG: Duration = Duration::from_secs(60);

fn exec_on_pty(h: &TestHome, args: &[&str]) -> PtySession {
    let mut c = h.command();
    c.args(args);
    PtySession::spawn(c, 24, 80)
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn one_ctrl_c_is_one_sigint_for_the_job() {
    require_root!();
    let h = TestHome::with_busybox("ctrlc");
    // The job counts its SIGINTs, then ends as if killed by one (exit 130). Before the
    // fix, the helper shared exec's process group, both forwarded the terminal's SIGINT,
    // and the second killed the job (137).
    let script = "n=0; trap 'n=$((n+1)); echo got-SIGINT-$n' INT; echo ready; \
                  while [ $n -lt 1 ]; do sleep 0.1; done; sleep 1; echo count=$n; exit 130";
    let mut t = exec_on_pty(&h, &["exec", "--rootfs", "bb", "--", "sh", "-c", script]);
    t.expect("ready", LONG);
    t.send(CTRL_C);
    let (st, out) = t.wait(LONG);
    assert_eq!(st.code(), Some(130), "{out}");
    assert!(out.contains("count=1"), "{out}");
    assert_eq!(out.matches("got-SIGINT").count(), 1, "{out}");
    assert!(!out.contains("killing the job") && !out.contains("again"), "{out}");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn ctrl_c_reaches_a_child_of_the_command() {
    require_root!();
    let h = TestHome::with_busybox("ctrlc-child");
    // The command's own child gets the SIGINT (the init passes it to the whole process
    // group, as a terminal does), and so does the command: each once.
    let inner = "trap \"echo child-got-SIGINT; exit 5\" INT; echo ready; while :; do sleep 0.1; done";
    let script = format!("trap 'echo parent-got-SIGINT' INT; sh -c '{inner}'; echo child-exit=$?");
    let mut t = exec_on_pty(&h, &["exec", "--rootfs", "bb", "--", "sh", "-c", &script]);
    t.expect("ready", LONG);
    t.send(CTRL_C);
    let (st, out) = t.wait(LONG);
    assert_eq!(st.code(), Some(0), "{out}");
    for line in ["child-got-SIGINT", "parent-got-SIGINT", "child-exit=5"] {
        assert_eq!(out.matches(line).count(), 1, "{line}: {out}");
    }
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn shell_has_a_real_terminal_with_resizes_and_job_control() {
    require_root!();
    let h = TestHome::with_busybox("shell");
    let mut t = exec_on_pty(&h, &["shell", "--rootfs", "bb"]);
    let before = t.termios();
    // A prompt: busybox ash, interactive on its terminal.
    let mut at = t.expect("# ", LONG);
    // The job's own terminal, from its own devpts: the path exists in the sandbox.
    t.send(b"tty; test -c $(tty) && echo tty-exists; stty size\n");
    at = t.expect_after(at, "tty-exists", LONG);
    at = t.expect_after(at, "24 80", LONG);
    let raw = t.termios();
    assert!(!raw.local_flags.contains(nix::sys::termios::LocalFlags::ICANON), "ours is raw while the job runs");
    t.resize(40, 100);
    // Until the resize has come through (30 s at most: a busy machine); the typed line
    // does not contain what it prints.
    t.send(b"n=0; until [ \"$(stty size)\" = \"40 100\" ] || [ $n -ge 300 ]; do sleep 0.1; n=$((n+1)); done; stty size | tr ' ' x\n");
    at = t.expect_after(at, "40x100", LONG);
    // Job control: a background job brought to the foreground, then Ctrl-C: only it gets
    // the SIGINT, the shell carries on.
    t.send(b"sleep 30 &\n");
    at = t.expect_after(at, "# ", LONG);
    t.send(b"fg\n");
    at = t.expect_after(at, "sleep 30", LONG);
    std::thread::sleep(Duration::from_millis(500));
    let ctrl_c_at = Instant::now();
    t.send(CTRL_C);
    at = t.expect_after(at, "# ", LONG);
    assert!(ctrl_c_at.elapsed() < Duration::from_secs(20), "the foreground sleep did not end on Ctrl-C");
    t.send(b"echo fg-exit=$?; exit 3\n");
    t.expect_after(at, "fg-exit=130", LONG);
    let (st, out) = t.wait(LONG);
    assert_eq!(st.code(), Some(3), "{out}");
    let term = |s: &str| out.lines().any(|l| l.trim_end_matches('\r') == s);
    assert!(term("/dev/pts/0"), "tty names the job's own pty: {out}");
    // Restored: the user's terminal is as it was before the shell.
    let after = t.termios();
    assert_eq!(
        (after.local_flags, after.input_flags, after.output_flags),
        (before.local_flags, before.input_flags, before.output_flags)
    );
    h.assert_no_residue(&[]);
}

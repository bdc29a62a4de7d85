//! Rootless mode (issue 6): azp-sandbox run by an ordinary user with user namespaces.
//!
//! These tests run the binary as `AZP_SANDBOX_TEST_USER` (scripts/setup.sh creates
//! `azp-rootless` with subordinate ids; scripts/test.sh sets the variable and delegates a
//! cgroup v1 subtree to it with scripts/delegate-cgroups.sh). Without the variable they
//! skip, saying so. The escape suite also runs rootless (scripts/test.sh).

mod common;
use common::fake_azure::FakeAzure;
use common::*;
use std::fs;
use std::io::BufRead;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

macro_rules! require_rootless {
    () => {
        if !common::rootless() {
            return skip(
                "runs only in the rootless pass: set AZP_SANDBOX_TEST_USER to an ordinary user with subordinate ids (scripts/test.sh does)",
            );
        }
    };
}

fn user() -> nix::unistd::User {
    test_user().unwrap()
}

/// The first subordinate uid of the test user (from /etc/subuid).
fn subuid_start() -> u32 {
    let u = user();
    let text = fs::read_to_string("/etc/subuid").unwrap();
    text.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() == 3 && (f[0] == u.name || f[0] == u.uid.to_string())).then(|| f[1].parse().unwrap())
        })
        .expect("the test user has subordinate uids")
}

fn delegated() -> bool {
    Path::new(&format!("/sys/fs/cgroup/memory/azp-sandbox/user-{}", user().uid)).is_dir()
        || Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// Starts `exec --rootfs bb ARGS -- sh -c "SCRIPT; echo ready; sleep 1000"` and waits
/// for `ready`; returns the child (stdout drained).
fn start_waiting(h: &TestHome, args: &[&str], script: &str) -> std::process::Child {
    let mut child = h
        .command()
        .args(["exec", "--rootfs", "bb"])
        .args(args)
        .args(["--", "sh", "-c", &format!("trap 'exit 143' TERM\n{script}\necho ready\nsleep 1000 & wait")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut r = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while line != "ready\n" {
        line.clear();
        if r.read_line(&mut line).unwrap() == 0 {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("job ended before ready: {err}");
        }
    }
    std::thread::spawn(move || std::io::copy(&mut r, &mut std::io::sink()));
    child
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: runs azp-sandbox as the rootless test user (scripts/test.sh)")]
fn job_runs_in_a_user_namespace_over_a_shifted_store() {
    require_rootless!();
    let h = TestHome::with_busybox("rl-shift");
    let u = user();
    let sub = subuid_start();
    // The store is a shifted copy: the tarball's uid N belongs to N + 1 of the user's
    // namespace, i.e. its root-owned files to the user's first subordinate uid (issue 19:
    // the user's own uid belongs to no job).
    let tree = h.dir.join("rootfs/bb/tree");
    assert_eq!(fs::metadata(tree.join("bin/busybox")).unwrap().uid(), sub);
    // Inside: root of a namespace nested in the user's, mapping 0.. onto its 1.. (read
    // from inside, the map is relative to the parent namespace).
    let out = h.ok(&["exec", "--rootfs", "bb", "--", "sh", "-c", "id -u; cat /proc/self/uid_map; ls -ln /bin/busybox"]);
    let lines: Vec<Vec<String>> = out.lines().map(|l| l.split_whitespace().map(String::from).collect()).collect();
    assert_eq!(lines[0], ["0"]);
    assert_eq!(lines[1], ["0", "1", "65536"]);
    assert_eq!(lines.len(), 3, "one map line: {out}");
    assert_eq!((lines[2][2].as_str(), lines[2][3].as_str()), ("0", "0"), "the image's owners, inside: {out}");
    // A file written by container uid 1000 is owned by subuid start + 1000 on the host.
    let name = unique("rl-owner");
    let mut job = start_waiting(
        &h,
        &["--name", &name, "--user", "1000:1000"],
        &format!(": {name}; echo x > /tmp/../home/f 2>/dev/null; echo x > /var/tmp/f"),
    );
    let f = h.home().job_layers_dir(&name).join("upper/var/tmp/f");
    assert_eq!(fs::metadata(&f).unwrap().uid(), sub + 1000, "{}", f.display());
    // No host process runs as host root on the job's behalf, and no job process as the
    // user: the helper is the user, the job's processes are subordinate ids.
    let mut job_procs = 0;
    for (pid, cmd) in processes_matching(&name) {
        let Ok(st) = fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
        let uids: Vec<u32> = st.lines().find(|l| l.starts_with("Uid:")).unwrap()[4..]
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        let in_job = st.lines().any(|l| l.starts_with("NSpid:") && l.split_whitespace().count() > 2);
        if in_job {
            job_procs += 1;
            assert!(uids.iter().all(|&u| u >= sub), "job pid {pid} ({cmd}) has host uids {uids:?}");
        } else {
            assert!(uids.iter().all(|&id| id == u.uid.as_raw()), "pid {pid} ({cmd}) runs as host uids {uids:?}");
        }
    }
    assert!(job_procs > 0, "no job process found");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(job.id() as i32), nix::sys::signal::SIGTERM).unwrap();
    let st = job.wait().unwrap();
    assert_eq!(st.code(), Some(143), "SIGTERM reaches the job: {st}");
    h.assert_no_residue(&[&name]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: runs azp-sandbox as the rootless test user (scripts/test.sh)")]
fn gpu_job_builds_its_edit_layer_as_the_user() {
    require_rootless!();
    let tree = or_skip!(driver_tree());
    let h = TestHome::with_busybox("rl-gpu");
    let script = "ls /dev | grep -c nvidia; readlink /usr/local/azp-sandbox/nvidia/lib64/libcuda.so.1";
    let gpu_job = || {
        h.ok(&[
            "--driver-root",
            tree.to_str().unwrap(),
            "exec",
            "--rootfs",
            "bb",
            "--gpus",
            "1",
            "--",
            "sh",
            "-c",
            script,
        ])
    };
    let first = gpu_job();
    let lines: Vec<&str> = first.lines().collect();
    assert_eq!(lines[0], "5", "nvidia1, nvidiactl, the two uvm nodes, modeset: {first}");
    assert!(lines[1].starts_with("libcuda.so.5"), "{first}");
    // Built in the user's home, by the user (overlayfs metadata in user. xattrs), and
    // used again by the next job.
    let layers: Vec<PathBuf> =
        fs::read_dir(h.dir.join("cache/edit-layers")).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(layers.len(), 1, "{layers:?}");
    assert_eq!(fs::metadata(layers[0].join("tree/etc/ld.so.cache")).unwrap().uid(), user().uid.as_raw());
    assert_eq!(gpu_job(), first);
    assert_eq!(fs::read_dir(h.dir.join("cache/edit-layers")).unwrap().count(), 1);
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: runs azp-sandbox as the rootless test user (scripts/test.sh)")]
fn limits_are_enforced_in_the_delegated_cgroup() {
    require_rootless!();
    if !delegated() {
        return skip("no delegated cgroup for the test user (scripts/delegate-cgroups.sh)");
    }
    let h = TestHome::with_busybox("rl-limits");
    let name = unique("rl-mem");
    let out = h.ok(&[
        "exec", "--rootfs", "bb", "--name", &name, "--memory", "48m", "--pids", "30", "--",
        "sh", "-c", "head -c 200m /dev/zero | tail >/dev/null; echo rc=$?; sh -c 'for i in $(seq 40); do sleep 3 & done' 2>/dev/null; echo forks=$?",
    ]);
    assert!(out.contains("rc=137"), "the allocation over 48m was not killed: {out}");
    assert!(out.contains("forks=2"), "40 forks under --pids 30 did not fail: {out}");
    // The cgroup was below the user's delegated dir while the job ran, and is gone now.
    let name2 = unique("rl-cg");
    let mut job = start_waiting(&h, &["--name", &name2, "--pids", "25"], "true");
    let dirs = cgroup_dirs_of(&name2);
    assert!(!dirs.is_empty(), "no cgroup for the running job");
    for d in &dirs {
        assert!(d.to_string_lossy().contains(&format!("azp-sandbox/user-{}/", user().uid)), "{}", d.display());
    }
    let max = fs::read_to_string(pids_current(&name2).unwrap().with_file_name("pids.max")).unwrap();
    assert_eq!(max.trim(), "25");
    job.kill().unwrap();
    job.wait().unwrap();
    h.ok(&["gc"]);
    h.assert_no_residue(&[&name, &name2]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: runs azp-sandbox as the rootless test user (scripts/test.sh)")]
fn without_delegation_limits_are_not_enforced_and_say_so_loudly() {
    require_rootless!();
    let h = TestHome::with_busybox("rl-nodeleg");
    let parent = format!("/azp-sandbox/not-delegated-{}", std::process::id());
    let o =
        h.run(&["--cgroup-parent", &parent, "exec", "--rootfs", "bb", "--memory", "32m", "--", "sh", "-c", "exit 7"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(7), "{err}");
    let warning: Vec<&str> = err.lines().filter(|l| l.contains("NOT enforced")).collect();
    assert_eq!(warning.len(), 1, "{err}");
    assert!(
        warning[0].contains("WARNING: memory/pids/cpu limits are NOT enforced")
            && warning[0].contains("delegate-cgroups.sh"),
        "{err}"
    );
    // Without a cgroup to kill, a job whose exec and helper are SIGKILLed still dies with
    // them: its init's lifeline (the helper's end of it closes), then gc clears the rest.
    let marker = unique("rl-orphan-marker");
    let name = unique("rl-orphan");
    let mut job = start_waiting(
        &h,
        &["--cgroup-parent", &parent, "--name", &name],
        &format!("sh -c 'sleep 1000; echo {marker}' &"),
    );
    let job_procs = processes_matching(&marker);
    assert!(!job_procs.is_empty(), "the job's process is visible on the host");
    // The helper is exec's child (forked, or re-executed by a threaded runner).
    let helpers = children_of(job.id() as i32);
    assert_eq!(helpers.len(), 1, "one helper for the job");
    job.kill().unwrap();
    job.wait().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(helpers[0]), nix::sys::signal::SIGKILL).unwrap();
    let killed = std::time::Instant::now();
    wait_until("the job to die with its helper", Duration::from_secs(10), || processes_matching(&marker).is_empty());
    assert!(killed.elapsed() < Duration::from_secs(2), "the job outlived its helper by {:?}", killed.elapsed());
    let gc = h.run(&["gc"]);
    assert!(gc.status.success(), "{}", String::from_utf8_lossy(&gc.stderr));
    h.assert_no_residue(&[&name]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: runs azp-sandbox as the rootless test user (scripts/test.sh)")]
fn home_defaults_to_xdg_data_home() {
    require_rootless!();
    let u = user();
    let xdg = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("rl-xdg-{}", std::process::id()));
    let _ = fs::remove_dir_all(&xdg);
    fs::create_dir_all(&xdg).unwrap();
    nix::unistd::chown(&xdg, Some(u.uid), Some(u.gid)).unwrap();
    let mut c = Command::new(bin());
    as_test_user(&mut c);
    let o = c
        .env_remove("AZP_SANDBOX_HOME")
        .env("XDG_DATA_HOME", &xdg)
        .args(["rootfs", "import", busybox_tar().to_str().unwrap(), "--name", "bb"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(xdg.join("azp-sandbox/rootfs/bb/tree/bin/busybox").is_file());
    fs::remove_dir_all(&xdg).unwrap();
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: runs azp-sandbox as the rootless test user (scripts/test.sh)")]
fn a_user_without_subordinate_ids_gets_a_one_line_fix() {
    require_rootless!();
    // nobody has no /etc/subuid entry.
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("rl-nobody-{}", std::process::id()));
    fs::create_dir_all(&home).unwrap();
    nix::unistd::chown(&home, Some(65534.into()), Some(65534.into())).unwrap();
    let o = Command::new(bin())
        .uid(65534)
        .gid(65534)
        .arg("--home")
        .arg(&home)
        .args(["exec", "--rootfs", "bb", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("rootless mode needs subordinate ids for nobody") && err.contains("usermod --add-subuids"),
        "{err}"
    );
    fs::remove_dir_all(&home).unwrap();
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: runs azp-sandbox as the rootless test user (scripts/test.sh)")]
fn the_agent_runner_without_delegation_warns_at_start_and_in_status() {
    require_rootless!();
    let lab = or_skip!(common::netlab::NetLab::new());
    let fake = FakeAzure::start_in(&lab);
    let h = TestHome::with_busybox("rl-run-warn");
    let tf = token_file(&h, &fake.pat());
    as_test_user_owns(&tf);
    let parent = format!("/azp-sandbox/not-delegated-{}", std::process::id());
    let mut cmd = h.lab_command(&lab);
    cmd.args([
        "--cgroup-parent",
        &parent,
        "run",
        "--pool",
        "gpu",
        "--url",
        &fake.url(),
        "--token-file",
        tf.to_str().unwrap(),
    ])
    .args(["--agents", "1", "--gpus-per-agent", "none", "--rootfs", "bb", "--name-prefix", "rlw"]);
    let mgr = ManagerProc::spawn(cmd, h.dir.join("manager.log"));
    fake.enqueue_job("id -u; echo done");
    let results = fake.wait_results(1, Duration::from_secs(60));
    assert_eq!(results.len(), 1, "{}", mgr.log());
    assert!(results[0].output.contains("done"), "{results:?}");
    let warned: Vec<String> = mgr.log().lines().filter(|l| l.contains("NOT enforced")).map(String::from).collect();
    assert_eq!(warned.len(), 1, "one loud line at start: {}", mgr.log());
    let status = String::from_utf8_lossy(&h.run(&["status"]).stdout).into_owned();
    assert!(
        status.contains("WARNING: memory/pids/cpu limits are NOT enforced for jobs")
            && status.contains("delegate-cgroups.sh"),
        "{status}"
    );
    let json: serde_json::Value = serde_json::from_slice(&h.run(&["status", "--json"]).stdout).unwrap();
    assert_eq!(json["limits_enforced"], false);
    let st = mgr.stop();
    assert!(st.success(), "{st}");
    h.assert_no_residue(&[]);
}

/// The token file must be readable by the user running the manager.
fn as_test_user_owns(p: &Path) {
    let u = user();
    nix::unistd::chown(p, Some(u.uid), Some(u.gid)).unwrap();
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: runs azp-sandbox as the rootless test user (scripts/test.sh)")]
fn a_store_from_before_jobs_had_ids_of_their_own_is_refused_with_one_line() {
    require_rootless!();
    let h = TestHome::with_busybox("rl-oldstore");
    // A rootfs as an older azp-sandbox imported it: unshifted (no id_shift in meta.json).
    let meta_path = h.dir.join("rootfs/bb/meta.json");
    let mut meta: serde_json::Value = serde_json::from_str(&fs::read_to_string(&meta_path).unwrap()).unwrap();
    assert_eq!(meta["id_shift"], 1, "a rootless import is shifted by one: {meta}");
    meta.as_object_mut().unwrap().remove("id_shift");
    fs::write(&meta_path, meta.to_string()).unwrap();
    let o = h.run(&["exec", "--rootfs", "bb", "--", "true"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("rootfs 'bb' was imported with its ids shifted by 0") && err.contains("re-import"), "{err}");
    // Re-imported, it runs.
    h.ok(&["rootfs", "rm", "bb"]);
    h.import(&busybox_tar(), "bb");
    h.ok(&["exec", "--rootfs", "bb", "--", "true"]);
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: runs azp-sandbox as the rootless test user (scripts/test.sh)")]
fn a_home_below_a_private_dir_mounts_jobs_in_tmp_and_a_foreign_dir_there_is_refused() {
    require_rootless!();
    let u = user();
    // ~/.local is often 0700: the jobs' ids (subordinate ones) cannot search it, so their
    // mount point cannot be in such a home.
    let private = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("rl-private-{}", std::process::id()));
    let _ = fs::remove_dir_all(&private);
    fs::create_dir_all(&private).unwrap();
    nix::unistd::chown(&private, Some(u.uid), Some(u.gid)).unwrap();
    fs::set_permissions(&private, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let home = private.join("home");
    let run = |args: &[&str]| {
        let mut c = Command::new(bin());
        as_test_user(&mut c);
        c.arg("--home").arg(&home).args(args).output().unwrap()
    };
    let o = run(&["rootfs", "import", busybox_tar().to_str().unwrap(), "--name", "bb"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let tmp_point = PathBuf::from(format!("/tmp/azp-sandbox-{}", u.uid));
    let foreign = !tmp_point.exists();
    if foreign {
        // Someone else's dir (or a symlink) there is refused, one line, nothing run.
        fs::create_dir(&tmp_point).unwrap();
        let o = run(&["exec", "--rootfs", "bb", "--", "true"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{err}");
        assert!(err.contains(&format!("{} is not a dir of this user's", tmp_point.display())), "{err}");
        fs::remove_dir(&tmp_point).unwrap();
    } else {
        skip_part(format!("{} already exists: the refusal of a foreign one is not tried", tmp_point.display()));
    }
    let o = run(&["exec", "--rootfs", "bb", "--", "sh", "-c", "id -u; cat /etc/passwd | head -1"]);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert_eq!(out, "0\nroot:x:0:0:root:/root:/bin/sh\n");
    let m = fs::symlink_metadata(&tmp_point).unwrap();
    assert_eq!((m.is_dir(), m.uid()), (true, u.uid.as_raw()), "made by the user");
    fs::remove_dir_all(&private).unwrap();
    // Only this test's homes use it (the others' are searchable): gone, so that the next
    // run tries the refusal again.
    fs::remove_dir(&tmp_point).unwrap();
}

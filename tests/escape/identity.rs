//! Issue 19, a job is nobody on the host: its processes never have host uid 0 or a real
//! account's uid, nor a group they were not given, and the seccomp filter denies the
//! socket families and calls Docker's default profile denies, and more. Root and
//! rootless, like the rest of the suite (SECURITY.md, "Identity").

use super::*;

/// Runs the probe on the host (as root), for the tokens whose host result tells whether
/// an attempt inside proves the filter (a family the host kernel lacks fails the same
/// way with or without it).
fn host_probe(tokens: &[&str]) -> String {
    let o = Command::new(probe_bin()).args(tokens).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

// ---------------------------------------------------------------------------------------
// 22. Socket families, socketcall, personality, memfd_secret
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t22_seccomp_denies_vsock_alg_socketcall_personality_and_memfd_secret() {
    require_root!();
    let h = home("sockets");
    let (vsock, alg) = (libc::AF_VSOCK, libc::AF_ALG);
    // On the host: which families exist, and whether 32-bit calls (int 0x80) work at all.
    let host = host_probe(&[&format!("socket:{vsock}:1"), &format!("socket:{alg}:5"), "socket-i386:2:1"]);
    let host_has = |tok: &str| host.lines().any(|l| l == format!("{tok}: OK"));
    let i386 = host_has("socket-i386:2:1");
    let mut denied: Vec<(String, &str)> = vec![
        (format!("socket:{vsock}:1"), "EAFNOSUPPORT"),
        (format!("socket-hi:{vsock}:1"), "EAFNOSUPPORT"),
        (format!("socket:{alg}:5"), "EAFNOSUPPORT"),
        (format!("socket-hi:{alg}:5"), "EAFNOSUPPORT"),
        ("socket:21:5".into(), "EAFNOSUPPORT"), // RDS
        ("socket:30:2".into(), "EAFNOSUPPORT"), // TIPC
        ("memfd-secret".into(), "EPERM"),
        ("personality:400000".into(), "EPERM"), // READ_IMPLIES_EXEC
        ("personality:40000".into(), "EPERM"),  // ADDR_NO_RANDOMIZE
        ("personality:100008".into(), "EPERM"), // MMAP_PAGE_ZERO | PER_LINUX32
        ("personality:80400000".into(), "EPERM"),
    ];
    let mut allowed: Vec<String> =
        toks(&["socket:1:1", "socket:2:1", "socket:10:2", "socket:16:3", "memfd-create", "personality:ffffffff"]);
    if i386 {
        denied.extend([
            ("socketcall:2:1".into(), "EPERM"),
            (format!("socketcall:{vsock}:1"), "EPERM"),
            (format!("socket-i386:{vsock}:1"), "EAFNOSUPPORT"),
        ]);
        allowed.push("socket-i386:2:1".into());
    } else {
        skip_part("the host kernel runs no 32-bit x86 calls (int 0x80): socketcall and the i386 socket(2) not tried");
    }
    if !host_has(&format!("socket:{vsock}:1")) {
        skip_part("the host has no AF_VSOCK: its denial inside proves nothing here");
    }
    if !host_has(&format!("socket:{alg}:5")) {
        skip_part("the host kernel has no AF_ALG (CONFIG_CRYPTO_USER_API): EAFNOSUPPORT inside proves nothing here");
    }
    let tokens: Vec<String> = denied.iter().map(|(t, _)| t.clone()).chain(allowed.iter().cloned()).collect();
    for (who, user) in USERS {
        for net in ["host", "none"] {
            let out = exec_ok(&h, &[user, &["--network", net]].concat(), &probe(&tokens));
            let want: String = denied
                .iter()
                .map(|(t, e)| format!("{t}: {e}\n"))
                .chain(allowed.iter().map(|t| format!("{t}: OK\n")))
                .collect();
            assert_eq!(out, want, "as {who}, --network {net}");
        }
    }
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t66_a_job_cannot_listen_to_the_hosts_device_events() {
    require_root!();
    // The kernel sends its device events (uevents: hotplug, block devices, GPUs, modules)
    // to every network namespace the host's user namespace owns, as a root-mode job's is:
    // a red-team pass read the host's `change@/devices/virtual/mem/null` from a job's
    // NETLINK_KOBJECT_UEVENT socket. Jobs may not open one now (EPROTONOSUPPORT, what a
    // kernel without it says); routing and socket-diagnostics netlink stay.
    let uevent = "netlink:15";
    if host_probe(&[uevent]) != format!("{uevent}: OK\n") {
        return skip("the host opens no uevent socket: a refusal inside proves nothing");
    }
    let h = home("uevents");
    let tokens = toks(&[uevent, "netlink:0", "netlink:4"]);
    let want = "netlink:15: EPROTONOSUPPORT\nnetlink:0: OK\nnetlink:4: OK\n";
    for (who, user) in USERS {
        for net in ["isolated", "none", "host"] {
            let out = exec_ok(&h, &[user, &["--network", net]].concat(), &probe(&tokens));
            assert_eq!(out, want, "as {who}, --network {net}");
        }
    }
    h.assert_no_residue(&[]);
}

// ---------------------------------------------------------------------------------------
// Helpers: the job's processes as the host sees them
// ---------------------------------------------------------------------------------------

/// `/proc/<pid>/status` of every process of the job (or jobs) one of whose processes has
/// `marker` in its command line: every process in that process's pid namespace (a job's
/// own, below the host's: `NSpid` has two numbers or more, which leaves out `exec` and its
/// helper, whose command lines may hold the marker too).
pub(super) fn job_statuses(marker: &str) -> Vec<(i32, String)> {
    let status = |pid: i32| fs::read_to_string(format!("/proc/{pid}/status")).ok();
    let pidns = |pid: i32| fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let nested = |st: &str| st.lines().any(|l| l.starts_with("NSpid:") && l.split_whitespace().count() > 2);
    let namespaces: Vec<PathBuf> = processes_matching(marker)
        .into_iter()
        .filter(|(pid, _)| status(*pid).is_some_and(|st| nested(&st)))
        .filter_map(|(pid, _)| pidns(pid))
        .collect();
    if namespaces.is_empty() {
        return vec![];
    }
    let all = fs::read_dir("/proc").unwrap().flatten().filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok());
    all.filter(|&pid| pidns(pid).is_some_and(|ns| namespaces.contains(&ns)))
        .filter_map(|pid| Some((pid, status(pid)?)))
        .collect()
}

/// The numbers of a status line (`Uid:`, `Gid:`, `Groups:`).
pub(super) fn ids(status: &str, key: &str) -> Vec<u32> {
    let line = status.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key} in {status}"));
    line[key.len()..].split_whitespace().map(|v| v.parse().unwrap()).collect()
}

/// azp-sandbox (`--home` of `h`) started by a caller that has the supplementary groups
/// `groups`: root, or the rootless test user (std's `Command::uid` would drop them).
fn command_with_groups(h: &TestHome, groups: &str) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--groups", groups]);
    if let Some(u) = test_user() {
        c.args(["--reuid", &u.uid.to_string(), "--regid", &u.gid.to_string()])
            .env("HOME", &u.dir)
            .env("USER", &u.name)
            .env("LOGNAME", &u.name)
            .env_remove("XDG_RUNTIME_DIR");
    }
    c.arg("--").arg(bin()).arg("--home").arg(&h.dir).stdin(Stdio::null());
    in_machine_namespace(&mut c);
    c
}

// ---------------------------------------------------------------------------------------
// 21. Supplementary groups
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t21_a_job_has_no_supplementary_groups_even_when_its_caller_has_root_and_others() {
    require_root!();
    let h = home("groups");
    // root (0), disk (6), video (44): the `su -` and `setpriv --groups 6,44` cases.
    let caller = "0,6,44";
    let mut check = Command::new("setpriv");
    check.args(["--groups", caller, "--", "sh", "-c", "grep Groups /proc/self/status"]);
    let o = check.output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).split_whitespace().collect::<Vec<_>>(), ["Groups:", "0", "6", "44"]);
    for (who, user) in USERS {
        let marker = unique("grp");
        let job = WaitingJob::start_as(
            &h,
            command_with_groups(&h, caller),
            &[],
            user,
            &format!("echo {marker} >/dev/null; id -G; probe groups"),
        );
        let procs = job_statuses(&marker);
        assert!(!procs.is_empty(), "as {who}: no job process found");
        for (pid, st) in &procs {
            assert_eq!(ids(st, "Groups:"), Vec::<u32>::new(), "as {who}: pid {pid}:\n{st}");
        }
        let gid = if who == "root" { "0" } else { "1000" };
        assert_eq!(job.before, format!("{gid}\ngroups:\n"), "as {who}: the job's own view");
        assert!(job.finish().success(), "as {who}");
    }
    h.assert_no_residue(&[]);
}

// ---------------------------------------------------------------------------------------
// 20. Host ids of a job's processes
// ---------------------------------------------------------------------------------------

/// The ids of `file` (`/etc/passwd`, `/etc/group`): the third field of each line.
fn account_ids(file: &str) -> Vec<u32> {
    fs::read_to_string(file).unwrap().lines().filter_map(|l| l.split(':').nth(2)?.parse().ok()).collect()
}

/// `(start, count)` of `owner`'s entry in a subuid/subgid file.
fn subid_range(file: &str, owner: &str) -> (u32, u32) {
    let text = fs::read_to_string(file).unwrap();
    let f = text.lines().map(|l| l.split(':').collect::<Vec<_>>()).find(|f| f.len() == 3 && f[0] == owner);
    let f = f.unwrap_or_else(|| panic!("no {owner} entry in {file}: run scripts/setup.sh"));
    (f[1].parse().unwrap(), f[2].parse().unwrap())
}

/// Where a job's host ids must lie: root mode, the azp-sandbox range; rootless, the test
/// user's subordinate ids (the user's own uid is no job's).
fn job_id_ranges() -> ((u32, u32), (u32, u32)) {
    match test_user() {
        None => (subid_range("/etc/subuid", "azp-sandbox"), subid_range("/etc/subgid", "azp-sandbox")),
        Some(u) => (subid_range("/etc/subuid", &u.name), subid_range("/etc/subgid", &u.name)),
    }
}

/// Asserts that every process of the job (by `marker`) is nobody on the host: each of its
/// uids and gids (real, effective, saved, filesystem) inside the range for jobs, none 0,
/// none an account's or group's, and no supplementary group. Returns the processes'
/// (uid, gid) as the host sees them (all of one job run as one user).
fn assert_nobody_on_the_host(what: &str, marker: &str) -> (u32, u32) {
    let procs = job_statuses(marker);
    assert!(!procs.is_empty(), "{what}: no process of the job found");
    let ((us, uc), (gs, gc)) = job_id_ranges();
    let (accounts, groups) = (account_ids("/etc/passwd"), account_ids("/etc/group"));
    let mut seen = vec![];
    for (pid, st) in &procs {
        let (uids, gids) = (ids(st, "Uid:"), ids(st, "Gid:"));
        for &u in &uids {
            assert!(u != 0 && !accounts.contains(&u), "{what}: pid {pid} has host uid {u}:\n{st}");
            assert!(u >= us && (u as u64) < us as u64 + uc as u64, "{what}: pid {pid}: uid {u} outside {us}+{uc}");
        }
        for &g in &gids {
            assert!(g != 0 && !groups.contains(&g), "{what}: pid {pid} has host gid {g}:\n{st}");
            assert!(g >= gs && (g as u64) < gs as u64 + gc as u64, "{what}: pid {pid}: gid {g} outside {gs}+{gc}");
        }
        assert_eq!(ids(st, "Groups:"), Vec::<u32>::new(), "{what}: pid {pid}");
        seen.push((uids[0], gids[0]));
    }
    seen.dedup();
    assert_eq!(seen.len(), 1, "{what}: one user per job here: {seen:?}");
    seen[0]
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t20_exec_jobs_are_nobody_on_the_host_and_concurrent_ones_differ_as_root() {
    require_root!();
    let h = home("ids");
    let start = |opts: &[&str]| {
        let marker = unique("ids");
        let job = WaitingJob::start(
            &h,
            &[],
            opts,
            &format!(": {marker}; id -u; id -g; touch /home/azp/w && echo home-writable"),
        );
        (job, marker)
    };
    // Default root, --user 0 and --user 1000, all at once: three live jobs.
    let (root, m_root) = start(&[]);
    let (zero, m_zero) = start(&["--user", "0"]);
    let (azp, m_azp) = start(&["--user", "1000:1000"]);
    // Inside, the ids the job asked for ("exec --user behaves as before").
    assert_eq!(root.before, "0\n0\nhome-writable\n");
    assert_eq!(zero.before, "0\n0\nhome-writable\n");
    assert_eq!(azp.before, "1000\n1000\nhome-writable\n", "the rootfs's azp owns /home/azp");
    let r = assert_nobody_on_the_host("exec as root", &m_root);
    let z = assert_nobody_on_the_host("exec --user 0", &m_zero);
    let a = assert_nobody_on_the_host("exec --user 1000", &m_azp);
    if rootless() {
        // One shared rootfs, no idmapped mounts for a user: every job of the user has the
        // same ids (SECURITY.md).
        assert_eq!((r, z), (r, r), "rootless jobs share the user's subordinate ids");
        assert_eq!(a, (r.0 + 1000, r.1 + 1000));
    } else {
        // Each job its own block: no two live jobs share a host uid.
        assert_ne!(r.0, z.0, "two concurrent jobs got the same host uid");
        for (x, y) in [(r, a), (z, a)] {
            assert_ne!(x.0 / 65536, y.0 / 65536, "concurrent jobs {x:?} and {y:?} share a block");
        }
        assert_eq!(a.0 % 65536, r.0 % 65536 + 1000, "uid 1000 at the same offset of its block");
    }
    for job in [root, zero, azp] {
        assert!(job.finish().success());
    }
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t20b_agent_jobs_are_nobody_on_the_host_and_two_slots_differ_as_root() {
    require_root!();
    // The jobs reach the fake Azure DevOps in the network lab's fake internet.
    let lab = or_skip!(common::netlab::NetLab::new());
    let fake = common::fake_azure::FakeAzure::start_in(&lab);
    let h = TestHome::with_busybox("esc-agent-ids");
    give_to_test_user(&h.dir);
    let tf = h.dir.join("pat");
    fs::write(&tf, format!("{}\n", fake.pat())).unwrap();
    give_to_test_user(&tf);
    let (m1, m2) = (unique("agent-ids"), unique("agent-ids"));
    let ctl = h.dir.join("ctl");
    fs::create_dir_all(&ctl).unwrap();
    for m in [&m1, &m2] {
        fake.enqueue_job(&format!("sh -c 'while [ ! -e /ctl/go ]; do sleep 0.1; done' {m}\n"));
    }
    let mut cmd = h.lab_command(&lab);
    cmd.args(["run", "--pool", "gpu", "--url", &fake.url(), "--token-file", tf.to_str().unwrap()])
        .args(["--agents", "2", "--gpus-per-agent", "none", "--rootfs", "bb", "--name-prefix", "escids"])
        .args(["--volume", &format!("{}:/ctl", ctl.display())]);
    let mgr = ManagerProc::spawn(cmd, h.dir.join("manager.log"));
    wait_until("both agent jobs to run", Duration::from_secs(120), || {
        !job_statuses(&m1).is_empty() && !job_statuses(&m2).is_empty()
    });
    // Every process of each sandbox: the agent (run.sh, Agent.Listener) and its job.
    let a = assert_nobody_on_the_host("agent job 1", &m1);
    let b = assert_nobody_on_the_host("agent job 2", &m2);
    assert!(job_statuses(&m1).len() >= 3, "the agent's processes are counted too: {:?}", job_statuses(&m1));
    if rootless() {
        assert_eq!(a, b, "rootless slots share the user's subordinate ids (SECURITY.md)");
    } else {
        assert_ne!(a.0, b.0, "two slots' jobs have the same host uid {}", a.0);
    }
    fs::write(ctl.join("go"), "").unwrap();
    let results = fake.wait_results(2, Duration::from_secs(60));
    assert_eq!(results.len(), 2, "{}", mgr.log());
    let log = mgr.log();
    let st = mgr.stop();
    assert!(st.success(), "{st}: {log}");
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t20c_userns_host_is_the_loud_opt_out_of_root_mode_only() {
    require_root!();
    let h = home("userns-host");
    let o =
        h.command().args(["exec", "--rootfs", "esc", "--userns", "host", "--", "cat", "/proc/self/uid_map"]).output();
    let o = o.unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    if rootless() {
        assert_eq!(o.status.code(), Some(125), "{out}{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains("--userns host is for root mode only"), "{err}");
    } else {
        assert!(o.status.success(), "{err}");
        assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["0", "0", "4294967295"], "host ids: {out}");
        assert!(err.contains("WARNING: --userns host: jobs run with host ids"), "said loudly: {err}");
    }
    h.assert_no_residue(&[]);
}

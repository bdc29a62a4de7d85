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

// ---------------------------------------------------------------------------------------
// Helpers: the job's processes as the host sees them
// ---------------------------------------------------------------------------------------

/// `/proc/<pid>/status` of every process of a job whose command line contains `marker`:
/// those in a pid namespace below the host's (NSpid has two numbers or more), which
/// leaves out `exec` and its helper (whose command lines may contain it too).
pub(super) fn job_statuses(marker: &str) -> Vec<(i32, String)> {
    processes_matching(marker)
        .into_iter()
        .filter_map(|(pid, _)| {
            let st = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let nspid = st.lines().find(|l| l.starts_with("NSpid:"))?;
            (nspid.split_whitespace().count() > 2).then_some((pid, st))
        })
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
    c.arg("--").arg(bin()).arg("--home").arg(&h.dir).env_remove("AZP_SANDBOX_HOME").stdin(Stdio::null());
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

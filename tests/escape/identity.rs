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

//! `azp-sandbox check` and `run --check` on a good and on a broken setup, `run` doing its
//! local checks before the network, one manager per home, and `status` with nothing
//! running. The fake Azure DevOps runs in the network lab's fake internet, `check` and
//! `run` in its fake host, as in tests/agent_runner.rs.

mod common;
use common::fake_azure::FakeAzure;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// The fake agent package as a file (`--agent-package`), and a 0600 token file.
fn package_and_token(h: &TestHome, fake: &FakeAzure) -> (PathBuf, PathBuf) {
    let pkg = h.dir.join("agent.tar.gz");
    std::fs::write(&pkg, FakeAzure::agent_package_targz()).unwrap();
    let tf = token_file(h, &fake.pat());
    std::fs::set_permissions(&tf, std::fs::Permissions::from_mode(0o600)).unwrap();
    if let Some(u) = test_user() {
        for f in [&pkg, &tf] {
            nix::unistd::chown(f, Some(u.uid), Some(u.gid)).unwrap();
        }
    }
    (pkg, tf)
}

/// The line of `what` in check's output.
fn line<'a>(out: &'a str, what: &str) -> &'a str {
    out.lines()
        .find(|l| l.get(6..).is_some_and(|r| r.starts_with(what)))
        .unwrap_or_else(|| panic!("no {what} line:\n{out}"))
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: the network lab (scripts/test.sh runs the suite as root)")]
fn check_passes_a_good_setup_and_names_each_broken_item() {
    require_root!();
    let lab = or_skip!(netlab::NetLab::new());
    let fake = FakeAzure::start_in(&lab);
    let h = TestHome::with_busybox("check-good");
    let (pkg, tf) = package_and_token(&h, &fake);
    let good = |verb: &[&str]| {
        h.lab_command(&lab)
            .args(verb)
            .args(["--pool", "gpu", "--url", &fake.url(), "--token-file", tf.to_str().unwrap()])
            .args(["--agents", "1", "--gpus-per-agent", "none", "--rootfs", "bb", "--name-prefix", "chk"])
            .arg("--agent-package")
            .arg(&pkg)
            .output()
            .unwrap()
    };
    let o = good(&["check"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    for what in ["settings", "token", "network", "gpus", "rootfs", "agent", "azure", "pool", "permission"] {
        assert!(line(&out, what).starts_with("OK "), "{what}:\n{out}");
    }
    assert!(!out.contains("FAIL") && out.lines().last().unwrap().starts_with("ready: "), "{out}");
    assert!(fake.agents().is_empty(), "check registers nothing: {:?}", fake.agents());

    // `run --check` is the same report, and starts nothing.
    let o = good(&["run", "--check"]);
    let (out2, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out2}\n{err}");
    assert!(line(&out2, "permission").starts_with("OK "), "{out2}");
    assert!(fake.agents().is_empty() && !h.dir.join("status.json").exists(), "run --check started a manager");

    // Broken: a config key typo and a bad [setuid] key, a token file others may read, an
    // unknown rootfs, a missing dataset, an unknown pool. Each on its own line.
    let cfg = h.dir.join("config.toml");
    std::fs::write(&cfg, "pool = \"nosuchpool\"\ngpus_per_agnet = 1\n[setuid]\nuser = [\"x\"]\n").unwrap();
    std::fs::set_permissions(&tf, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = h
        .lab_command(&lab)
        .args(["check", "--config", cfg.to_str().unwrap(), "--url", &fake.url(), "--token-file", tf.to_str().unwrap()])
        .args(["--agents", "1", "--rootfs", "nosuch", "--volume", "/nonexistent-check-data:/data"])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    let fail = |what: &str, says: &str| {
        let l = line(&out, what);
        assert!(l.starts_with("FAIL") && l.contains(says), "{what} should FAIL with {says:?}:\n{out}");
    };
    fail("config", "unknown key `gpus_per_agnet`: did you mean `gpus_per_agent`?");
    fail("setuid", "unknown key `user` in [setuid]: did you mean `users`?");
    fail("rootfs", "'nosuch'");
    fail("volume", "/nonexistent-check-data");
    fail("pool", "nosuchpool");
    let token = line(&out, "token");
    assert!(token.starts_with("WARN") && token.contains("mode 0644") && token.contains("chmod 600"), "{out}");
    assert!(line(&out, "azure").starts_with("OK "), "the server itself is fine:\n{out}");
    assert!(out.lines().last().unwrap().starts_with("NOT READY: "), "{out}");
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: imports a rootfs and runs `run` (scripts/test.sh runs as root)")]
fn run_reports_a_local_mistake_before_touching_the_network() {
    require_root!();
    let h = TestHome::with_busybox("check-local");
    let tf = token_file(&h, "pat");
    std::fs::set_permissions(&tf, std::fs::Permissions::from_mode(0o600)).unwrap();
    if let Some(u) = test_user() {
        nix::unistd::chown(&tf, Some(u.uid), Some(u.gid)).unwrap();
    }
    // Nothing listens on port 9 of loopback: the server part could only say "cannot reach".
    let run = |rootfs: &str| {
        h.command()
            .args(["run", "--pool", "p", "--url", "http://127.0.0.1:9", "--token-file", tf.to_str().unwrap()])
            .args(["--agents", "1", "--network", "none", "--rootfs", rootfs])
            .output()
            .unwrap()
    };
    let o = run("nosuch");
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("unknown rootfs 'nosuch'") && !err.contains("cannot reach"), "{err}");
    // With the rootfs right, the same run gets as far as the server.
    let o = run("bb");
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("cannot reach http://127.0.0.1:9"), "{err}");
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: the network lab and real sandboxes (scripts/test.sh)")]
fn a_second_run_on_the_same_home_is_refused_naming_the_first() {
    require_root!();
    let lab = or_skip!(netlab::NetLab::new());
    let fake = FakeAzure::start_in(&lab);
    let h = TestHome::with_busybox("check-lock");
    let (pkg, tf) = package_and_token(&h, &fake);
    let run = |prefix: &str| {
        let mut c = h.lab_command(&lab);
        c.args(["run", "--pool", "gpu", "--url", &fake.url(), "--token-file", tf.to_str().unwrap()])
            .args(["--agents", "1", "--gpus-per-agent", "none", "--rootfs", "bb", "--name-prefix", prefix])
            .arg("--agent-package")
            .arg(&pkg);
        c
    };
    let first = ManagerProc::spawn(run("lock-a"), h.dir.join("manager.log"));
    // Past its start-up checks and serving: its agent is online.
    wait_until("the first run's agent online", Duration::from_secs(90), || {
        fake.agent("lock-a-0").is_some_and(|a| a.status == "online")
    });
    let pid: u32 = std::fs::read_to_string(h.dir.join("run.lock")).unwrap().trim().parse().unwrap();
    let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(cmdline.contains("azp-sandbox") && cmdline.contains("lock-a"), "the lock names the first run: {cmdline:?}");

    let o = run("lock-b").output().unwrap();
    let (_, err) = text(&o);
    assert!(!o.status.success(), "{err}");
    let want = format!("another `azp-sandbox run` (pid {pid}) already runs with the home {}", h.dir.display());
    assert!(err.contains(&want), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.to_lowercase().contains("error")).collect();
    assert!(errors.len() == 1 && errors[0].contains(&want), "one line:\n{err}");
    assert!(fake.agent("lock-b-0").is_none(), "the second run registered nothing");

    let o = h.command().args(["status", "--json"]).output().unwrap();
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap()["running"], true, "{out}");
    let st = first.stop();
    assert!(st.success(), "{st}");
    // The lock went with the first run: status says it is not running (rc 3).
    let o = h.command().args(["status"]).output().unwrap();
    assert_eq!(o.status.code(), Some(3), "{:?}", text(&o));
}

#[test]
fn status_with_nothing_running_says_so_with_rc_3() {
    let h = TestHome::new("check-status");
    let o = h.command().args(["status"]).output().unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{out}{err}");
    assert!(out.starts_with("not running"), "{out}");
    let o = h.command().args(["status", "--json"]).output().unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{out}{err}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap(), serde_json::json!({"running": false}));
}

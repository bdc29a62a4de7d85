//! Setuid mode (issue 6): the binary installed setuid-root, run by an ordinary user under
//! a root-owned site policy in /etc/azp-sandbox/config.toml.
//!
//! Needs root (to install the setuid copy and write the policy) and an ordinary user:
//! `AZP_SANDBOX_TEST_USER`, else `azp-rootless` (scripts/setup.sh creates it). The tests
//! share the one policy file, so they run one at a time (a lock), and put back whatever
//! was there before.

mod common;
use common::fake_azure::FakeAzure;
use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};

const POLICY: &str = "/etc/azp-sandbox/config.toml";
static LOCK: Mutex<()> = Mutex::new(());

fn user() -> Option<nix::unistd::User> {
    test_user().or_else(|| nix::unistd::User::from_name("azp-rootless").ok().flatten())
}

/// One setuid install: a root-owned 04755 copy of the binary, a site home with the
/// busybox rootfs as `bb`, a dataset dir, and the policy (restored on drop).
struct Site {
    dir: PathBuf,
    user: nix::unistd::User,
    saved: Option<Vec<u8>>,
    _lock: MutexGuard<'static, ()>,
}

impl Site {
    /// The site, or why it cannot be made here (for `or_skip!`).
    fn new(name: &str) -> Result<Site, String> {
        if !is_root() {
            return Err("needs root: installs a setuid binary and a site policy (CI runs the suite as root)".into());
        }
        let Some(user) = user() else {
            return Err("no ordinary test user (run scripts/setup.sh, which creates azp-rootless)".into());
        };
        let lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        // /var/tmp: every user can reach it (a checkout under /root could not be).
        let dir = PathBuf::from(format!("/var/tmp/azp-sandbox-setuid-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("data/sub")).unwrap();
        fs::write(dir.join("data/sub/f"), "hello\n").unwrap();
        std::os::unix::fs::symlink("/etc", dir.join("data/etclink")).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let st = Command::new("install")
            .args(["-o", "root", "-g", "root", "-m", "4755"])
            .arg(bin())
            .arg(dir.join("azp-sandbox"))
            .status()
            .unwrap();
        assert!(st.success());
        let out = Command::new(bin())
            .arg("--home")
            .arg(dir.join("home"))
            .args(["rootfs", "import"])
            .arg(busybox_tar())
            .args(["--name", "bb"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        fs::create_dir_all("/etc/azp-sandbox").unwrap();
        let saved = fs::read(POLICY).ok();
        let site = Site { dir, user, saved, _lock: lock };
        site.policy(&site.default_policy());
        Ok(site)
    }

    fn default_policy(&self) -> String {
        format!(
            "[setuid]\nusers = [\"{}\"]\nrootfs = [\"bb\"]\nvolumes = [\"{}\"]\nmax_memory = \"64m\"\nmax_pids = 50\nhome = \"{}\"\n",
            self.user.name,
            self.dir.join("data").display(),
            self.dir.join("home").display()
        )
    }

    fn policy(&self, text: &str) {
        fs::write(POLICY, text).unwrap();
        nix::unistd::chown(POLICY, Some(0.into()), Some(0.into())).unwrap();
        fs::set_permissions(POLICY, fs::Permissions::from_mode(0o644)).unwrap();
    }

    /// The setuid binary run as the test user (or `as_uid`), with a user environment.
    fn cmd(&self, as_uid: Option<u32>) -> Command {
        let mut c = Command::new(self.dir.join("azp-sandbox"));
        let (uid, gid) = as_uid.map(|u| (u, u)).unwrap_or((self.user.uid.as_raw(), self.user.gid.as_raw()));
        c.uid(uid).gid(gid).current_dir("/").env("HOME", &self.user.dir).stdin(Stdio::null());
        c
    }

    fn exec(&self, opts: &[&str], script: &str) -> Output {
        self.cmd(None).args(["exec", "--rootfs", "bb"]).args(opts).args(["--", "sh", "-c", script]).output().unwrap()
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        match &self.saved {
            Some(b) => fs::write(POLICY, b).unwrap(),
            None => {
                let _ = fs::remove_file(POLICY);
            }
        }
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

fn one_line_error(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(125), "stdout: {} stderr: {err}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: installs a setuid binary and a site policy")]
fn a_permitted_user_runs_as_itself_with_no_capabilities_under_the_site_limits() {
    let site = or_skip!(Site::new("ok"));
    let vol = format!("{}:/data:DATA", site.data());
    let o = site
        .cmd(None)
        .env("FOO", "from-the-caller")
        .env("LD_PRELOAD", "/nonexistent.so")
        .env("AZP_SANDBOX_HOME", "/tmp/elsewhere")
        .args(["exec", "--rootfs", "bb", "--volume", &vol, "--", "sh", "-c"])
        .arg(
            "id -u; id -g; echo $DATA; cat /data/sub/f; echo x > /data/new 2>/dev/null || echo ro; \
              grep -E '^Cap(Prm|Eff|Amb)' /proc/self/status; env | grep -c -E 'FOO|LD_PRELOAD' ; \
              head -c 200m /dev/zero | tail >/dev/null; echo mem=$?; exit 3",
        )
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let uid = site.user.uid.as_raw();
    assert_eq!(o.status.code(), Some(3), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        out,
        format!(
            "{uid}\n{}\n/data\nhello\nro\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapAmb:\t0000000000000000\n0\nmem=137\n",
            site.user.gid
        ),
        "the job runs as the caller, sees the dataset read-only, has no capabilities, none of the caller's env, and the site's 64m memory cap"
    );
    // The site home was used (not AZP_SANDBOX_HOME from the caller's environment), and
    // nothing is left there.
    assert!(!Path::new("/tmp/elsewhere").exists());
    let home = azp_sandbox::config::Home::new(site.dir.join("home"));
    assert!(!home.jobs_dir().exists(), "job records left in {}", home.jobs_dir().display());
    assert_eq!(home.job_layer_dirs(), Vec::<std::path::PathBuf>::new(), "job layer dirs left");
    assert_eq!(fs::read_dir(home.trash_dir()).unwrap().count(), 0, "{}", home.trash_dir().display());
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: installs a setuid binary and a site policy")]
fn requests_outside_the_policy_are_refused_with_one_line() {
    let site = or_skip!(Site::new("refuse"));
    let link = format!("{}/etclink:/x", site.data());
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--volume".into(), "/:/host".into()], "--volume / is not allowed"),
        (vec!["--volume".into(), "/etc/shadow:/x".into()], "--volume /etc/shadow is not allowed"),
        (vec!["--volume".into(), link], "etclink is not allowed"),
        (vec!["--user".into(), "0:0".into()], "--user is not allowed"),
        (vec!["--pids".into(), "1000".into()], "--pids 1000 is above the site maximum 50"),
        (vec!["--memory".into(), "1g".into()], "above the site maximum"),
        (vec!["--network".into(), "host".into()], "--network host is not allowed"),
        (vec!["--gpus".into(), "0".into()], "--gpus 0 is not allowed"),
    ];
    for (opts, want) in cases {
        let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
        let err = one_line_error(&site.exec(&opts, "echo ran"));
        assert!(err.contains(want), "{opts:?}: {err}");
    }
    // A rootfs the policy does not list, even if it is in the store.
    let out = Command::new(bin())
        .arg("--home")
        .arg(site.dir.join("home"))
        .args(["rootfs", "import"])
        .arg(busybox_tar())
        .args(["--name", "other"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let o = site.cmd(None).args(["exec", "--rootfs", "other", "--", "true"]).output().unwrap();
    assert!(one_line_error(&o).contains("rootfs 'other' is not allowed by site policy"));
    // A user the policy does not name.
    let o = site.cmd(Some(65534)).args(["exec", "--rootfs", "bb", "--", "true"]).output().unwrap();
    assert!(one_line_error(&o).contains("user nobody may not run sandboxes"));
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: installs a setuid binary and a site policy")]
fn a_policy_that_is_not_root_owned_or_is_writable_or_malformed_is_refused() {
    let site = or_skip!(Site::new("tamper"));
    let run = || site.exec(&[], "echo ran");
    // Owned by the user.
    nix::unistd::chown(POLICY, Some(site.user.uid), None).unwrap();
    assert!(one_line_error(&run()).contains("must be a root-owned file"));
    // Root-owned but group-writable.
    site.policy(&site.default_policy());
    fs::set_permissions(POLICY, fs::Permissions::from_mode(0o664)).unwrap();
    assert!(one_line_error(&run()).contains("not writable by group or others"));
    // A symlink to a policy elsewhere.
    fs::remove_file(POLICY).unwrap();
    let elsewhere = site.dir.join("policy.toml");
    fs::write(&elsewhere, site.default_policy()).unwrap();
    std::os::unix::fs::symlink(&elsewhere, POLICY).unwrap();
    assert!(one_line_error(&run()).contains("cannot open"));
    fs::remove_file(POLICY).unwrap();
    // Malformed TOML, unknown keys, no [setuid] table.
    site.policy("[setuid\nusers = [");
    assert!(one_line_error(&run()).contains("bad config file"));
    site.policy(&format!("{}allow_root = true\n", site.default_policy()));
    assert!(one_line_error(&run()).contains("bad [setuid] table"));
    site.policy("pool = \"gpu\"\n");
    assert!(one_line_error(&run()).contains("no [setuid] table"));
    // Back to good: it runs.
    site.policy(&site.default_policy());
    let o = run();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ran\n", "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: installs a setuid binary and a site policy")]
fn a_binary_with_file_capabilities_is_refused() {
    let site = or_skip!(Site::new("fcaps"));
    let setcap = ["/usr/sbin/setcap", "/sbin/setcap"].into_iter().find(|p| Path::new(p).exists());
    let Some(setcap) = setcap else {
        return skip("setcap not installed (libcap2-bin; scripts/setup.sh installs it)");
    };
    let st = Command::new(setcap).arg("cap_net_raw+ep").arg(site.dir.join("azp-sandbox")).status().unwrap();
    assert!(st.success());
    // setcap clears the setuid bit on some systems: set it again.
    fs::set_permissions(site.dir.join("azp-sandbox"), fs::Permissions::from_mode(0o4755)).unwrap();
    let err = one_line_error(&site.exec(&[], "echo ran"));
    assert!(err.contains("carries file capabilities"), "{err}");
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: installs a setuid binary and a site policy")]
fn the_privileged_side_cannot_be_inspected_by_the_caller_and_other_commands_run_unprivileged() {
    let site = or_skip!(Site::new("ptrace"));
    // A running job: its privileged parent (the process we started) is root-owned and
    // non-dumpable, so the caller cannot read its memory or environment.
    let mut child = site
        .cmd(None)
        .args(["exec", "--rootfs", "bb", "--", "sh", "-c", "echo ready; sleep 30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.as_mut().unwrap()), &mut line).unwrap();
    assert_eq!(line, "ready\n");
    let pid = child.id();
    for what in ["environ", "mem", "maps"] {
        let o = Command::new("cat")
            .arg(format!("/proc/{pid}/{what}"))
            .uid(site.user.uid.as_raw())
            .gid(site.user.gid.as_raw())
            .output()
            .unwrap();
        assert!(!o.status.success(), "the caller could read /proc/{pid}/{what}");
    }
    // Nor signal it (it is root through and through now).
    let o = Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .uid(site.user.uid.as_raw())
        .gid(site.user.gid.as_raw())
        .output()
        .unwrap();
    assert!(!o.status.success(), "the caller could stop the privileged side");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGTERM).unwrap();
    let _ = child.wait();
    // Any other command runs with the caller's ids only (here: rootless, in its own home).
    let home = site.dir.join("user-home");
    fs::create_dir_all(&home).unwrap();
    nix::unistd::chown(&home, Some(site.user.uid), Some(site.user.gid)).unwrap();
    let o = site
        .cmd(None)
        .arg("--home")
        .arg(&home)
        .args(["rootfs", "import"])
        .arg(busybox_tar())
        .args(["--name", "mine"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        fs::metadata(home.join("rootfs")).unwrap().uid(),
        site.user.uid.as_raw(),
        "written as the caller, not root"
    );
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: installs a setuid binary and a site policy")]
fn a_permitted_user_runs_agents_as_itself_under_the_policy() {
    let site = or_skip!(Site::new("run"));
    let lab = or_skip!(common::netlab::NetLab::new());
    let fake = FakeAzure::start_in(&lab);
    // The caller's own token file, readable by the caller only.
    let tf = site.dir.join("pat");
    fs::write(&tf, format!("{}\n", fake.pat())).unwrap();
    nix::unistd::chown(&tf, Some(site.user.uid), Some(site.user.gid)).unwrap();
    fs::set_permissions(&tf, fs::Permissions::from_mode(0o600)).unwrap();
    let run_args = |extra: &[&str]| {
        // In the lab's fake host, as the caller.
        let mut c =
            lab.host_command(site.dir.join("azp-sandbox"), Some((site.user.uid.as_raw(), site.user.gid.as_raw())));
        c.current_dir("/").env("HOME", &site.user.dir).stdin(Stdio::null());
        c.args(["run", "--pool", "gpu", "--url", &fake.url(), "--token-file", tf.to_str().unwrap()])
            .args(["--gpus-per-agent", "none", "--rootfs", "bb", "--name-prefix", "suid"])
            .args(extra);
        c
    };
    // Not enabled until the policy says how many agents a caller may keep.
    let o = run_args(&["--agents", "1"]).output().unwrap();
    assert!(one_line_error(&o).contains("set [setuid] max_agents"));
    site.policy(&format!("{}max_agents = 1\n", site.default_policy()));
    for (extra, want) in [
        (vec!["--agents", "2"], "--agents 2 is not allowed by site policy (at most 1)"),
        (vec!["--hooks-dir", "/tmp"], "--hooks-dir is not allowed"),
        (vec!["--agent-package", "/tmp/x.tar.gz"], "--agent-package is not allowed"),
        // Not carried to the privileged side: said, not dropped (review).
        (vec!["--work-dir", "/tmp"], "--work-dir /tmp is not available in setuid mode"),
        (vec!["--keep-failed", "2"], "--keep-failed is not available in setuid mode"),
    ] {
        let o = run_args(&extra).output().unwrap();
        assert!(one_line_error(&o).contains(want), "{extra:?}");
    }
    // A permitted run: the agent (and so the job) runs as the caller, with no capabilities.
    let mgr = ManagerProc::spawn(run_args(&["--agents", "1"]), site.dir.join("manager.log"));
    fake.enqueue_job("id -u; id -g; grep -E '^CapEff' /proc/self/status; echo done");
    let results = fake.wait_results(1, std::time::Duration::from_secs(90));
    assert_eq!(results.len(), 1, "{}", mgr.log());
    let want = format!("{}\n{}\nCapEff:\t0000000000000000\ndone", site.user.uid, site.user.gid);
    assert!(results[0].output.contains(&want), "{:?}\n{}", results[0].output, mgr.log());
    // Its home is the caller's own below the site's; the PAT is in no file there.
    let home = site.dir.join("home/users").join(site.user.uid.to_string());
    assert!(home.join("status.json").is_file(), "{}", mgr.log());
    let st = mgr.stop();
    assert!(st.success(), "{st}: {}", fs::read_to_string(site.dir.join("manager.log")).unwrap_or_default());
    let out = Command::new("grep").args(["-rl", &fake.pat()]).arg(&home).output().unwrap();
    assert!(out.stdout.is_empty(), "the PAT is in {}", String::from_utf8_lossy(&out.stdout));
}

/// Issues 19 and 23 in setuid mode (the review): the caller's job runs as the caller's
/// uid inside but on a leased block outside (never the caller's own uid, nor 0), with
/// none of the caller's supplementary groups, and in a network of its own by default.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: installs a setuid binary and a site policy")]
fn a_setuid_job_is_nobody_on_the_host_with_no_groups_and_a_network_of_its_own() {
    use std::io::BufRead;
    let site = or_skip!(Site::new("ids"));
    let (uid, gid) = (site.user.uid.as_raw(), site.user.gid.as_raw());
    let marker = format!("azp-setuid-ids-{}", std::process::id());
    // A caller with supplementary groups (disk, video): std's Command::uid would drop them.
    let mut child = Command::new("setpriv")
        .args([&format!("--reuid={uid}"), &format!("--regid={gid}"), "--groups=6,44", "--"])
        .arg(site.dir.join("azp-sandbox"))
        .args(["exec", "--rootfs", "bb", "--", "sh", "-c"])
        .arg(format!(
            "id -u; grep '^Groups:' /proc/self/status; echo links=$(ls /sys/class/net); echo ready; sleep 5 # {marker}"
        ))
        .current_dir("/")
        .env("HOME", &site.user.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut inside = vec![];
    for l in lines.by_ref() {
        let l = l.unwrap();
        if l == "ready" {
            break;
        }
        inside.push(l.trim_end().to_string());
    }
    // The job's processes as the host sees them: in a pid namespace below the host's.
    let nested = |st: &str| st.lines().any(|l| l.starts_with("NSpid:") && l.split_whitespace().count() > 2);
    let field = |st: &str, key: &str| -> Vec<u32> {
        let line = st.lines().find(|l| l.starts_with(key)).unwrap_or_default();
        line[key.len().min(line.len())..].split_whitespace().map(|v| v.parse().unwrap()).collect()
    };
    let statuses: Vec<String> = processes_matching(&marker)
        .into_iter()
        .filter_map(|(pid, _)| fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter(|st| nested(st))
        .collect();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{inside:?}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        inside,
        [uid.to_string(), "Groups:".to_string(), "links=eth0 lo".to_string()],
        "inside: the caller's uid, no groups, its own network"
    );
    assert!(!statuses.is_empty(), "no process of the job found");
    let range = fs::read_to_string("/etc/subuid").unwrap();
    let start: u64 = range
        .lines()
        .find_map(|l| l.strip_prefix("azp-sandbox:"))
        .and_then(|r| r.split(':').next()?.parse().ok())
        .expect("no azp-sandbox entry in /etc/subuid: run scripts/setup.sh");
    for st in &statuses {
        for u in field(st, "Uid:").into_iter().chain(field(st, "Gid:")) {
            assert!(u != uid && u != 0 && u as u64 >= start, "host id {u} for a setuid job:\n{st}");
        }
        assert_eq!(field(st, "Groups:"), Vec::<u32>::new(), "{st}");
    }
}

/// A user keeps at most `[setuid] max_jobs` sandboxes at once: without a cap, one user's
/// concurrent `exec`s took every job id block of the host, shared with the root service
/// and the other users (found by a red-team pass). A seat comes free when its `exec` ends.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: installs a setuid binary and a site policy")]
fn a_user_keeps_at_most_max_jobs_sandboxes_at_once() {
    use std::io::BufRead;
    let site = or_skip!(Site::new("seats"));
    site.policy(&format!("{}max_jobs = 1\n", site.default_policy()));
    let vol = format!("{}:/data", site.data());
    let wait = "echo started; while [ ! -e /data/go ]; do sleep 0.05; done; echo first-done";
    let first = site
        .cmd(None)
        .args(["exec", "--rootfs", "bb", "--volume", &vol, "--", "sh", "-c", wait])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Killed however the test ends (it waits for a file otherwise).
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut first = Kill(first);
    let mut lines = std::io::BufReader::new(first.0.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "started");
    let err = one_line_error(&site.exec(&[], "echo second"));
    assert!(err.contains("you run 1 sandbox(es) already") && err.contains("[setuid] max_jobs"), "{err}");
    fs::write(site.dir.join("data/go"), "").unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "first-done");
    assert!(first.0.wait().unwrap().success());
    let o = site.exec(&[], "echo third");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "third\n", "{}", String::from_utf8_lossy(&o.stderr));
}

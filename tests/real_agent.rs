//! `azp-sandbox run` with an agent package whose entry scripts behave as Microsoft's
//! (tests/common/real_agent.rs: bash `config.sh`/`run.sh`/`env.sh`, a stand-in listener,
//! real ELF stand-ins of the .NET libraries) over a Debian rootfs with the agent's
//! dependencies and an `azp` user (the `debian-bookworm-agent` recipe), against the fake
//! Azure DevOps on loopback. Also the scripts themselves, on the host.

mod common;
use common::fake_azure::FakeAzure;
use common::real_agent::{self, Variant};
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A fake organization, a home with the agent rootfs imported as `agent`, the package
/// file and the PAT's token file.
struct Pool {
    fake: FakeAzure,
    h: TestHome,
    pkg: PathBuf,
    token_file: PathBuf,
    /// Jobs have a network of their own: the fake Azure DevOps is in the lab's fake
    /// internet and `run` in its fake host, as Azure is outside the host in production.
    lab: netlab::NetLab,
}

impl Pool {
    fn new(name: &str, rootfs_tar: &Path, variant: &Variant) -> Pool {
        let lab = netlab::NetLab::new().unwrap_or_else(|why| panic!("the network lab: {why}"));
        let fake = FakeAzure::start_in(&lab);
        let h = TestHome::new(name);
        h.import(rootfs_tar, "agent");
        let pkg = real_agent::write_package(&h.dir, variant);
        let token_file = token_file(&h, &fake.pat());
        Pool { lab, fake, h, pkg, token_file }
    }

    /// `run` on CPU slots named `<prefix>-<n>`, plus `extra`.
    fn run(&self, prefix: &str, extra: &[&str]) -> Command {
        let mut c = self.h.lab_command(&self.lab);
        c.args(["run", "--pool", "gpu", "--url", &self.fake.url(), "--rootfs", "agent", "--gpus-per-agent", "none"])
            .arg("--token-file")
            .arg(&self.token_file)
            .arg("--agent-package")
            .arg(&self.pkg)
            .args(["--name-prefix", prefix])
            .args(extra);
        c
    }

    fn start(&self, prefix: &str, extra: &[&str]) -> ManagerProc {
        ManagerProc::spawn(self.run(prefix, extra), self.h.dir.join("manager.log"))
    }

    fn status_json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.h.run(&["status", "--json"]).stdout).unwrap()
    }
}

/// Makes `dir` the test user's (rootless runs), so azp-sandbox can write there.
fn give_to_test_user(dir: &Path) {
    if let Some(u) = test_user() {
        nix::unistd::chown(dir, Some(u.uid), Some(u.gid)).unwrap();
    }
}

/// The job dirs under `dir` (`<prefix>-<slot>-<n>`).
fn job_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(dir).map(|r| r.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    v.sort();
    v
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn four_jobs_on_two_slots_as_the_unprivileged_user() {
    require_root!();
    let p = Pool::new("real4", &real_agent::agent_rootfs_tar(), &Variant::default());
    let mgr = p.start("real", &["--agents", "2", "--drain-timeout", "20"]);
    for n in 0..4 {
        p.fake.enqueue_job(&format!(
            "echo job={n} uid=$(id -u) user=$(id -un) bash=${{BASH_VERSINFO[0]}}\n\
             echo pwd=$PWD\n\
             echo agent-files=$(cd /azp/agent && ls -A | tr '\\n' ,)\n\
             test -s /etc/ssl/certs/ca-certificates.crt && echo ca-ok\n\
             sleep 1\n"
        ));
    }
    let results = p.fake.wait_results(4, Duration::from_secs(300));
    assert_eq!(results.len(), 4, "only {} of 4 jobs ran; manager log:\n{}", results.len(), mgr.log());
    for r in &results {
        let out = &r.output;
        assert_eq!((r.exit_code, r.result.as_str()), (Some(0), "succeeded"), "{out}");
        assert!(out.contains("uid=1000 user=azp bash=5"), "runs as the rootfs's azp user, under bash: {out}");
        assert!(out.contains("pwd=/azp/agent/_work/1/s"), "{out}");
        // config.sh ran env.sh; the listener configured the agent (and removed nothing).
        for f in [".agent,", ".credentials,", ".credentials_rsaparams,", ".env,", ".path,", "_diag,", "_work,"] {
            assert!(out.contains(f), "{f} missing: {out}");
        }
        assert!(out.contains("ca-ok"), "{out}");
    }
    let agents: std::collections::BTreeSet<&str> = results.iter().map(|r| r.agent.as_str()).collect();
    assert_eq!(agents.into_iter().collect::<Vec<_>>(), ["real-0", "real-1"], "both slots served");
    assert!(mgr.log().contains("rootfs 'agent' can run agent package 4.252.0 (glibc 2.36)"), "{}", mgr.log());

    let st = mgr.stop();
    let log = std::fs::read_to_string(p.h.dir.join("manager.log")).unwrap();
    assert!(st.success(), "manager exit {st}; log:\n{log}");
    // Every job: a header in its agent's log, and its _diag logs kept.
    let mut kept_jobs = 0;
    for agent in ["real-0", "real-1"] {
        let agent_log = std::fs::read_to_string(p.h.dir.join(format!("logs/{agent}.log"))).unwrap();
        assert!(agent_log.contains(&format!("==== job {agent}-1 (slot ")), "{agent_log}");
        assert!(agent_log.contains("rootfs=agent gpus=none") && agent_log.contains("user=1000:1000"), "{agent_log}");
        for dir in job_dirs(&p.h.dir.join("logs").join(agent)) {
            let files = files_in(&dir);
            if files.iter().any(|f| f.starts_with("Worker_")) {
                kept_jobs += 1;
                let agent_diag = files.iter().filter(|f| f.starts_with("Agent_")).map(|f| dir.join(f));
                let text: String = agent_diag.map(|f| std::fs::read_to_string(f).unwrap()).collect();
                assert!(text.contains("completed with result: Succeeded"), "{}: {text}", dir.display());
            }
        }
    }
    assert_eq!(kept_jobs, 4, "each job's _diag kept in HOME/logs/<agent>/<job>/");
    assert!(p.fake.agents().is_empty(), "offline records left: {:?}", p.fake.agents());
    p.h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn a_minbase_rootfs_is_named_in_one_line_before_any_job() {
    require_root!();
    let p = Pool::new("realmin", &debian_tar(), &Variant::default());
    let started = Instant::now();
    let out = p.run("min", &["--agents", "1"]).output().unwrap();
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "one line: {err}");
    let line = errors[0];
    assert!(
        line.contains(
            "rootfs 'agent' cannot run the Azure Pipelines agent: missing libicu, libssl, libkrb5 (libgssapi_krb5), \
             a non-root user ('azp'); install libicu72 libssl3 libkrb5-3 libgssapi-krb5-2 in it"
        ),
        "{line}"
    );
    assert!(line.contains("rootfs build debian-bookworm-agent") && line.contains("AGENT_ALLOW_RUNASROOT=1"), "{line}");
    // Before any slot: nothing registered, nothing left; no retry loop (it exited).
    assert!(p.fake.agents().is_empty(), "{:?}", p.fake.agents());
    assert!(p.fake.requests_to("/agents").iter().all(|r| r.method == "GET"), "no agent was registered");
    p.h.assert_no_residue(&[]);
    eprintln!("refused in {:.1} s", took.as_secs_f64());

    // Root asked for explicitly: the user is no longer what is missing.
    let out = p.run("min", &["--agents", "1"]).env("AGENT_ALLOW_RUNASROOT", "1").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("missing libicu, libssl, libkrb5 (libgssapi_krb5); install"), "{err}");
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn a_failing_config_sh_is_quoted_in_the_log_line() {
    require_root!();
    // A .NET runtime that needs a library the rootfs lacks (preflight does not know it):
    // config.sh's ldd check fails as it does on a rootfs that lacks a real dependency.
    let variant = Variant { coreclr_needs: Some("libazp-test-missing.so.1"), ..Variant::default() };
    let p = Pool::new("realcfg", &real_agent::agent_rootfs_tar(), &variant);
    let mgr = p.start("cfg", &["--agents", "1"]);
    wait_until("config.sh's failure in the log", Duration::from_secs(120), || mgr.log().contains("config.sh failed"));
    let log = mgr.log();
    let line = log.lines().find(|l| l.contains("config.sh failed")).unwrap();
    assert!(
        line.contains(
            "config.sh failed with exit 1; its last output: \"libazp-test-missing.so.1 => not found\" | \
             \"Dependencies missing for .NET 6.0\" | \
             \"Execute ./bin/installdependencies.sh to install any missing dependencies.\""
        ),
        "{line}"
    );
    assert!(line.contains("slot paused"), "{line}");
    assert!(mgr.stop().success());
    p.h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn failed_jobs_are_kept_listed_bounded_and_removed_by_gc() {
    require_root!();
    let p = Pool::new("realkeep", &real_agent::agent_rootfs_tar(), &Variant::default());
    let mgr = p.start("keep", &["--agents", "1", "--keep-failed", "2"]);
    // A pipeline that fails is a job the agent ran well: not kept.
    p.fake.enqueue_job("echo failing on purpose; exit 3");
    // The listener dies before its job (run.sh exits 10, 11, 12): kept, at most 2.
    for code in 10..13 {
        p.fake.enqueue_job(&format!("#exit-code {code}"));
    }
    p.fake.enqueue_job("echo after");
    let results = p.fake.wait_results(5, Duration::from_secs(300));
    assert_eq!(results.len(), 5, "{}", mgr.log());
    assert_eq!(results[0].result, "failed");
    assert_eq!(results[4].result, "succeeded");
    wait_until("three failures kept", Duration::from_secs(60), || {
        mgr.log().matches("kept the failed job").count() == 3
    });
    let log = mgr.log();
    assert!(
        log.contains("run.sh --once exited with 10; its last output: \"")
            && log.contains("Agent exits with code 10 before job"),
        "the failure quotes the listener's last lines: {log}"
    );

    let json = p.status_json();
    let kept = json["failed_jobs"].as_array().unwrap();
    let reasons: Vec<&str> = kept.iter().map(|j| j["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons, ["run.sh --once exited with 11", "run.sh --once exited with 12"], "{json}");
    let text = String::from_utf8_lossy(&p.h.run(&["status"]).stdout).into_owned();
    assert!(text.contains("failed jobs kept (2, `azp-sandbox gc --failed` removes them):"), "{text}");
    for j in kept {
        let dir = PathBuf::from(j["dir"].as_str().unwrap());
        let job = j["job"].as_str().unwrap();
        assert!(dir.starts_with(p.h.dir.join("failed/keep-0")), "{}", dir.display());
        assert!(dir.join("layer/upper/azp/agent/.credentials").is_file(), "the job's writable layer");
        assert!(dir.join("layer/upper/azp/agent/_diag").is_dir());
        let section = std::fs::read_to_string(dir.join("agent.log")).unwrap();
        assert!(section.starts_with(&format!("==== job {job} ")), "{section}");
        assert!(section.contains("(test hook)"), "{section}");
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(p.h.dir.join("failed")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "HOME/failed is root-only");

    assert!(mgr.stop().success());
    let out = p.h.run(&["gc", "--failed"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(p.status_json()["failed_jobs"].as_array().unwrap().is_empty());
    assert!(job_dirs(&p.h.dir.join("failed")).is_empty(), "{:?}", job_dirs(&p.h.dir.join("failed")));
    p.h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn the_work_dir_on_the_host_is_fresh_per_job_and_removed_after_it() {
    require_root!();
    let p = Pool::new("realwd", &real_agent::agent_rootfs_tar(), &Variant::default());
    let scratch = p.h.dir.join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    give_to_test_user(&scratch);
    let root = scratch.join(p.h.home().tag());
    // What a crashed run left: swept at start.
    std::fs::create_dir_all(root.join("wd-0-77/src")).unwrap();
    for d in [&root, &root.join("wd-0-77"), &root.join("wd-0-77/src")] {
        give_to_test_user(d);
    }
    // `--work-dir` through its environment variable.
    let mut c = p.run("wd", &["--agents", "1"]);
    c.env("AZP_WORK", &scratch);
    let mgr = ManagerProc::spawn(c, p.h.dir.join("manager.log"));
    p.fake.enqueue_job(
        "echo entries=$(ls -A $AGENT_WORKFOLDER | tr '\\n' ,) owner=$(stat -c %u $AGENT_WORKFOLDER)\n\
         dd if=/dev/zero of=$AGENT_WORKFOLDER/big bs=1M count=8 status=none\n\
         echo here > $AGENT_WORKFOLDER/marker\n\
         sleep 4\n",
    );
    let mut seen = None;
    wait_until("the job's files in the host work dir", Duration::from_secs(180), || {
        seen = job_dirs(&root).into_iter().find(|d| d.join("marker").is_file());
        seen.is_some()
    });
    let dir = seen.unwrap();
    let id = dir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(id.starts_with("wd-0-"), "{id}");
    assert!(!root.join("wd-0-77").exists(), "the stale dir was swept at start");
    assert_eq!(std::fs::metadata(dir.join("big")).unwrap().len(), 8 << 20);
    // Not in the writable layer: there `_work` is only the mount point.
    let in_layer = p.h.home().job_layers_dir(&id).join("upper/azp/agent/_work");
    assert_eq!(files_in(&in_layer), Vec::<String>::new(), "{}", in_layer.display());
    let results = p.fake.wait_results(1, Duration::from_secs(60));
    let out = &results[0].output;
    assert!(out.contains("entries=1,_temp, owner=1000"), "empty but for the listener's dirs, the job user's: {out}");
    wait_until("the job's work dir removed", Duration::from_secs(30), || !dir.exists());
    assert!(mgr.stop().success());
    assert_eq!(job_dirs(&root), Vec::<PathBuf>::new());
    p.h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn a_drain_cancels_the_running_job_through_the_listener() {
    require_root!();
    let p = Pool::new("realdrain", &real_agent::agent_rootfs_tar(), &Variant::default());
    let drain = Duration::from_secs(3);
    let mgr = p.start("drain", &["--agents", "1", "--drain-timeout", "3"]);
    // The job's steps run (their shell's command line holds the marker): by then the
    // listener has written its Worker log, which is how the manager knows the slot is busy.
    let marker = format!("realdrain-steps-{}", std::process::id());
    p.fake.enqueue_job(&format!("echo started\nsleep 300 # {marker}\necho never"));
    wait_until("the job runs", Duration::from_secs(180), || !processes_matching(&marker).is_empty());
    let signalled = Instant::now();
    let st = mgr.stop();
    let stopped = Instant::now();
    let log = std::fs::read_to_string(p.h.dir.join("manager.log")).unwrap();
    assert!(st.success(), "{log}");
    let results = p.fake.results();
    assert_eq!(results.len(), 1, "the job was reported: {log}");
    let r = &results[0];
    assert_eq!(r.result, "canceled", "{r:?}");
    assert!(matches!(r.signal.as_deref(), Some("INT" | "TERM")), "the listener got the signal: {r:?}");
    assert!(r.output.contains("started") && !r.output.contains("never"), "{r:?}");
    assert!(r.at >= signalled + drain, "the job had its drain timeout first");
    assert!(r.at <= stopped, "reported before the slot was gone");
    assert!(
        p.fake.agents().iter().all(|a| a.name != "drain-0") || p.fake.agent("drain-0").unwrap().sessions_deleted >= 1
    );
    assert!(log.contains("result=Canceled"), "{log}");
    p.h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn a_job_taken_just_before_a_drain_gets_the_drain_timeout() {
    require_root!();
    // The listener shows its job on disk 4 s after taking it: a drain in between must
    // learn from the server that the agent has a job and let it finish.
    let p =
        Pool::new("realtaken", &real_agent::agent_rootfs_tar(), &Variant { dispatch_delay_s: 4, ..Variant::default() });
    let mgr = p.start("taken", &["--agents", "1", "--drain-timeout", "60"]);
    p.fake.enqueue_job("echo started\nsleep 1\necho finished");
    wait_until("the job is taken", Duration::from_secs(180), || p.fake.queued_jobs() == 0);
    let st = mgr.stop();
    let log = std::fs::read_to_string(p.h.dir.join("manager.log")).unwrap();
    assert!(st.success(), "{log}");
    let results = p.fake.results();
    assert_eq!(results.len(), 1, "the job was reported: {log}");
    let r = &results[0];
    assert_eq!(r.result, "succeeded", "not cancelled at once: {r:?}\n{log}");
    assert!(r.signal.is_none() && r.output.contains("finished"), "{r:?}");
    p.h.assert_no_residue(&[]);
}

// --- the entry scripts on the host (no sandbox): what makes them faithful ---

/// The package unpacked into a temp dir.
fn unpacked(variant: &Variant) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let gz = flate2::read::GzDecoder::new(std::io::Cursor::new(real_agent::package(variant)));
    tar::Archive::new(gz).unpack(t.path()).unwrap();
    t
}

fn sh(dir: &Path, script: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(dir.join(script));
    c.args(args).current_dir(dir).stdin(Stdio::null()).env_remove("AGENT_ALLOW_RUNASROOT");
    // As a service manager starts it: SIGINT and SIGQUIT at their defaults. A test run
    // started in the background of a shell without job control inherits them ignored,
    // and bash cannot trap a signal ignored at its start: the listener never heard of
    // the tests' SIGINT (two failures of a CI rehearsal started that way).
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec, only signal(2), which is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGQUIT] {
                if libc::signal(sig, libc::SIG_DFL) == libc::SIG_ERR {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

fn as_root_allowed() -> &'static [(&'static str, &'static str)] {
    if is_root() {
        &[("AGENT_ALLOW_RUNASROOT", "1")]
    } else {
        &[]
    }
}

#[test]
fn the_entry_scripts_refuse_root_and_check_the_dotnet_dependencies() {
    let pkg = unpacked(&Variant { coreclr_needs: Some("libazp-test-missing.so.1"), ..Variant::default() });
    let dir = pkg.path();
    if is_root() {
        for (script, says) in
            [("config.sh", "Must not run with sudo"), ("run.sh", "Must not run interactively with sudo")]
        {
            let out = sh(dir, script, &[], &[]).output().unwrap();
            assert_eq!(out.status.code(), Some(1), "{script}");
            assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{says}\n"), "{script}");
        }
    } else {
        skip_part("the uid-0 refusals need root");
    }
    let out = sh(dir, "config.sh", &["--unattended"], as_root_allowed()).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    assert_eq!(
        lines,
        [
            "libazp-test-missing.so.1 => not found",
            "Dependencies missing for .NET 6.0",
            "Execute ./bin/installdependencies.sh to install any missing dependencies."
        ],
        "the host's ldd on the stand-in libcoreclr.so"
    );
    // The three libraries are real ELF objects with the real ones' dependencies.
    for (lib, needs) in [
        ("libcoreclr.so", &["libstdc++.so.6", "libpthread.so.0", "libdl.so.2", "libm.so.6"][..]),
        ("libSystem.Security.Cryptography.Native.OpenSsl.so", &["libssl.so.3", "libcrypto.so.3"][..]),
        ("libSystem.IO.Compression.Native.so", &["libz.so.1"][..]),
    ] {
        let out = Command::new("ldd").arg(dir.join("bin").join(lib)).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        for n in needs {
            assert!(text.contains(&format!("{n} => ")), "{lib} needs {n}: {text}");
        }
    }
}

#[test]
fn run_sh_runs_an_updated_listener_once_after_exit_4() {
    let pkg = unpacked(&Variant::default());
    let dir = pkg.path();
    let listener = dir.join("bin/Agent.Listener");
    use std::os::unix::fs::PermissionsExt;
    // First run: "update" (exit 4) after putting the new listener in place.
    let new = "#!/bin/bash\necho \"new listener: $*\"\nexit 0\n";
    std::fs::write(dir.join("new"), new).unwrap();
    std::fs::write(
        &listener,
        "#!/bin/bash\necho \"old listener: $*\"\ncp \"$(dirname \"$0\")/../new\" \"$0.new\"\nchmod 755 \"$0.new\"\nmv \"$0.new\" \"$0\"\nexit 4\n",
    )
    .unwrap();
    std::fs::set_permissions(&listener, std::fs::Permissions::from_mode(0o755)).unwrap();
    let t = Instant::now();
    let out = sh(dir, "run.sh", &["--once"], as_root_allowed()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.starts_with("old listener: run --once\n") && text.ends_with("new listener: run --once\n"), "{text}");
    assert!(t.elapsed() >= Duration::from_secs(5), "waited for the update");
    // An update that never produces a listener: given up after 20 s.
    std::fs::write(&listener, "#!/bin/bash\nchmod 644 \"$0\"\nexit 4\n").unwrap();
    std::fs::set_permissions(&listener, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = sh(dir, "run.sh", &["--once"], as_root_allowed()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.ends_with("Failed to update within 20 seconds.\n"), "{text}");
}

#[test]
fn the_listener_cancels_on_its_own_signal_but_run_sh_passes_none_on() {
    let fake = FakeAzure::start();
    let pkg = unpacked(&Variant::default());
    let dir = pkg.path();
    let env: Vec<(&str, &str)> = as_root_allowed().to_vec();
    let pat = fake.pat();
    let mut configure = sh(dir, "config.sh", &["--unattended", "--url", &fake.url(), "--auth", "pat"], &env);
    configure.args(["--pool", "gpu", "--agent", "host-stand-in", "--replace", "--acceptTeeEula"]);
    let out = configure.env("VSTS_AGENT_INPUT_TOKEN", &pat).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.ends_with("Successfully added the agent\nSettings Saved.\n"), "{text}");
    let agent = fake.agent("host-stand-in").expect("registered");
    assert_eq!(agent.capabilities.get("Agent.Version").map(String::as_str), Some(real_agent::VERSION));
    assert!(!agent.capabilities.contains_key("VSTS_AGENT_INPUT_TOKEN"), "inputs are not capabilities");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.join(".credentials_rsaparams")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let diag = files_in(&dir.join("_diag"));
    assert!(diag.iter().any(|f| f.starts_with("Agent_") && f.ends_with("-utc.log")), "{diag:?}");
    let diag_text: String = diag.iter().map(|f| std::fs::read_to_string(dir.join("_diag").join(f)).unwrap()).collect();
    assert!(!diag_text.contains(&pat), "the PAT is masked in the diag log");
    assert!(std::fs::read_to_string(dir.join(".path")).unwrap().contains("/bin"), "env.sh wrote .path");

    // SIGTERM to run.sh (bash, no trap): it dies, the listener never hears of it and the
    // job goes on; the signal to the listener itself cancels the job.
    let job = fake.enqueue_job("echo started\nsleep 60\necho never");
    let mut run = sh(dir, "run.sh", &["--once"], &env).stdout(Stdio::piped()).spawn().unwrap();
    wait_until("the job started", Duration::from_secs(30), || fake.queued_jobs() == 0);
    std::thread::sleep(Duration::from_millis(500));
    let listener = children_of(run.id() as i32);
    assert_eq!(listener.len(), 1, "run.sh runs the listener as its child: {listener:?}");
    let listener = listener[0];
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(run.id() as i32), nix::sys::signal::SIGTERM).unwrap();
    let st = run.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(libc::SIGTERM), "run.sh died of it");
    std::thread::sleep(Duration::from_secs(1));
    assert!(fake.results().is_empty(), "the listener did not hear of it: {:?}", fake.results());
    assert!(Path::new(&format!("/proc/{listener}")).exists(), "the listener goes on");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(listener), nix::sys::signal::SIGINT).unwrap();
    let results = fake.wait_results(1, Duration::from_secs(30));
    assert_eq!(results.len(), 1);
    let r = &results[0];
    assert_eq!((r.job_id, r.result.as_str(), r.signal.as_deref()), (job, "canceled", Some("INT")), "{r:?}");
    assert!(r.output.contains("started") && !r.output.contains("never"), "{r:?}");
    wait_until("the session deleted", Duration::from_secs(10), || {
        fake.agent("host-stand-in").is_some_and(|a| a.sessions_deleted == 1)
    });
    wait_until("the listener exited", Duration::from_secs(10), || !Path::new(&format!("/proc/{listener}")).exists());
    let diag_text: String = files_in(&dir.join("_diag"))
        .iter()
        .map(|f| std::fs::read_to_string(dir.join("_diag").join(f)).unwrap())
        .collect();
    assert!(diag_text.contains("Received SIGINT"), "{diag_text}");
    assert!(diag_text.contains(&format!("Job {job} completed with result: Canceled")), "{diag_text}");
}

#[test]
fn a_signal_just_after_the_listener_took_its_job_still_cancels_it() {
    // The listener starts the job's steps in a process group of their own (setsid in the
    // job's shell) and cancels that group. A signal that came before the group existed
    // (during the listener's dispatch, or as the job was spawned) found no group: the
    // listener gave up cancelling and waited for the whole job (a CI rehearsal of the
    // test above, its SIGINT delayed by a busy machine: no result in 30 s).
    let fake = FakeAzure::start();
    // The signal comes during the listener's dispatch (2 s), and its job's shell takes 1 s
    // to make the steps' group.
    let pkg = unpacked(&Variant { dispatch_delay_s: 2, steps_group_delay_s: 1, ..Variant::default() });
    let dir = pkg.path();
    let env: Vec<(&str, &str)> = as_root_allowed().to_vec();
    let mut configure = sh(dir, "config.sh", &["--unattended", "--url", &fake.url(), "--auth", "pat"], &env);
    configure.args(["--pool", "gpu", "--agent", "host-stand-in", "--replace", "--acceptTeeEula"]);
    let out = configure.env("VSTS_AGENT_INPUT_TOKEN", fake.pat()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let job = fake.enqueue_job("echo started\nsleep 60\necho never");
    let mut run = sh(dir, "run.sh", &["--once"], &env).stdout(Stdio::null()).spawn().unwrap();
    wait_until("the job taken", Duration::from_secs(30), || fake.queued_jobs() == 0);
    let listener = children_of(run.id() as i32);
    assert_eq!(listener.len(), 1, "run.sh runs the listener as its child: {listener:?}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(listener[0]), nix::sys::signal::SIGINT).unwrap();
    // The job's shell gets SIGINT (ignored: started in the background), then its steps'
    // group SIGTERM 3 s later.
    let results = fake.wait_results(1, Duration::from_secs(30));
    let diag: String = files_in(&dir.join("_diag"))
        .iter()
        .filter_map(|f| std::fs::read_to_string(dir.join("_diag").join(f)).ok())
        .collect();
    assert_eq!(results.len(), 1, "the job was cancelled: {diag}");
    let r = &results[0];
    assert_eq!((r.job_id, r.result.as_str(), r.signal.as_deref()), (job, "canceled", Some("INT")), "{r:?}");
    assert!(!r.output.contains("never"), "{r:?}");
    assert_eq!(run.wait().unwrap().code(), Some(0));
}

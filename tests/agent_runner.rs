//! `azp-sandbox run` end to end against the fake Azure DevOps and the fake agent package
//! (busybox sh scripts following the real agent's contract). With the jobs' default
//! network (a namespace of their own), the fake server is in the network lab's fake
//! internet and `run` in its fake host, as Azure is outside the host in production.

mod common;
use common::fake_azure::FakeAzure;
use common::*;
use std::process::Stdio;
use std::time::Duration;

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn two_slots_serve_six_jobs_each_in_a_fresh_sandbox() {
    require_root!();
    let tree = or_skip!(driver_tree());
    let lab = or_skip!(netlab::NetLab::new());
    let fake = FakeAzure::start_in(&lab);
    let h = TestHome::with_busybox("runner");
    let data = h.dir.join("dataset");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("labels.txt"), "cat,dog\n").unwrap();
    let pat = fake.pat();
    let tf = token_file(&h, &pat);
    let log = std::fs::File::create(h.dir.join("manager.log")).unwrap();
    let child = h
        .lab_command(&lab)
        .arg("--driver-root")
        .arg(&tree)
        .args(["run", "--pool", "gpu", "--url", &fake.url(), "--token-file", tf.to_str().unwrap()])
        .args(["--agents", "2", "--gpus-per-agent", "1", "--rootfs", "bb", "--name-prefix", "testhost"])
        .args(["--memory", "256M", "--pids", "200", "--drain-timeout", "20"])
        .arg("--volume")
        .arg(format!("{}:/datasets/animals:ANIMALS", data.display()))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mgr = ManagerProc { child, log: h.dir.join("manager.log") };

    // The PAT is split so that the job script itself does not contain it.
    let (p1, p2) = pat.split_at(pat.len() / 2);
    for n in 0..6 {
        fake.enqueue_job(&format!(
            "echo job={n} user=$(id -u) agent=$AGENT_NAME\n\
             cat $ANIMALS/labels.txt\n\
             ls /dev | grep nvidia | tr '\\n' ' '; echo\n\
             echo gpu_count=$gpu_count slot=$azp_sandbox_slot\n\
             ls /azp/agent/leak-* /home/azp/leak-* 2>/dev/null | wc -l | sed 's/^/previous-leaks=/'\n\
             touch /azp/agent/leak-{n} /home/azp/leak-{n} || echo TOUCH-FAILED\n\
             P1='{p1}'; P2='{p2}'\n\
             has() {{ awk -v a=\"$P1\" -v b=\"$P2\" 'index($0, a b) {{ n++ }} END {{ print n + 0 }}'; }}\n\
             echo env-pat=$(env | has)\n\
             echo proc-pat=$(cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | has)\n\
             echo file-pat=$(find /azp /etc /tmp /home /root /var -type f 2>/dev/null | while read -r f; do has < \"$f\"; done | grep -vc '^0$')\n\
             echo input-vars=$(env | grep -c VSTS_AGENT_INPUT)\n\
             echo links=$(ls /sys/class/net | tr '\\n' ' ')\n"
        ));
    }
    let results = fake.wait_results(6, Duration::from_secs(240));
    assert_eq!(
        results.len(),
        6,
        "only {} of 6 jobs ran; manager log:\n{}",
        results.len(),
        std::fs::read_to_string(h.dir.join("manager.log")).unwrap()
    );
    let mut names = std::collections::BTreeSet::new();
    for r in &results {
        let out = &r.output;
        assert_eq!(r.exit_code, Some(0), "{out}");
        names.insert(r.agent.clone());
        assert!(out.contains("user=1000"), "runs as the rootfs's azp user: {out}");
        assert!(out.contains("cat,dog"), "dataset visible: {out}");
        assert!(out.contains("previous-leaks=0"), "a previous job's file is visible: {out}");
        assert!(!out.contains("TOUCH-FAILED"), "{out}");
        assert!(out.contains("links=eth0 lo\n"), "a network of its own: {out}");
        for secret in ["env-pat=0", "proc-pat=0", "file-pat=0", "input-vars=0"] {
            assert!(out.contains(secret), "PAT reachable ({secret}): {out}");
        }
        let slot: usize = out.split("slot=").nth(1).unwrap().chars().next().unwrap().to_digit(10).unwrap() as usize;
        assert!(out.contains("gpu_count=1"), "{out}");
        let own = format!("nvidia{slot} ");
        let other = format!("nvidia{} ", 1 - slot);
        assert!(out.contains(&own) && !out.contains(&other), "slot {slot} must see only its GPU: {out}");
        assert!(r.agent == format!("testhost-{slot}"), "{} ran on slot {slot}", r.agent);
    }
    assert_eq!(names.into_iter().collect::<Vec<_>>(), vec!["testhost-0", "testhost-1"]);
    assert_eq!(fake.package_downloads(), 1, "the agent package is downloaded once");
    // Every job re-registered with --replace: one record per name, several registrations.
    let agents = fake.agents();
    assert_eq!(agents.len(), 2, "{agents:?}");
    assert!(agents.iter().map(|a| a.registrations).sum::<u32>() >= 6, "{agents:?}");
    assert!(
        agents.iter().all(|a| a.capabilities.get("azp_sandbox_rootfs").map(String::as_str) == Some("bb")),
        "{agents:?}"
    );

    let st = mgr.stop();
    assert!(st.success(), "manager exit {st}; log:\n{}", std::fs::read_to_string(h.dir.join("manager.log")).unwrap());
    let log = std::fs::read_to_string(h.dir.join("manager.log")).unwrap();
    assert!(log.contains("job finished"), "job log lines expected:\n{log}");
    // The limits in force, at start and in each job's line.
    assert!(log.contains("job limits: memory 256.0M, pids 200, cpus "), "the start line:\n{log}");
    let job_lines: Vec<&str> = log.lines().filter(|l| l.contains("job finished")).collect();
    assert!(job_lines.iter().all(|l| l.contains("limits=memory 256.0M, pids 200")), "{job_lines:?}");
    assert!(fake.agents().is_empty(), "offline records left: {:?}", fake.agents());
    h.assert_no_residue(&[]);
    assert!(processes_matching(h.dir.to_str().unwrap()).is_empty(), "processes left");
    assert_eq!(lab.host_network_residue(), Vec::<String>::new(), "the end of run leaves no network state");
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn bad_pat_and_unknown_pool_fail_at_start_with_their_message() {
    require_root!();
    let fake = FakeAzure::start();
    let h = TestHome::with_busybox("runner-bad");
    let run = |pat: &str, pool: &str| {
        let tf = token_file(&h, pat);
        let out = h
            .command()
            .args([
                "run",
                "--pool",
                pool,
                "--url",
                &fake.url(),
                "--token-file",
                tf.to_str().unwrap(),
                "--agents",
                "1",
                "--rootfs",
                "bb",
            ])
            .args(["--gpus-per-agent", "none"])
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run("wrongpat", "gpu");
    assert_eq!(code, Some(125));
    assert!(err.contains("PAT was rejected") && err.lines().filter(|l| l.contains("error")).count() == 1, "{err}");
    let (code, err) = run(&fake.pat(), "nope");
    assert_eq!(code, Some(125));
    assert!(err.contains("agent pool 'nope' not found"), "{err}");
    let out = h
        .command()
        .args(["run", "--pool", "gpu", "--url", "http://127.0.0.1:9/x", "--token-file"])
        .arg(token_file(&h, "x"))
        // Local checks come first: a setup that passes them (no GPU here), so the server's.
        .args(["--rootfs", "bb", "--agents", "1", "--gpus-per-agent", "none"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach"), "{err}");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn update_required_refetches_the_package_and_status_shows_the_slots() {
    require_root!();
    let lab = or_skip!(netlab::NetLab::new());
    let fake = FakeAzure::start_in(&lab);
    let h = TestHome::with_busybox("runner-update");
    let tf = token_file(&h, &fake.pat());
    let log = std::fs::File::create(h.dir.join("manager.log")).unwrap();
    let child = h
        .lab_command(&lab)
        .args(["run", "--pool", "gpu", "--url", &fake.url(), "--token-file", tf.to_str().unwrap()])
        .args(["--agents", "1", "--gpus-per-agent", "none", "--rootfs", "bb", "--name-prefix", "upd"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mgr = ManagerProc { child, log: h.dir.join("manager.log") };
    fake.enqueue_job("echo first");
    assert_eq!(fake.wait_results(1, Duration::from_secs(60)).len(), 1);
    // The server now offers a newer agent, and the running one asks for an update (exit 4).
    fake.set_package_version("4.253.1");
    fake.enqueue_job("#exit-code 4\necho never runs");
    fake.enqueue_job("echo after-update");
    let results = fake.wait_results(3, Duration::from_secs(60));
    assert_eq!(results.len(), 3, "{}", std::fs::read_to_string(h.dir.join("manager.log")).unwrap());
    assert_eq!(results[1].hook_exit, Some(4));
    assert!(results[2].output.contains("after-update"));
    assert_eq!(fake.package_downloads(), 2, "the new version is fetched once");
    assert!(h.dir.join("cache/agent/4.253.1/azp/agent/run.sh").exists());
    assert_eq!(fake.agent("upd-0").map(|a| a.version), Some("4.253.1".to_string()));

    let out = h.run(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("upd-0") && text.contains("running") && text.contains("pool      gpu"), "{text}");
    // No limit flag: every limit has the node's default, shown by `status`.
    assert!(text.contains("limits    per job: memory ") && text.contains("(1 slot(s) sharing "), "{text}");
    assert!(!text.contains("memory unlimited") && !text.contains("pids unlimited"), "{text}");
    // The slot counts a job once its sandbox is torn down, a moment after the agent has
    // posted the result the fake server saw: wait for the count instead of racing it.
    let status_json = || -> serde_json::Value { serde_json::from_slice(&h.run(&["status", "--json"]).stdout).unwrap() };
    wait_until("status counts the second job", Duration::from_secs(20), || {
        status_json()["slots"][0]["jobs_done"].as_u64().unwrap_or(0) >= 2
    });
    let json = status_json();
    assert_eq!(json["slots"][0]["agent"], "upd-0");
    let per_job = &json["job_limits"]["per_job"];
    assert!(per_job["memory_bytes"].as_u64().unwrap() >= 256 << 20, "{json}");
    assert!(per_job["pids"].as_i64().unwrap() >= 64 && per_job["cpus_milli"].as_u64().unwrap() >= 1000, "{json}");
    assert_eq!(per_job["tmp_bytes"], per_job["memory_bytes"], "{json}");
    assert!(json["slots"][0]["jobs_done"].as_u64().unwrap() >= 2, "{json}");

    assert!(mgr.stop().success());
    let out = h.run(&["status"]);
    assert_eq!(out.status.code(), Some(3), "status of a stopped manager exits 3");
    assert!(String::from_utf8_lossy(&out.stdout).contains("NOT RUNNING"));
    h.assert_no_residue(&[]);
}

#[test]
fn service_install_writes_a_unit() {
    let h = TestHome::new("service");
    let units = h.dir.join("units");
    let out = h.run(&[
        "service",
        "install",
        "--unit-dir",
        units.to_str().unwrap(),
        "--config",
        "/etc/azp-sandbox/config.toml",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let unit = std::fs::read_to_string(units.join("azp-sandbox.service")).unwrap();
    assert!(
        unit.contains(&format!(
            "ExecStart={} --home {} run --config /etc/azp-sandbox/config.toml",
            bin().display(),
            h.dir.display()
        )),
        "{unit}"
    );
    assert!(unit.contains("KillMode=mixed") && unit.contains("WantedBy=multi-user.target"), "{unit}");
}

/// A drain as a user expects it: SIGTERM to `run` while a job runs, a short
/// `--drain-timeout`; at the timeout the agent's whole process group gets SIGINT (through
/// the job's init: the agent's `run.sh` is pid 1's child, not pid 1), the listener
/// cancels the job, reports it "canceled" and exits, all before its slot is gone; nobody
/// waits for `--cancel-grace`. Once with the fake package (run.sh execs the listener) and
/// once with a run.sh that behaves as the real one: bash, no trap, no exec (issue 20).
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn drain_timeout_cancels_the_running_job_through_the_listener() {
    require_root!();
    let bash_rootfs = or_skip!(busybox_bash_tar());
    // The job reaches the fake Azure DevOps in the network lab's fake internet.
    let lab = or_skip!(netlab::NetLab::new());
    for bash in [false, true] {
        let fake = FakeAzure::start_in(&lab);
        if bash {
            fake.use_bash_run_sh();
        }
        let h = TestHome::new(if bash { "runner-drain-bash" } else { "runner-drain" });
        h.import(&bash_rootfs, "bb");
        let tf = token_file(&h, &fake.pat());
        let marker = format!("drain-job-{}-{bash}", std::process::id());
        let mut cmd = h.lab_command(&lab);
        cmd.args(["run", "--pool", "gpu", "--url", &fake.url(), "--token-file", tf.to_str().unwrap()])
            .args(["--agents", "1", "--gpus-per-agent", "none", "--rootfs", "bb", "--name-prefix", "drain"])
            .args(["--drain-timeout", "2", "--cancel-grace", "40"]);
        let mgr = ManagerProc::spawn(cmd, h.dir.join("manager.log"));
        fake.enqueue_job(&format!("echo job-started; sh -c 'sleep 300' {marker}; echo JOB-WAS-NOT-CANCELLED"));
        wait_until("the job to run", Duration::from_secs(90), || !processes_matching(&marker).is_empty());
        let stopped = std::time::Instant::now();
        let st = mgr.stop();
        let took = stopped.elapsed();
        let log = std::fs::read_to_string(h.dir.join("manager.log")).unwrap();
        assert!(st.success(), "bash={bash}: manager exit {st}; log:\n{log}");
        let results = fake.results();
        assert_eq!(results.len(), 1, "bash={bash}: the job was not reported; log:\n{log}");
        let r = &results[0];
        assert_eq!(r.result, "canceled", "bash={bash}: {r:?}\n{log}");
        assert!(r.output.contains("job-started") && !r.output.contains("JOB-WAS-NOT-CANCELLED"), "{r:?}");
        assert!(r.output.contains("listener: received SIGINT"), "bash={bash}: the listener got SIGINT: {r:?}");
        assert!(log.contains("stopping agent drain-0 (drain timeout: its job is cancelled): SIGINT"), "{log}");
        assert!(!log.contains("killing it"), "bash={bash}: the cancel grace ran out:\n{log}");
        assert!(took < Duration::from_secs(30), "bash={bash}: {took:?}: waited for the cancel grace?\n{log}");
        let agent_log = std::fs::read_to_string(h.dir.join("logs/drain-0.log")).unwrap_or_default();
        if bash {
            // run.sh itself lived on, waited for its listener and passed its code on.
            assert!(agent_log.contains("run.sh: the listener exited with 0"), "{agent_log}");
        }
        assert!(processes_matching(&marker).is_empty());
        h.assert_no_residue(&[]);
    }
}

/// A firewall reload (Debian's nftables.conf begins with `flush ruleset`) takes the
/// jobs' table, and with it the destinations a run allows its jobs. The next job makes
/// the table again: with the run's allowed destinations, not without them.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn a_firewall_reload_keeps_the_runs_allowed_destinations() {
    require_root!();
    if rootless() {
        skip("root mode only: rootless jobs have no host table to flush");
        return;
    }
    let lab = or_skip!(netlab::NetLab::new());
    let fake = FakeAzure::start_in(&lab);
    let h = TestHome::with_busybox("runner-reload");
    let tf = token_file(&h, &fake.pat());
    // The first job waits for the host's `go` here: the reload comes while it runs.
    let flag = h.dir.join("flag");
    std::fs::create_dir_all(&flag).unwrap();
    std::fs::set_permissions(&flag, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut cmd = h.lab_command(&lab);
    cmd.args(["run", "--pool", "gpu", "--url", &fake.url(), "--token-file", tf.to_str().unwrap()])
        .args(["--agents", "1", "--gpus-per-agent", "none", "--rootfs", "bb", "--name-prefix", "reload"])
        .args(["--network-allow", &format!("{}:80", netlab::AZURE_HOST_IP)])
        .arg("--volume")
        .arg(format!("{}:/flag:FLAG", flag.display()));
    let mgr = ManagerProc::spawn(cmd, h.dir.join("manager.log"));
    let log = || std::fs::read_to_string(h.dir.join("manager.log")).unwrap_or_default();
    // Azure's host endpoint: refused to jobs unless allowed, as this run does.
    let fetch = |n: usize| {
        format!("echo job={n}; timeout 5 wget -q -O- http://{}/ 2>&1 || echo FETCH-FAILED", netlab::AZURE_HOST_IP)
    };
    let marker = format!("reload-wait-{}", std::process::id());
    fake.enqueue_job(&format!("{}; sh -c 'while [ ! -e /flag/go ]; do sleep 0.05; done' {marker}", fetch(0)));
    wait_until("the first job to run", Duration::from_secs(90), || !processes_matching(&marker).is_empty());
    // The reload, while the slot's agent runs its job and its next sandbox waits, so no
    // agent's connection is under way: a flush drops the connections the table had
    // masqueraded (seen: an agent's request hung for good). The run makes the table
    // again at once, while that job still runs (before: only the sandbox after the next).
    lab.flush_host_ruleset();
    let has_table = || lab.host_network_residue().iter().any(|t| t == "table inet azp-sandbox");
    wait_until("the run to make the table again", Duration::from_secs(10), has_table);
    std::fs::write(flag.join("go"), "").unwrap();
    let results = fake.wait_results(1, Duration::from_secs(120));
    assert_eq!(results.len(), 1, "the first job did not end; log:\n{}", log());
    assert!(results[0].output.contains(netlab::WIRESERVER_BODY), "the control: {:?}\n{}", results[0], log());
    for n in 1..=3 {
        fake.enqueue_job(&fetch(n));
    }
    let results = fake.wait_results(4, Duration::from_secs(180));
    assert_eq!(results.len(), 4, "only {} of 4 jobs ran; log:\n{}", results.len(), log());
    let tables = lab.host_network_residue();
    assert!(tables.iter().any(|t| t == "table inet azp-sandbox"), "the table was made again: {tables:?}");
    let last = results.iter().find(|r| r.output.contains("job=3")).expect("job 3");
    assert!(
        last.output.contains(netlab::WIRESERVER_BODY),
        "a job after the table was made again reaches the run's allowed destination: {last:?}\n{}",
        log()
    );
    // Every request reached Azure from the fake host's address: the manager's own, and
    // the jobs' masqueraded. Without the table made again, the job that ran through the
    // reload posted its result, and the agent of the sandbox prepared before it
    // registered, from their own addresses (seen), which only the fake internet routes
    // back: a real agent would have failed to.
    let froms: std::collections::BTreeSet<String> =
        fake.requests_log().iter().map(|r| r.from.map_or("?".into(), |a| a.to_string())).collect();
    assert_eq!(froms, [netlab::HOST_IP.to_string()].into(), "log:\n{}", log());
    let st = mgr.stop();
    assert!(st.success(), "manager exit {st}; log:\n{}", log());
    h.assert_no_residue(&[]);
    assert_eq!(lab.host_network_residue(), Vec::<String>::new(), "the end of run leaves no network state");
}

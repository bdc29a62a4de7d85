//! Jobs die with their supervisor (issue 25): when the process that owns a job dies by
//! SIGKILL (a CI timeout, the OOM killer, `scancel`) — the `exec` CLI, its sandbox helper,
//! or a `run` manager — every process of the job is gone within a second, without any
//! `gc`. The job's init (pid 1) reads a lifeline pipe whose write end only the helper
//! holds; the helper dies with its runner (PDEATHSIG). The jobs here make it hard: a
//! background child, one that ignores TERM/HUP/INT, and one in a session of its own.
//! Root and rootless (the rootless pass runs every command as the test user).

use super::*;

/// How long a job may outlive its supervisor.
const WITHIN: Duration = Duration::from_secs(1);

/// A job script whose processes all carry `marker` in their command lines (assembled in
/// the job, so the job's own command line does not contain it) and that prints `ready`
/// once they run.
fn stubborn_job(marker: &str) -> String {
    let (m1, m2) = marker.split_at(8);
    let lp = "while :; do sleep 1; done";
    format!(
        "M1='{m1}'; M2='{m2}'; M=$M1$M2\n\
         sh -c '{lp}' $M-bg &\n\
         sh -c 'trap \"\" TERM HUP INT; {lp}' $M-ignoring &\n\
         setsid sh -c '{lp}' $M-setsid &\n\
         sleep 0.3; echo ready; wait"
    )
}

/// Starts `exec` of [`stubborn_job`], waits for `ready` and for its 3 processes.
fn start_exec(h: &TestHome, marker: &str) -> HostProc {
    let mut child = h
        .command()
        .args(["exec", "--rootfs", "esc", "--", "sh", "-c", &stubborn_job(marker)])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line, "ready\n");
    wait_until("the job's 3 processes", Duration::from_secs(10), || processes_matching(marker).len() >= 3);
    HostProc(child)
}

/// Fails unless every process carrying `marker` is gone within [`WITHIN`] of `since`.
fn assert_gone_within(marker: &str, since: Instant, who: &str) {
    loop {
        let left = processes_matching(marker);
        if left.is_empty() {
            return;
        }
        assert!(since.elapsed() < WITHIN, "kill -9 of {who}: the job's processes outlived it by {WITHIN:?}: {left:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The sandbox helper below `pid` (it names itself `azp-sbx-helper`, or is this binary
/// re-executed as `__sandbox-helper`).
fn helper_below(pid: i32) -> Option<i32> {
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for c in children_of(p) {
            let comm = fs::read_to_string(format!("/proc/{c}/comm")).unwrap_or_default();
            let cmd = fs::read(format!("/proc/{c}/cmdline")).unwrap_or_default();
            if comm.trim() == "azp-sbx-helper" || String::from_utf8_lossy(&cmd).contains("__sandbox-helper") {
                return Some(c);
            }
            todo.push(c);
        }
    }
    None
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn s1_kill_9_of_exec_ends_its_job_within_a_second() {
    require_root!();
    let h = home("sup-exec");
    let marker = unique("esc-supexec");
    let mut exec = start_exec(&h, &marker);
    exec.0.kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    exec.0.wait().unwrap();
    assert_gone_within(&marker, killed, "exec");
    // The records are what gc is for; nothing of the job runs any more.
    let out = h.run(&["gc"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn s2_kill_9_of_the_helper_ends_its_job_within_a_second() {
    require_root!();
    let h = home("sup-helper");
    let marker = unique("esc-suphelper");
    let mut exec = start_exec(&h, &marker);
    let helper = helper_below(exec.0.id() as i32).expect("no sandbox helper below exec");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(helper), nix::sys::signal::SIGKILL).unwrap();
    let killed = Instant::now();
    assert_gone_within(&marker, killed, "the helper");
    // exec, still alive, says what happened and cleans up after it.
    let st = exec.0.wait().unwrap();
    assert_eq!(st.code(), Some(125));
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn s3_kill_9_of_the_manager_ends_its_jobs_within_a_second() {
    require_root!();
    // The jobs reach the fake Azure DevOps in the network lab's fake internet.
    let lab = or_skip!(common::netlab::NetLab::new());
    let fake = common::fake_azure::FakeAzure::start_in(&lab);
    let h = TestHome::with_busybox("esc-sup-mgr");
    let tf = h.dir.join("pat");
    fs::write(&tf, format!("{}\n", fake.pat())).unwrap();
    let marker = unique("esc-supmgr");
    fake.enqueue_job(&stubborn_job(&marker));
    fake.enqueue_job(&stubborn_job(&marker));
    let log = fs::File::create(h.dir.join("manager.log")).unwrap();
    let mut mgr = HostProc(
        h.lab_command(&lab)
            .args(["run", "--pool", "gpu", "--url", &fake.url(), "--token-file", tf.to_str().unwrap()])
            .args(["--agents", "2", "--gpus-per-agent", "none", "--rootfs", "bb", "--name-prefix", "escsup"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let log = || fs::read_to_string(h.dir.join("manager.log")).unwrap_or_default();
    // Both slots' jobs: 3 processes each.
    wait_until("both jobs to start", Duration::from_secs(120), || {
        processes_matching(&marker).len() >= 6 || mgr.0.try_wait().unwrap().is_some()
    });
    assert!(mgr.0.try_wait().unwrap().is_none(), "manager exited: {}", log());
    mgr.0.kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    mgr.0.wait().unwrap();
    assert_gone_within(&marker, killed, "the manager");
    // A slot's next sandbox, prepared but never started, ran no job code: its container
    // init waits inside libcontainer until gc (the next `run` starts with one) removes it.
    let out = h.run(&["gc"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_until("this home's processes to be gone", Duration::from_secs(10), || {
        processes_matching(h.dir.to_str().unwrap()).is_empty()
    });
}

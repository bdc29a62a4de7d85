//! Queue-driven autoscaling end to end against the fake Azure DevOps: `run --autoscale`
//! on this host (real sandboxes: root), and `slurm` against stub `sbatch`/`squeue`/
//! `scancel`/`sacct` scripts that record their calls and play the batch jobs' states.
//! A real single-node Slurm is opt-in: `AZP_SANDBOX_HEAVY_TESTS=1` after
//! `scripts/setup-slurm.sh`.

mod common;
use common::fake_azure::FakeAzure;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Polls `f` every 100 ms until it is Some or `secs` pass.
fn wait_for<T>(secs: u64, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

const OURS: &[&str] = &["azp_sandbox_rootfs -equals bb", "Agent.Version -gtVersion 2.0"];
const NOT_OURS: &[&str] = &["cuda_version -equals 99.9"];

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn autoscale_serves_exactly_the_matching_jobs_then_scales_to_zero() {
    require_root!();
    let lab = or_skip!(common::netlab::NetLab::new());
    let fake = FakeAzure::start_in(&lab);
    let h = TestHome::with_busybox("autoscale");
    let tf = token_file(&h, &fake.pat());
    // One job runs longer than the idle timeout: its agent must not be stopped under it.
    let ours: Vec<u64> = ["sleep 6; echo long", "sleep 3; echo two", "sleep 3; echo three"]
        .iter()
        .map(|s| fake.enqueue_job_with_demands(s, OURS))
        .collect();
    let not_ours: Vec<u64> = (0..2).map(|_| fake.enqueue_job_with_demands("echo never", NOT_OURS)).collect();

    let log = h.dir.join("manager.log");
    let child = h
        .lab_command(&lab)
        .args(["run", "--pool", "gpu", "--url", &fake.url(), "--token-file", tf.to_str().unwrap()])
        .args(["--autoscale", "--min-agents", "0", "--max-agents", "2", "--idle-timeout", "3", "--poll-interval", "1"])
        .args(["--gpus-per-agent", "none", "--rootfs", "bb", "--name-prefix", "asc", "--drain-timeout", "20"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mgr = ManagerProc { child, log };

    // The placeholder is registered, offline, with what the slots advertise.
    let ph =
        wait_for(30, || fake.agent("asc-placeholder")).unwrap_or_else(|| panic!("no placeholder; log:\n{}", mgr.log()));
    assert_eq!(ph.status, "offline");
    assert_eq!(ph.capabilities.get("azp_sandbox_rootfs").map(String::as_str), Some("bb"), "{ph:?}");

    // Serve the three matching jobs; never more than 2 agents at once.
    let mut most = 0;
    let end = Instant::now() + Duration::from_secs(120);
    while fake.results().len() < 3 && Instant::now() < end {
        let slots: Vec<String> = fake.agents().into_iter().map(|a| a.name).filter(|n| n != "asc-placeholder").collect();
        assert!(slots.iter().all(|n| n == "asc-0" || n == "asc-1"), "{slots:?}");
        most = most.max(slots.len());
        std::thread::sleep(Duration::from_millis(100));
    }
    let results = fake.results();
    assert_eq!(results.len(), 3, "log:\n{}", mgr.log());
    assert_eq!(most, 2, "both slots were started");
    let mut served: Vec<u64> = results.iter().map(|r| r.job_id).collect();
    served.sort();
    assert_eq!(served, ours);
    for r in &results {
        assert_eq!(r.exit_code, Some(0), "{r:?}");
    }
    assert!(results.iter().any(|r| r.output == "long\n"), "the long job ran to its end: {results:?}");

    // Back to zero: only the placeholder left, no sandbox, the unmatched jobs still queued.
    let zero = wait_for(40, || {
        let names: Vec<String> = fake.agents().into_iter().map(|a| a.name).collect();
        let st: serde_json::Value = serde_json::from_slice(&std::fs::read(h.dir.join("status.json")).ok()?).ok()?;
        let off = st["slots"].as_array()?.iter().all(|s| s["state"] == "off");
        let jobs = std::fs::read_dir(h.jobs_dir()).map(|d| d.count()).unwrap_or(0);
        (names == ["asc-placeholder"] && off && jobs == 0).then_some(())
    });
    assert!(zero.is_some(), "not scaled back to zero: {:?}; log:\n{}", fake.agents(), mgr.log());
    assert_eq!(fake.queued_job_ids(), not_ours);
    assert_eq!(fake.results().len(), 3);

    // Decisions and why, in the log and in `status`.
    let text = mgr.log();
    assert!(text.contains("autoscale: scaled up 2 because 3 jobs wait for azp_sandbox_rootfs bb"), "{text}");
    assert!(
        text.contains("not scaling: max reached (2 of 2 agents running, 1 job waits for azp_sandbox_rootfs bb)"),
        "{text}"
    );
    assert!(text.contains("autoscale: scaled down"), "{text}");
    let status = h.ok(&["status"]);
    assert!(
        status.contains("autoscale min 0 max 2, idle timeout 3s")
            && status.contains("placeholder agent asc-placeholder"),
        "{status}"
    );
    assert!(status.contains("2 we cannot serve (cuda_version 99.9 (2): no capability cuda_version)"), "{status}");
    assert!(status.contains("decision"), "{status}");

    let st = mgr.stop();
    assert!(st.success(), "exit {st}");
    assert!(fake.agents().is_empty(), "records left: {:?}", fake.agents());
    h.assert_no_residue(&[]);
    assert!(processes_matching(h.dir.to_str().unwrap()).is_empty(), "processes left");
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn exit_when_idle_ends_run_after_its_jobs() {
    require_root!();
    let lab = or_skip!(common::netlab::NetLab::new());
    let fake = FakeAzure::start_in(&lab);
    let h = TestHome::with_busybox("exit-idle");
    let tf = token_file(&h, &fake.pat());
    let job = fake.enqueue_job("sleep 4; echo done");
    let log = h.dir.join("manager.log");
    let started = Instant::now();
    let child = h
        .lab_command(&lab)
        .args(["run", "--pool", "gpu", "--url", &fake.url(), "--token-file", tf.to_str().unwrap()])
        .args([
            "--agents",
            "1",
            "--gpus-per-agent",
            "none",
            "--rootfs",
            "bb",
            "--name-prefix",
            "eid",
            "--exit-when-idle",
            "3",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut p = ManagerProc { child, log };
    let st = wait_for(60, || p.child.try_wait().unwrap())
        .unwrap_or_else(|| panic!("run did not exit when idle; log:\n{}", p.log()));
    assert!(st.success(), "exit {st}; log:\n{}", p.log());
    // The job (longer than the idle time) ran to its end before the exit.
    let r = fake.results();
    assert_eq!(r.len(), 1, "log:\n{}", p.log());
    assert_eq!((r[0].job_id, r[0].exit_code, r[0].output.as_str()), (job, Some(0), "done\n"));
    assert!(started.elapsed() >= Duration::from_secs(7), "4 s job + 3 s idle");
    assert!(p.log().contains("no job for 3s (--exit-when-idle): stopping"), "{}", p.log());
    assert!(fake.agents().is_empty(), "{:?}", fake.agents());
    h.assert_no_residue(&[]);
}

// --- Slurm, through stub commands ---

const STUB_SBATCH: &str = r#"#!/bin/sh
d=$STUB_STATE
n=$(cat "$d/next" 2>/dev/null || echo 101)
echo $((n + 1)) > "$d/next"
comment=
for a in "$@"; do case "$a" in --comment=*) comment=${a#--comment=} ;; esac; script=$a; done
echo "$*" >> "$d/sbatch.log"
cp "$script" "$d/script-$n.sh"
printf '%s' "$comment" > "$d/job-$n.comment"
echo PENDING > "$d/job-$n.state"
echo "$n"
"#;

const STUB_SQUEUE: &str = r#"#!/bin/sh
d=$STUB_STATE
echo "$*" >> "$d/squeue.log"
for f in "$d"/job-*.state; do
    [ -e "$f" ] || continue
    id=${f##*/job-}; id=${id%.state}
    st=$(cat "$f")
    case "$st" in
        PENDING) printf '%s|%s|%s|%s|%s\n' "$id" "$st" Resources "" "$(cat "$d/job-$id.comment")" ;;
        RUNNING) printf '%s|%s|%s|%s|%s\n' "$id" "$st" None node1 "$(cat "$d/job-$id.comment")" ;;
    esac
done
"#;

const STUB_SCANCEL: &str = r#"#!/bin/sh
d=$STUB_STATE
for id in "$@"; do echo "$id" >> "$d/scancel.log"; echo CANCELLED > "$d/job-$id.state"; done
"#;

const STUB_SACCT: &str = r#"#!/bin/sh
d=$STUB_STATE
for a in "$@"; do case "$a" in --jobs=*) id=${a#--jobs=} ;; esac; done
echo "$*" >> "$d/sacct.log"
printf '%s|%s|0:0|00:10:02|node1\n' "$id" "$(cat "$d/job-$id.state")"
printf '%s.batch|CANCELLED|0:15|00:10:03|node1\n' "$id"
"#;

struct Stubs {
    bin: PathBuf,
    state: PathBuf,
}

impl Stubs {
    fn new(h: &TestHome) -> Stubs {
        use std::os::unix::fs::PermissionsExt;
        let bin = h.dir.join("stub-bin");
        let state = h.dir.join("stub-state");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        for (name, text) in
            [("sbatch", STUB_SBATCH), ("squeue", STUB_SQUEUE), ("scancel", STUB_SCANCEL), ("sacct", STUB_SACCT)]
        {
            let p = bin.join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Stubs { bin, state }
    }
    fn lines(&self, file: &str) -> Vec<String> {
        std::fs::read_to_string(self.state.join(file)).unwrap_or_default().lines().map(str::to_owned).collect()
    }
    fn set_state(&self, id: u64, st: &str) {
        std::fs::write(self.state.join(format!("job-{id}.state")), format!("{st}\n")).unwrap();
    }
}

/// `azp-sandbox slurm` for pool gpu of `fake`, agents named `<prefix>-...`.
fn slurm_command(h: &TestHome, fake: &FakeAzure, prefix: &str) -> std::process::Command {
    let tf = token_file(h, &fake.pat());
    let mut c = h.command();
    c.args([
        "slurm",
        "--pool",
        "gpu",
        "--url",
        &fake.url(),
        "--token-file",
        tf.to_str().unwrap(),
        "--name-prefix",
        prefix,
    ]);
    c
}

fn start_slurm(h: &TestHome, fake: &FakeAzure, stubs: &Stubs, max_jobs: &str) -> ManagerProc {
    let log = h.dir.join("slurm.log");
    let path = format!("{}:{}", stubs.bin.display(), std::env::var("PATH").unwrap_or_default());
    let child = slurm_command(h, fake, "login")
        .env("PATH", path)
        .env("STUB_STATE", &stubs.state)
        .args([
            "--partition",
            "gpu",
            "--max-jobs",
            max_jobs,
            "--gpus-per-job",
            "1",
            "--rootfs",
            "bb",
            "--poll-interval",
            "1",
        ])
        .args(["--idle-timeout", "120", "--sbatch-arg=--time=00:10:00", "--remote-exe", "/opt/azp/azp-sandbox"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    ManagerProc { child, log }
}

fn queue_five(fake: &FakeAzure) -> (Vec<u64>, Vec<u64>) {
    let ours = (0..3).map(|_| fake.enqueue_job_with_demands("echo hi", OURS)).collect();
    let not_ours = (0..2).map(|_| fake.enqueue_job_with_demands("echo never", NOT_OURS)).collect();
    (ours, not_ours)
}

#[test]
fn slurm_submits_one_batch_job_per_matching_job_and_cancels_surplus() {
    let fake = FakeAzure::start();
    let h = TestHome::new("slurm-stub");
    let stubs = Stubs::new(&h);
    let (ours, _) = queue_five(&fake);
    let p = start_slurm(&h, &fake, &stubs, "8");

    // Three jobs wait for us, two for nobody here: three batch jobs, not five.
    assert!(wait_for(30, || (stubs.lines("sbatch.log").len() >= 3).then_some(())).is_some(), "log:\n{}", p.log());
    // Logged once the third sbatch returned (its stub wrote sbatch.log before).
    let said = "slurm: submitted 3 batch jobs because 3 jobs wait for azp_sandbox_rootfs bb";
    assert!(wait_for(15, || p.log().contains(said).then_some(())).is_some(), "{}", p.log());
    std::thread::sleep(Duration::from_millis(2500));
    let sb = stubs.lines("sbatch.log");
    assert_eq!(sb.len(), 3, "{sb:?}\nlog:\n{}", p.log());
    for a in &sb {
        for want in [
            "--job-name=azp-sandbox",
            "--partition=gpu",
            "--gres=gpu:1",
            "--time=00:10:00",
            "--comment=azp-sandbox pool=gpu prefix=login",
        ] {
            assert!(a.contains(want), "{want} missing: {a}");
        }
    }
    let script = std::fs::read_to_string(stubs.state.join("script-101.sh")).unwrap();
    assert!(script.contains("exec /opt/azp/azp-sandbox run --pool gpu"), "{script}");
    assert!(
        script.contains("--agents 1 --gpus-per-agent 1 --exit-when-idle 120") && script.contains("--rootfs bb"),
        "{script}"
    );
    assert!(script.contains("--name-prefix \"login-j${SLURM_JOB_ID}\""), "{script}");
    let ph = fake.agent("login-placeholder").expect("placeholder");
    assert_eq!(ph.capabilities.get("azp_sandbox_rootfs").map(String::as_str), Some("bb"));
    assert!(
        p.log().contains("slurm: submitted 3 batch jobs because 3 jobs wait for azp_sandbox_rootfs bb"),
        "{}",
        p.log()
    );
    assert!(stubs.lines("scancel.log").is_empty());

    // 101 starts; two of the three jobs get served elsewhere: one waits, and 101's idle
    // agent will take it, so both pending jobs are surplus.
    stubs.set_state(101, "RUNNING");
    // Both at once: a queue read between two calls would cancel 103 first, then 102.
    fake.finish_jobs_elsewhere(&ours[..2], "succeeded");
    let cancelled = wait_for(15, || {
        let c = stubs.lines("scancel.log");
        (c.len() >= 2).then_some(c)
    });
    let mut cancelled = cancelled.unwrap_or_else(|| panic!("no scancel; log:\n{}", p.log()));
    cancelled.sort();
    assert_eq!(cancelled, ["102", "103"], "only the pending ones, newest first");
    // Logged once scancel returned (its stub wrote scancel.log before).
    let said = "cancelled 2 pending batch jobs not needed: 1 job waits";
    assert!(wait_for(15, || p.log().contains(said).then_some(())).is_some(), "{}", p.log());

    // 101 hits its time limit: reported as such, and the waiting job gets a new batch job.
    stubs.set_state(101, "TIMEOUT");
    assert!(
        wait_for(15, || p
            .log()
            .contains("batch job 101 on node1 was killed at its Slurm time limit (TIMEOUT after 00:10:02)")
            .then_some(()))
        .is_some(),
        "log:\n{}",
        p.log()
    );
    assert!(wait_for(15, || (stubs.lines("sbatch.log").len() == 4).then_some(())).is_some(), "log:\n{}", p.log());
    // Served elsewhere: the new pending one is cancelled, nothing more is submitted.
    fake.finish_job_elsewhere(ours[2], "succeeded");
    assert!(
        wait_for(15, || stubs.lines("scancel.log").contains(&"104".to_string()).then_some(())).is_some(),
        "log:\n{}",
        p.log()
    );
    std::thread::sleep(Duration::from_millis(2000));
    assert_eq!(stubs.lines("sbatch.log").len(), 4);
    let status = h.ok(&["status", "--slurm"]);
    assert!(status.contains("slurm     min 0 max 8") && status.contains("2 we cannot serve"), "{status}");

    let st = p.stop();
    assert!(st.success(), "exit {st}");
    assert!(fake.agents().is_empty(), "placeholder left: {:?}", fake.agents());
}

#[test]
fn slurm_stops_at_max_jobs_and_cancels_pending_at_exit() {
    let fake = FakeAzure::start();
    let h = TestHome::new("slurm-max");
    let stubs = Stubs::new(&h);
    queue_five(&fake);
    let p = start_slurm(&h, &fake, &stubs, "2");
    assert!(wait_for(30, || (stubs.lines("sbatch.log").len() >= 2).then_some(())).is_some(), "log:\n{}", p.log());
    assert!(
        wait_for(10, || p
            .log()
            .contains("not submitting: max reached (2 of 2 batch jobs, 3 jobs wait for azp_sandbox_rootfs bb)")
            .then_some(()))
        .is_some(),
        "{}",
        p.log()
    );
    assert_eq!(stubs.lines("sbatch.log").len(), 2);
    let st = p.stop();
    assert!(st.success(), "exit {st}");
    let mut c = stubs.lines("scancel.log");
    c.sort();
    assert_eq!(c, ["101", "102"], "pending batch jobs are cancelled when the command stops");
    assert!(fake.agents().is_empty());
}

/// A real single-node Slurm (scripts/setup-slurm.sh) runs one batch job that serves a
/// job of the fake Azure DevOps and exits when idle.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: installs and runs a real Slurm (CI runs the suite as root)")]
fn real_slurm_runs_a_batch_job_that_serves_a_job() {
    if std::env::var("AZP_SANDBOX_HEAVY_TESTS").as_deref() != Ok("1") {
        return skip("set AZP_SANDBOX_HEAVY_TESTS=1 (after sudo scripts/setup-slurm.sh) for the real Slurm test");
    }
    require_root!();
    let out = std::process::Command::new(repo().join("scripts/setup-slurm.sh")).output().unwrap();
    assert!(out.status.success(), "setup-slurm.sh failed: {}", String::from_utf8_lossy(&out.stderr));
    let fake = FakeAzure::start();
    let h = TestHome::with_busybox("slurm-real");
    let job = fake.enqueue_job_with_demands("echo served by $AGENT_NAME", OURS);
    let log = h.dir.join("slurm.log");
    let child = slurm_command(&h, &fake, "real")
        .args([
            "--partition",
            "debug",
            "--max-jobs",
            "1",
            "--gpus-per-job",
            "0",
            "--rootfs",
            "bb",
            "--poll-interval",
            "2",
        ])
        .args(["--idle-timeout", "10", "--remote-home"])
        .arg(&h.dir)
        .args(["--sbatch-arg=--time=00:05:00"])
        // The fake server is on this host's loopback, which jobs with a network of their
        // own cannot reach; the batch job runs under the real Slurm, out of the test's lab.
        .arg("--run-arg=--network=host")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let p = ManagerProc { child, log };
    let r = fake.wait_results(1, Duration::from_secs(240));
    assert_eq!(r.len(), 1, "log:\n{}", p.log());
    assert_eq!((r[0].job_id, r[0].exit_code), (job, Some(0)));
    assert!(r[0].output.starts_with("served by real-j"), "{:?}", r[0].output);
    // The batch job exits by itself when idle, and the command sees it end.
    assert!(
        wait_for(120, || p.log().contains("completed after").then_some(())).is_some(),
        "batch job did not end; log:\n{}",
        p.log()
    );
    let st = p.stop();
    assert!(st.success());
    assert!(fake.agents().is_empty(), "{:?}", fake.agents());
    h.assert_no_residue(&[]);
    let _ = Path::new("/");
}

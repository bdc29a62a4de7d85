//! Caches (issue 24): each job sees a copy-on-write view of a cache's snapshot; only a
//! commit changes what later jobs see. Root pass: jobs with ids of their own (idmapped
//! snapshots); rootless pass (scripts/test.sh): the same tests as the ordinary user.

mod common;
use common::*;
use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Output, Stdio};
use std::time::Duration;

fn job(h: &TestHome, cache: &str, script: &str) -> std::process::Command {
    let mut c = h.command();
    c.args(["-q", "exec", "--rootfs", "bb", "--network", "none", "-u", "1000:1000", "--cache", cache]);
    c.args(["--", "sh", "-c", script]);
    c
}

fn run(h: &TestHome, cache: &str, script: &str) -> String {
    let out: Output = job(h, cache, script).output().unwrap();
    assert!(out.status.success(), "job failed: {script}\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn snapshot(h: &TestHome, name: &str) -> u64 {
    let link = std::fs::read_link(h.dir.join("caches").join(name).join("current")).unwrap();
    link.file_name().unwrap().to_str().unwrap().parse().unwrap()
}

/// Starts a job that runs `first`, says ready, waits for a line on stdin, then runs `then`.
fn start_waiting(
    h: &TestHome,
    cache: &str,
    first: &str,
    then: &str,
) -> (Child, std::io::BufReader<std::process::ChildStdout>) {
    let mut child = job(h, cache, &format!("{first}\necho ready\nread go\n{then}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut r = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while line != "ready\n" {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "the waiting job ended before ready");
    }
    (child, r)
}

fn finish(mut child: Child, mut out: std::io::BufReader<std::process::ChildStdout>) -> String {
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    rest
}

#[test]
fn a_commit_is_seen_by_the_next_job_and_nothing_else_is() {
    require_root!();
    let h = TestHome::with_busybox("cache-seen");
    run(&h, "pip:/cache:commit", "echo one > /cache/a && mkdir /cache/d && echo f > /cache/d/f");
    assert_eq!(snapshot(&h, "pip"), 2);
    // A job that may not commit reads it, deletes and writes: none of it stays.
    let out = run(&h, "pip:/cache", "cat /cache/a; rm -rf /cache/a /cache/d; echo pr > /cache/pr; ls /cache");
    assert_eq!(out, "one\npr\n");
    let out = run(&h, "pip:/cache", "cat /cache/a /cache/d/f; ls /cache; stat -c %u:%g /cache/a");
    assert_eq!(out, "one\nf\na\nd\n1000:1000\n", "the deletions and the write are gone; the owner is the job user");
    assert_eq!(snapshot(&h, "pip"), 2);
    if !rootless() {
        // Stored as the ids the job saw, not its block of host ids (mapped back at commit).
        use std::os::unix::fs::MetadataExt;
        let stored = std::fs::metadata(h.dir.join("caches/pip/snapshots/2/a")).unwrap();
        assert_eq!((stored.uid(), stored.gid()), (1000, 1000));
    }
    let ls = h.ok(&["cache", "ls", "--json"]);
    let v: serde_json::Value = serde_json::from_str(ls.lines().next().unwrap()).unwrap();
    assert_eq!(
        (v["name"].as_str(), v["snapshot"].as_u64(), v["hits"].as_u64()),
        (Some("pip"), Some(2), Some(2)),
        "{ls}"
    );
    assert!(v["last_committer"].as_str().unwrap().starts_with("exec-"), "{ls}");
    // The job's own upper went with it: nothing but the one snapshot left after gc.
    h.ok(&["cache", "gc"]);
    let snaps: Vec<_> =
        std::fs::read_dir(h.dir.join("caches/pip/snapshots")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(snaps, ["2"]);
    h.assert_no_residue(&[]);
}

#[test]
fn a_running_job_keeps_its_snapshot_and_never_sees_another_jobs_writes() {
    require_root!();
    let h = TestHome::with_busybox("cache-conc");
    run(&h, "c:/cache:commit", "echo 1 > /cache/v");
    // An untrusted job writes and waits; meanwhile another job commits a change.
    let (pr, out) =
        start_waiting(&h, "c:/cache", "echo evil > /cache/v; echo x > /cache/pr", "cat /cache/v; ls /cache");
    let seen = run(&h, "c:/cache", "cat /cache/v; ls /cache");
    assert_eq!(seen, "1\nv\n", "a concurrent job does not see the running job's writes");
    run(&h, "c:/cache:commit", "echo 2 > /cache/v; echo n > /cache/new");
    assert_eq!(finish(pr, out), "evil\npr\nv\n", "the running job keeps its own view of the old snapshot");
    assert_eq!(
        run(&h, "c:/cache", "cat /cache/v; ls /cache"),
        "2\nnew\nv\n",
        "the next job: the commit, not the writes"
    );
    // The old snapshot, held while that job ran, is collected once it ended.
    h.ok(&["cache", "gc"]);
    assert!(!h.dir.join("caches/c/snapshots/2").exists());
}

#[test]
fn concurrent_commits_serialize() {
    require_root!();
    let h = TestHome::with_busybox("cache-serial");
    let jobs: Vec<Child> = (0..3)
        .map(|k| {
            job(&h, "c:/cache:commit", &format!("for i in $(seq 200); do echo {k} > /cache/f{k}-$i; done"))
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut j in jobs {
        assert!(j.wait().unwrap().success());
    }
    assert_eq!(snapshot(&h, "c"), 4, "three commits, one after the other");
    let n = run(&h, "c:/cache", "ls /cache | wc -l");
    assert_eq!(n.trim(), "600", "every commit's files: none lost to another");
}

#[test]
fn kill_9_during_a_commit_leaves_the_old_snapshot() {
    require_root!();
    let h = TestHome::with_busybox("cache-kill");
    run(&h, "c:/cache:commit", "echo base > /cache/base");
    let building = |h: &TestHome| {
        std::fs::read_dir(h.dir.join("caches/c/snapshots"))
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
    };
    let mut caught = false;
    for files in [20_000, 60_000] {
        let mut c =
            job(&h, "c:/cache:commit", &format!("mkdir /cache/many; cd /cache/many; seq {files} | xargs touch"));
        c.process_group(0).stdout(Stdio::null()).stderr(Stdio::null());
        let mut child = c.spawn().unwrap();
        let pgid = child.id() as i32;
        while child.try_wait().unwrap().is_none() {
            if building(&h) {
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
                caught = true;
                break;
            }
            std::thread::sleep(Duration::from_micros(300));
        }
        let _ = child.wait();
        if caught {
            break;
        }
        // Too fast to catch: undo it and try a bigger one.
        run(&h, "c:/cache:commit", "rm -rf /cache/many");
    }
    if !caught {
        return skip("the commit finished before the test could kill it (60000 files)");
    }
    let snap = snapshot(&h, "c");
    let out = run(&h, "c:/cache", "cat /cache/base; ls /cache");
    assert_eq!(out, "base\nbase\n", "the old snapshot, whole (snapshot {snap})");
    // The killed commit's tree goes with the next gc.
    h.ok(&["gc"]);
    h.ok(&["cache", "gc"]);
    assert!(!building(&h), "the half-built snapshot is collected");
}

#[test]
fn bad_cache_input_is_one_line() {
    require_root!();
    let h = TestHome::with_busybox("cache-bad");
    let err = |args: &[&str]| {
        let out = h.run(args);
        assert!(!out.status.success(), "{args:?}");
        // The first line says it all (clap adds a line pointing at --help).
        let e = String::from_utf8_lossy(&out.stderr).into_owned();
        e.lines().next().unwrap_or_default().to_string()
    };
    let e = err(&["exec", "--rootfs", "bb", "--cache", "pip:cache", "true"]);
    assert!(e.contains("must be absolute and inside the job's tree"), "{e}");
    let e = err(&["exec", "--rootfs", "bb", "--cache", "pip:/a/../../etc", "true"]);
    assert!(e.contains("inside the job's tree"), "{e}");
    let e = err(&["exec", "--rootfs", "bb", "--cache", "pip", "true"]);
    assert!(e.contains("use NAME:PATH[:commit]"), "{e}");
    let e = err(&["cache", "rm", "nope"]);
    assert!(e.contains("unknown cache 'nope'"), "{e}");
    let e = err(&["exec", "--rootfs", "bb", "--cache", "a:/x", "--cache", "b:/x/y", "true"]);
    assert!(e.contains("caches 'a' (/x) and 'b' (/x/y) overlap"), "{e}");
    // (A cache dir overlayfs refuses: the helper's unit test, on the sys double.)
}

/// `run` of one agent named `PREFIX-0` against `fake` in `lab`, with `config` as its
/// config file (owned by the test user in the rootless pass, as its token file).
fn one_agent_run(
    lab: &netlab::NetLab,
    fake: &common::fake_azure::FakeAzure,
    h: &TestHome,
    config: &str,
    prefix: &str,
) -> ManagerProc {
    let tf = token_file(h, &fake.pat());
    let config_file = h.dir.join("config.toml");
    std::fs::write(&config_file, config).unwrap();
    if let Some(u) = test_user() {
        for f in [&tf, &config_file] {
            nix::unistd::chown(f, Some(u.uid), Some(u.gid)).unwrap();
        }
    }
    let mut cmd = h.lab_command(lab);
    cmd.args(["run", "--config", config_file.to_str().unwrap(), "--pool", "gpu", "--url", &fake.url()])
        .args(["--token-file", tf.to_str().unwrap()])
        .args(["--agents", "1", "--gpus-per-agent", "none", "--rootfs", "bb", "--name-prefix", prefix]);
    ManagerProc::spawn(cmd, h.dir.join("manager.log"))
}

#[test]
fn run_commits_a_trusted_build_and_never_a_pull_request() {
    require_root!();
    let lab = or_skip!(netlab::NetLab::new());
    let fake = common::fake_azure::FakeAzure::start_in(&lab);
    let h = TestHome::with_busybox("cache-run");
    let config = "trusted_branches = [\"refs/heads/main\", \"refs/heads/release/*\"]\n\
                  [[cache]]\nname = \"pip\"\npath = \"/cache/pip\"\nmax_size = \"1G\"\n";
    let mgr = one_agent_run(&lab, &fake, &h, config, "cachehost");
    let look = "echo seen=$(ls /cache/pip | tr '\\n' ' ')";
    // One agent: the jobs run one after the other, in this order.
    let steps = [
        ("refs/pull/7/merge", "pullRequest", "pr"),
        ("refs/heads/main", "individualCI", "main"),
        ("refs/heads/feature", "individualCI", "feature"),
        ("refs/heads/main", "pullRequest", "main-pr"),
        ("refs/heads/release/2", "manual", "release"),
    ];
    for (k, (branch, reason, name)) in steps.into_iter().enumerate() {
        let script = format!("{look}\necho {name} > /cache/pip/{name}\n[ {name} = main ] || rm -f /cache/pip/main");
        fake.enqueue_build_job(&script, &[], branch, reason);
        let got = fake.wait_results(k + 1, Duration::from_secs(90));
        assert_eq!(got.len(), k + 1, "job {name} did not run: {}", mgr.log());
    }
    fake.enqueue_job(look);
    let results = fake.wait_results(6, Duration::from_secs(90));
    assert_eq!(results.len(), 6, "{}", mgr.log());
    let seen: Vec<String> = results
        .iter()
        .map(|r| r.output.lines().find_map(|l| l.strip_prefix("seen=")).unwrap_or("?").trim().to_string())
        .collect();
    assert_eq!(
        seen,
        [
            "",        // cold
            "",        // the pull request's write is gone
            "main",    // main committed (its own write)
            "main",    // a feature branch is not trusted: its write and its deletion are gone
            "main",    // a pull request build of main neither
            "release"  // a trusted release build: its write and its deletion of main
        ],
        "{}",
        mgr.log()
    );
    let log = mgr.log();
    assert!(log.contains("a pull request never writes caches"), "{log}");
    assert!(log.contains("not a trusted branch (refs/heads/main, refs/heads/release/*)"), "{log}");
    assert!(log.contains("cache pip: committed snapshot"), "{log}");
    let status = String::from_utf8_lossy(&h.run(&["status"]).stdout).into_owned();
    let row = status.lines().find(|l| l.trim_start().starts_with("pip ")).unwrap_or_else(|| panic!("{status}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1], "3", "two commits (main, release): {row}");
    assert!(cols.last().unwrap().starts_with("cachehost-0-"), "the last committer job: {row}");
    let st = mgr.stop();
    assert!(st.success(), "{st}");
    h.assert_no_residue(&[]);
}

/// A pull request's job reads its agent's credentials (readable in the sandbox, as on any
/// self-hosted agent), takes the next queued build of `main` as the agent, reports it
/// succeeded, and writes the cache. The agent's newest request is then a trusted build:
/// before, the manager committed the pull request's write on its word (found by a
/// red-team pass). Now the job's request must be the agent's only one since its run.sh
/// started: nothing is committed.
#[test]
fn a_job_that_takes_a_trusted_build_as_its_agent_commits_nothing() {
    require_root!();
    let lab = or_skip!(netlab::NetLab::new());
    let fake = common::fake_azure::FakeAzure::start_in(&lab);
    let h = TestHome::with_busybox("cache-steal");
    let mgr = one_agent_run(&lab, &fake, &h, "[[cache]]\nname = \"pip\"\npath = \"/cache/pip\"\n", "stealhost");
    let steal = r#"cd /azp/agent || exit 1
base=$(sed -n 's/.*"serverUrl": *"\([^"]*\)".*/\1/p' .agent)
name=$(sed -n 's/.*"agentName": *"\([^"]*\)".*/\1/p' .agent)
auth="Authorization: Bearer $(sed -n 's/.*"clientId": *"\([^"]*\)".*/\1/p' .credentials)"
job=$(wget -q -Y off -O - --header "$auth" "$base/_fake/jobs/next?agent=$name")
id=$(printf '%s' "$job" | sed -n 's/.*"jobId": *\([0-9][0-9]*\).*/\1/p')
echo stole=$id
: > /tmp/empty
wget -q -Y off -O /dev/null --header "$auth" --post-file /tmp/empty "$base/_fake/jobs/$id/result?agent=$name&exitCode=0"
echo evil > /cache/pip/evil"#;
    // Both queued before the agent asks: it takes the pull request's, whose job takes main's.
    fake.enqueue_build_job(steal, &[], "refs/pull/9/merge", "pullRequest");
    fake.enqueue_build_job("echo main ran", &[], "refs/heads/main", "individualCI");
    let got = fake.wait_results(2, Duration::from_secs(90));
    assert_eq!(got.len(), 2, "{}", mgr.log());
    assert!(got.iter().any(|r| r.output.contains("stole=")), "the job took the main build: {got:?}");
    fake.enqueue_job("echo seen=$(ls /cache/pip | tr '\\n' ' ')");
    let results = fake.wait_results(3, Duration::from_secs(90));
    assert_eq!(results.len(), 3, "{}", mgr.log());
    let seen = results[2].output.lines().find_map(|l| l.strip_prefix("seen=")).map(str::trim);
    assert_eq!(seen, Some(""), "the pull request's write was committed: {}", mgr.log());
    let log = mgr.log();
    assert!(log.contains("took 2 job requests in one sandbox"), "{log}");
    let st = mgr.stop();
    assert!(st.success(), "{st}");
    h.assert_no_residue(&[]);
}

/// A trusted job's commit runs after the slot's next agent has started: the commit is
/// held here on the cache's commit lock (as a concurrent commit would hold it), and the
/// next agent still configures; its job then waits for the commit and sees the new
/// snapshot. Told from the fake's registrations and the manager's log, not from timings.
#[test]
fn a_commit_does_not_hold_back_the_slots_refill() {
    require_root!();
    let lab = or_skip!(netlab::NetLab::new());
    let fake = common::fake_azure::FakeAzure::start_in(&lab);
    let h = TestHome::with_busybox("cache-refill");
    let mgr = one_agent_run(&lab, &fake, &h, "[[cache]]\nname = \"pip\"\npath = \"/cache/pip\"\n", "cacherefill");
    let registrations = || fake.agent("cacherefill-0").map(|a| a.registrations).unwrap_or(0);
    wait_until("the first agent", Duration::from_secs(60), || registrations() >= 1);
    // The store exists once a sandbox with the cache was made; its commit lock, held here.
    let store = h.dir.join("caches/pip");
    wait_until("the cache's store", Duration::from_secs(30), || store.join("snapshots").exists());
    let lock_path = store.join("commit.lock");
    let lock_file = std::fs::File::options().create(true).truncate(false).write(true).open(&lock_path).unwrap();
    if let Some(u) = test_user() {
        nix::unistd::chown(&lock_path, Some(u.uid), Some(u.gid)).unwrap();
    }
    let held = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive).unwrap();

    fake.enqueue_build_job("echo big > /cache/pip/from-main", &[], "refs/heads/main", "individualCI");
    assert_eq!(fake.wait_results(1, Duration::from_secs(90)).len(), 1, "{}", mgr.log());
    // The refill: the slot's next agent registers while the commit waits for the lock.
    wait_until("the next agent's registration", Duration::from_secs(60), || registrations() >= 2);
    wait_until("the next agent waiting for the commit", Duration::from_secs(60), || {
        mgr.log().contains("waiting for the previous job's cache commit")
    });
    // The commit thread asks Azure DevOps for the build first, then says it commits: that
    // line may come after the next agent's (seen once in a CI rehearsal).
    wait_until("the commit's start", Duration::from_secs(60), || mgr.log().contains("caches: committing (build "));
    let log = mgr.log();
    assert!(log.contains("caches: committing (build ") && log.contains("refs/heads/main"), "{log}");
    assert!(!log.contains("cache pip: committed snapshot"), "the commit was held: {log}");
    assert_eq!(snapshot(&h, "pip"), 1, "the old snapshot is current while the commit waits");

    drop(held);
    wait_until("the commit", Duration::from_secs(60), || mgr.log().contains("cache pip: committed snapshot 2"));
    fake.enqueue_job("echo seen=$(ls /cache/pip)");
    let r = fake.wait_results(2, Duration::from_secs(90));
    assert_eq!(r.len(), 2, "{}", mgr.log());
    assert!(r[1].output.contains("seen=from-main"), "the next job sees the new snapshot: {}", r[1].output);
    let log = mgr.log();
    let at = |needle: &str| log.find(needle).unwrap_or_else(|| panic!("no '{needle}' in: {log}"));
    assert!(at("waiting for the previous job's cache commit") < at("cache pip: committed snapshot 2"), "{log}");
    assert!(at("cache pip: committed snapshot 2") < at("the previous job's cache commit is over"), "{log}");
    let st = mgr.stop();
    assert!(st.success(), "{st}");
    h.assert_no_residue(&[]);
}

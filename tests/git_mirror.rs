//! The git mirror cache (issue 24) end to end: `run` in the network lab's fake host keeps a
//! bare mirror of a repository served over HTTP in the fake internet, and a job's `git
//! clone` of that repository takes its objects from the mirror (read-only, as git
//! alternates) instead of the remote. Counted by what the clone had to store itself: the
//! objects it fetched. Also: the timer refreshes the mirror, a failed fetch keeps it, and
//! a job cannot write it. Root pass, and the rootless pass of scripts/test.sh (the same
//! tests, `run` as the ordinary user `AZP_SANDBOX_TEST_USER`).

mod common;
use common::fake_azure::FakeAzure;
use common::real_agent::{self, Variant};
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const PORT: u16 = 8093;

/// A repository served over "dumb" HTTP by busybox httpd in the fake internet.
struct Upstream {
    httpd: Child,
    www: PathBuf,
    url: String,
}

impl Upstream {
    fn start(lab: &netlab::NetLab, dir: &Path) -> Result<Upstream, String> {
        let www = dir.join("www");
        std::fs::create_dir_all(&www).unwrap();
        // Small and quick here (the bench uses the big one): 20 commits, 4 MB.
        let st = Command::new(repo().join("scripts/fixtures/git-big-repo.py"))
            .arg(www.join("repo.git"))
            .args(["4", "20"])
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("needs python3 for scripts/fixtures/git-big-repo.py: {e}"))?;
        if !st.success() {
            return Err("scripts/fixtures/git-big-repo.py failed".into());
        }
        let httpd = Command::new("ip")
            .args(["netns", "exec", &lab.internet, "busybox", "httpd", "-f", "-p"])
            .arg(format!("{}:{PORT}", netlab::INTERNET_IP))
            .arg("-h")
            .arg(&www)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://{}:{PORT}/repo.git", netlab::INTERNET_IP);
        Ok(Upstream { httpd, www, url })
    }

    fn bare(&self) -> PathBuf {
        self.www.join("repo.git")
    }

    /// One more commit on main, loose (as a push leaves it), served at once.
    fn commit(&self, work: &Path) -> String {
        let _ = std::fs::remove_dir_all(work);
        git(None, &["clone", "-q", self.bare().to_str().unwrap(), work.to_str().unwrap()]);
        std::fs::write(work.join("new-file.txt"), "a commit the mirror does not have yet\n").unwrap();
        git(Some(work), &["add", "new-file.txt"]);
        git(Some(work), &["commit", "-q", "-m", "new"]);
        git(Some(work), &["push", "-q", "origin", "main"]);
        git(None, &["--git-dir", self.bare().to_str().unwrap(), "update-server-info"]);
        git(Some(work), &["rev-parse", "HEAD"])
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.httpd.kill();
        let _ = self.httpd.wait();
    }
}

fn git(dir: Option<&Path>, args: &[&str]) -> String {
    let mut c = Command::new("git");
    c.args(args).env("GIT_CONFIG_GLOBAL", "/dev/null").env("GIT_CONFIG_NOSYSTEM", "1");
    for (k, v) in [("GIT_AUTHOR_NAME", "t"), ("GIT_AUTHOR_EMAIL", "t@t"), ("GIT_COMMITTER_NAME", "t")] {
        c.env(k, v);
    }
    c.env("GIT_COMMITTER_EMAIL", "t@t");
    if let Some(d) = dir {
        c.current_dir(d);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The mirror's `main`, or "" before its first fetch.
fn mirror_head(home: &Path) -> String {
    let dirs: Vec<PathBuf> = std::fs::read_dir(home.join("git-mirrors"))
        .map(|r| r.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "git")).collect())
        .unwrap_or_default();
    assert!(dirs.len() <= 1, "{dirs:?}");
    let Some(d) = dirs.first() else { return String::new() };
    Command::new("git")
        .args(["--git-dir", d.to_str().unwrap(), "rev-parse", "-q", "--verify", "refs/heads/main"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// A job script: clones the repository (with or without the mirrors) and says what the
/// clone had to fetch and store itself.
fn clone_job(url: &str, with_mirror: bool) -> String {
    let unset = if with_mirror { "" } else { "unset GIT_ALTERNATE_OBJECT_DIRECTORIES; " };
    format!(
        "{unset}echo alternates=${{GIT_ALTERNATE_OBJECT_DIRECTORIES:-none}}\n\
         git clone -q {url} /tmp/clone && echo cloned\n\
         git -C /tmp/clone count-objects -v | sed 's/: /=/' | grep -E '^(count|in-pack)=' | sed 's/^/clone-/'\n\
         git -C /tmp/clone fsck --connectivity-only --no-progress && echo fsck-ok\n\
         echo head=$(git -C /tmp/clone rev-parse HEAD)\n"
    )
}

fn value(out: &str, key: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in: {out}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn jobs_clone_from_the_mirror_which_the_timer_refreshes_and_jobs_cannot_write() {
    require_root!();
    let lab = or_skip!(netlab::NetLab::new());
    let h = TestHome::new("gitmirror");
    let up = or_skip!(Upstream::start(&lab, &h.dir));
    let first_head = git(None, &["--git-dir", up.bare().to_str().unwrap(), "rev-parse", "main"]);
    let fake = FakeAzure::start_in(&lab);
    h.import(&real_agent::agent_rootfs_tar(), "agent");
    let pkg = real_agent::write_package(&h.dir, &Variant::default());
    let tf = token_file(&h, &fake.pat());
    let config = h.dir.join("config.toml");
    std::fs::write(&config, format!("[[git_mirror]]\nurl = \"{}\"\ninterval = \"10s\"\n", up.url)).unwrap();
    let cmd = {
        let mut c = h.lab_command(&lab);
        c.args([
            "run",
            "--config",
            config.to_str().unwrap(),
            "--pool",
            "gpu",
            "--url",
            &fake.url(),
            "--rootfs",
            "agent",
            "--gpus-per-agent",
            "none",
        ])
        .arg("--token-file")
        .arg(&tf)
        .arg("--agent-package")
        .arg(&pkg)
        .args(["--name-prefix", "gm", "--agents", "1", "--drain-timeout", "20"]);
        c
    };
    let mgr = ManagerProc::spawn(cmd, h.dir.join("manager.log"));
    wait_until("the mirror's first fetch", Duration::from_secs(60), || mirror_head(&h.dir) == first_head);
    // Rootless pass (scripts/test.sh): the manager, its keeper and the jobs ran as the
    // ordinary user, whose mirror this is.
    let mirrors = std::fs::metadata(h.dir.join("git-mirrors")).unwrap();
    let owner = test_user().map(|u| u.uid.as_raw()).unwrap_or(0);
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&mirrors), owner, "the mirror belongs to the manager's user");

    // With the mirror, then without it (the same clone, the alternates unset): what each
    // clone had to fetch itself.
    fake.enqueue_job(&format!(
        "{}\
         m=$(ls -d /opt/azp-git-mirrors/*.git)\n\
         touch $m/objects/written 2>/dev/null && echo WROTE-OBJECTS\n\
         echo evil > $m/refs/heads/evil 2>/dev/null && echo WROTE-REFS\n\
         git --git-dir $m update-ref refs/heads/main HEAD~1 2>/dev/null && echo MOVED-REF\n\
         echo mirror-mount=$(grep \" /opt/azp-git-mirrors/\" /proc/self/mountinfo | grep -c ' ro,')\n",
        clone_job(&up.url, true)
    ));
    fake.enqueue_job(&clone_job(&up.url, false));
    let r = fake.wait_results(2, Duration::from_secs(300));
    assert_eq!(r.len(), 2, "only {} of 2 jobs ran; manager log:\n{}", r.len(), mgr.log());
    let (warm, cold) = (&r[0].output, &r[1].output);
    for out in [warm, cold] {
        assert!(out.contains("cloned") && out.contains("fsck-ok"), "{out}");
        assert!(out.contains(&format!("head={first_head}")), "{out}");
    }
    assert!(warm.contains("alternates=/opt/azp-git-mirrors/repo-"), "{warm}");
    let fetched = |out: &str| value(out, "clone-count") + value(out, "clone-in-pack");
    eprintln!("objects the clone fetched itself: with the mirror {}, without {}", fetched(warm), fetched(cold));
    assert_eq!(fetched(warm), 0, "everything came from the mirror: {warm}");
    assert!(fetched(cold) >= 100, "a clone without the mirror fetches the history (20 commits): {cold}");
    for w in ["WROTE-OBJECTS", "WROTE-REFS", "MOVED-REF"] {
        assert!(!warm.contains(w), "the job wrote the mirror ({w}): {warm}");
    }
    assert!(warm.contains("mirror-mount=1"), "bound read-only: {warm}");

    // The timer: a new commit upstream reaches the mirror without any job.
    let new_head = up.commit(&h.dir.join("work"));
    wait_until("the timer's fetch of the new commit", Duration::from_secs(40), || mirror_head(&h.dir) == new_head);
    fake.enqueue_job(&clone_job(&up.url, true));
    let r = fake.wait_results(3, Duration::from_secs(120));
    assert_eq!(r.len(), 3, "{}", mgr.log());
    assert!(r[2].output.contains(&format!("head={new_head}")), "{}", r[2].output);
    assert_eq!(fetched(&r[2].output), 0, "the new commit came from the mirror: {}", r[2].output);

    // A failed fetch (the remote gone) logs one line and keeps the mirror as it was.
    drop(up);
    wait_until("a failed fetch's log line", Duration::from_secs(40), || {
        mgr.log().contains("the mirror is kept as it was")
    });
    assert_eq!(mirror_head(&h.dir), new_head);
    let line = mgr.log().lines().find(|l| l.contains("the mirror is kept as it was")).unwrap().to_string();
    assert!(line.contains("the remote cannot be reached"), "{line}");

    let st = mgr.stop();
    assert!(st.success(), "manager exit {st}; log:\n{}", std::fs::read_to_string(h.dir.join("manager.log")).unwrap());
    assert!(mirror_head(&h.dir) == new_head, "the mirror outlives the manager");
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: the network lab")]
fn an_unreachable_remote_at_start_is_one_line() {
    require_root!();
    let lab = or_skip!(netlab::NetLab::new());
    let h = TestHome::new("gitmirror-unreach");
    let fake = FakeAzure::start_in(&lab);
    h.import(&busybox_tar(), "bb");
    let tf = token_file(&h, &fake.pat());
    let config = h.dir.join("config.toml");
    // Nothing listens on this port of the fake internet.
    let url = format!("http://{}:8094/nothing.git", netlab::INTERNET_IP);
    std::fs::write(&config, format!("[[git_mirror]]\nurl = \"{url}\"\n")).unwrap();
    let out = h
        .lab_command(&lab)
        .args([
            "run",
            "--config",
            config.to_str().unwrap(),
            "--pool",
            "gpu",
            "--url",
            &fake.url(),
            "--rootfs",
            "bb",
            "--gpus-per-agent",
            "none",
        ])
        .arg("--token-file")
        .arg(&tf)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let line = err.lines().rev().find(|l| l.contains("git_mirror")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains(&url) && line.contains("cannot be reached"), "{line}");
    assert!(!h.dir.join("git-mirrors").join("nothing").exists());
}

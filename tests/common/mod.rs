//! Shared helpers of the integration tests: a private home per test, fixtures built once
//! (busybox rootfs, Debian minbase), and residue checks.
#![allow(dead_code)]
pub mod digest;
pub mod fake_azure;
pub mod netlab;
pub mod pty;
pub mod real_agent;
pub mod registry;
pub mod skip;

#[allow(unused_imports)] // not every test binary skips
pub use skip::{skip, skip_part};

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_azp-sandbox"))
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Skips (returns from) a test that needs root, visibly (see [`skip`]). Such tests are
/// also `#[cfg_attr(not(test_as_root), ignore = "needs root: ...")]`; this catches a
/// build made as root and run as another user. CI runs as root.
#[macro_export]
macro_rules! require_root {
    () => {
        if !common::is_root() {
            return common::skip::skip("needs root: creates real sandboxes (CI runs the suite as root)");
        }
    };
}

/// The value of a `Result<T, String>` whose error says why the test cannot run here;
/// on an error the test is skipped, visibly (see [`skip`]).
#[macro_export]
macro_rules! or_skip {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(why) => return common::skip::skip(why),
        }
    };
}

/// Fixture dir shared by all test runs (cached across runs).
pub fn fixtures() -> PathBuf {
    // Next to the test temp dir, so a CARGO_TARGET_DIR elsewhere (the rootless pass of
    // scripts/test.sh, for a checkout other users cannot reach) gets its own fixtures.
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().join("fixtures");
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn busybox_tar() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let out = fixtures().join("busybox-rootfs.tar");
        if !out.exists() {
            let st = Command::new(repo().join("scripts/make-busybox-rootfs.sh")).arg(&out).status().unwrap();
            assert!(st.success(), "make-busybox-rootfs.sh failed");
        }
        out
    })
    .clone()
}

/// The busybox fixture plus bash (Debian's static `bash-static`, as `/bin/bash`): for
/// scripts that must be bash, as the real agent's `run.sh`. An error (why, for
/// [`or_skip!`]) when bash-static is not installed (scripts/setup.sh installs it).
pub fn busybox_bash_tar() -> Result<PathBuf, String> {
    static P: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    P.get_or_init(|| {
        let bash = Path::new("/bin/bash-static");
        let bytes = std::fs::read(bash).map_err(|e| {
            format!("{} is missing ({e}): apt-get install bash-static (scripts/setup.sh)", bash.display())
        })?;
        let out =
            fixtures().join(format!("busybox-bash-rootfs-{}.tar", digest::sha256_hex(&bytes).get(..12).unwrap_or("")));
        if out.exists() {
            return Ok(out);
        }
        let mut b = tar::Builder::new(Vec::new());
        let mut src = tar::Archive::new(std::fs::File::open(busybox_tar()).unwrap());
        for e in src.entries().unwrap() {
            let mut e = e.unwrap();
            let h = e.header().clone();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            b.append(&h, &data[..]).unwrap();
        }
        let mut h = tar::Header::new_gnu();
        h.set_path("./bin/bash").unwrap();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o755);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        b.append(&h, &bytes[..]).unwrap();
        let tmp = out.with_extension(format!("tmp-{}", std::process::id()));
        std::fs::write(&tmp, b.into_inner().unwrap()).unwrap();
        std::fs::rename(&tmp, &out).unwrap();
        Ok(out)
    })
    .clone()
}

pub fn debian_tar() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let out = fixtures().join("debian-bookworm-minbase.tar.zst");
        let st = Command::new(repo().join("scripts/make-debian-rootfs.sh")).arg(&out).status().unwrap();
        assert!(st.success(), "make-debian-rootfs.sh failed");
        out
    })
    .clone()
}

/// Rootless runs of the suites: with `AZP_SANDBOX_TEST_USER=NAME` (and the tests running
/// as root) every azp-sandbox command runs as that ordinary user, which must have
/// subordinate ids (scripts/setup.sh creates `azp-rootless`); test homes belong to it.
pub fn test_user() -> Option<nix::unistd::User> {
    static U: OnceLock<Option<nix::unistd::User>> = OnceLock::new();
    U.get_or_init(|| {
        let name = std::env::var("AZP_SANDBOX_TEST_USER").ok().filter(|n| !n.is_empty())?;
        let user = nix::unistd::User::from_name(&name)
            .unwrap()
            .unwrap_or_else(|| panic!("AZP_SANDBOX_TEST_USER={name}: no such user"));
        assert!(is_root(), "AZP_SANDBOX_TEST_USER needs the tests to run as root (they switch to the user)");
        Some(user)
    })
    .clone()
}

/// True when the suites run azp-sandbox rootless (see [`test_user`]).
pub fn rootless() -> bool {
    test_user().is_some()
}

/// The environment of an azp-sandbox command a test runs in the machine's own network
/// namespace (not the network lab's fake host): no home from the caller's environment,
/// and no IPv6 for its jobs. The machine's IPv6 default route (if any) is the real
/// network's: an `auto` job there would turn on the real uplink's force_forwarding while
/// the jobs' table exists (test.sh exports the same; this holds for `cargo test` alone).
pub fn in_machine_namespace(cmd: &mut Command) {
    cmd.env_remove("AZP_SANDBOX_HOME").env("AZP_SANDBOX_IPV6", "off");
}

/// Makes `cmd` run as the test user (if any), with that user's environment basics.
pub fn as_test_user(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    if let Some(u) = test_user() {
        // std drops supplementary groups when uid() is set by root.
        cmd.uid(u.uid.as_raw())
            .gid(u.gid.as_raw())
            .env("HOME", &u.dir)
            .env("USER", &u.name)
            .env("LOGNAME", &u.name)
            .env_remove("XDG_RUNTIME_DIR");
    }
}

/// A private azp-sandbox home for one test.
pub struct TestHome {
    pub dir: PathBuf,
}

impl TestHome {
    pub fn new(name: &str) -> TestHome {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("home-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        if let Some(u) = test_user() {
            nix::unistd::chown(&dir, Some(u.uid), Some(u.gid)).unwrap();
        }
        TestHome { dir }
    }

    /// The home as the azp-sandbox commands of the tests see it (its runtime dir depends
    /// on who runs them, see [`as_test_user`], which also clears `XDG_RUNTIME_DIR`).
    pub fn home(&self) -> azp_sandbox::config::Home {
        let xdg = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|_| !rootless());
        azp_sandbox::config::Home::for_caller(&self.dir, !rootless(), xdg)
    }
    /// Where the commands keep job records (runtime dir).
    pub fn jobs_dir(&self) -> PathBuf {
        self.home().jobs_dir()
    }

    pub fn command(&self) -> Command {
        let mut c = Command::new(bin());
        c.arg("--home").arg(&self.dir).stdin(Stdio::null());
        in_machine_namespace(&mut c);
        as_test_user(&mut c);
        c
    }

    /// [`TestHome::command`] in the network lab's fake host (see [`netlab`]).
    pub fn lab_command(&self, lab: &netlab::NetLab) -> Command {
        let user = test_user().map(|u| (u.uid.as_raw(), u.gid.as_raw()));
        let mut c = lab.host_command(bin(), user);
        c.arg("--home").arg(&self.dir).env_remove("AZP_SANDBOX_HOME").env_remove("AZP_SANDBOX_IPV6");
        c.stdin(Stdio::null());
        if let Some(u) = test_user() {
            c.env("HOME", &u.dir).env("USER", &u.name).env("LOGNAME", &u.name).env_remove("XDG_RUNTIME_DIR");
        }
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command().args(args).output().expect("cannot run azp-sandbox")
    }

    /// Runs and asserts success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "azp-sandbox {args:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn import(&self, tar: &Path, name: &str) {
        self.ok(&["rootfs", "import", tar.to_str().unwrap(), "--name", name]);
    }

    pub fn with_busybox(name: &str) -> TestHome {
        let h = TestHome::new(name);
        h.import(&busybox_tar(), "bb");
        h
    }

    /// Nothing left by jobs: no job dirs, no container state, no trash, no mounts
    /// under the home, no cgroups of the named jobs.
    pub fn assert_no_residue(&self, job_names: &[&str]) {
        let home = self.home();
        let jobs = self.jobs_dir();
        let left: Vec<_> =
            std::fs::read_dir(&jobs).map(|r| r.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
        assert!(!jobs.exists(), "job records left in {}: {left:?}", jobs.display());
        let layers = home.job_layer_dirs();
        assert!(layers.is_empty(), "job layer dirs left: {layers:?}");
        let trash: Vec<_> =
            std::fs::read_dir(home.trash_dir()).map(|r| r.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        assert!(trash.is_empty(), "residue in {}: {trash:?}", home.trash_dir().display());
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        for dir in [self.dir.clone(), jobs] {
            let dir = dir.to_str().unwrap().to_string();
            assert!(!mounts.contains(&dir), "mounts left under {dir}");
        }
        for name in job_names {
            let dirs = cgroup_dirs_of(name);
            assert!(dirs.is_empty(), "cgroup dirs left: {dirs:?}");
        }
    }
}

impl Drop for TestHome {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            // The home's runtime dir (/run/azp-sandbox/h-<hash>) too, named while the home
            // still exists (the hash is of its canonical path). It is empty and gone after
            // a clean test; a test that killed a manager mid-creation leaves a staging
            // record there that gc keeps for 60 s (its creator may be alive), and no gc
            // of this home runs again once the home is gone. And the marker beside it that
            // says gc has looked for orphaned layer dirs (`.layers-checked-h-<hash>`): one
            // per home ever used, else, until a reboot.
            let home = self.home();
            let (run_root, marker) = (home.run_root(), home.layers_checked_marker());
            let _ = std::fs::remove_dir_all(&self.dir);
            let _ = std::fs::remove_dir_all(run_root);
            let _ = std::fs::remove_file(marker);
        }
    }
}

/// Existing cgroup dirs of job `name` (any v1 controller, or v2): `h-<8 hex>-<name>`
/// below `azp-sandbox` (root mode) or `azp-sandbox/user-UID` (rootless).
pub fn cgroup_dirs_of(name: &str) -> Vec<PathBuf> {
    let is_job = |p: &Path| {
        let n = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        n.len() == 11 + name.len()
            && n.starts_with("h-")
            && n[2..10].chars().all(|c| c.is_ascii_hexdigit())
            && n[10..] == format!("-{name}")
    };
    let subdirs = |d: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(d).map(|r| r.flatten().map(|x| x.path()).filter(|p| p.is_dir()).collect()).unwrap_or_default()
    };
    let mut out = vec![];
    let bases = std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten().map(|e| e.path().join("azp-sandbox"));
    for base in bases.chain(std::iter::once(PathBuf::from("/sys/fs/cgroup/azp-sandbox"))) {
        for level1 in subdirs(&base) {
            if is_job(&level1) {
                out.push(level1);
            } else {
                out.extend(subdirs(&level1).into_iter().filter(|p| is_job(p)));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The pids.current file of a running job, v1 or v2.
pub fn pids_current(name: &str) -> Option<PathBuf> {
    cgroup_dirs_of(name).into_iter().map(|d| d.join("pids.current")).find(|p| p.exists())
}

/// Every process: its pid and its /proc dir.
fn processes() -> impl Iterator<Item = (i32, PathBuf)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_string_lossy().parse::<i32>().ok()?, e.path())))
}

/// The pids of `parent`'s children (from each process's stat: field 4 is the ppid).
pub fn children_of(parent: i32) -> Vec<i32> {
    processes()
        .filter(|(_, dir)| {
            let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else { return false };
            // The command name (field 2) may contain spaces: split after the last ')'.
            let ppid = stat.rfind(')').and_then(|i| stat[i + 2..].split(' ').nth(1)?.parse::<i32>().ok());
            ppid == Some(parent)
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// Processes (other than this one) whose command line contains `needle`.
pub fn processes_matching(needle: &str) -> Vec<(i32, String)> {
    processes()
        .filter_map(|(pid, dir)| {
            let cmd = String::from_utf8_lossy(&std::fs::read(dir.join("cmdline")).ok()?).replace('\0', " ");
            (cmd.contains(needle) && pid != std::process::id() as i32).then_some((pid, cmd))
        })
        .collect()
}

/// Polls `f` every 20 ms until it holds; fails the test after `timeout`.
pub fn wait_until(what: &str, timeout: std::time::Duration, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !f() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst))
}

/// The NVIDIA driver tree from Debian's packages, with fake device nodes
/// (scripts/make-driver-tree.sh). An error (why, for [`or_skip!`]) only when the packages
/// cannot be downloaded and none are cached (exit 75).
pub fn driver_tree() -> Result<PathBuf, String> {
    static P: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    P.get_or_init(|| {
        let root = fixtures().join("driver-tree");
        let out = Command::new("bash").arg(repo().join("scripts/make-driver-tree.sh")).arg(&root).output().unwrap();
        match out.status.code() {
            Some(0) => Ok(root),
            Some(75) => {
                let err = String::from_utf8_lossy(&out.stderr);
                let why = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
                Err(format!("NVIDIA driver packages could not be downloaded and none are cached: {why}"))
            }
            _ => panic!("make-driver-tree.sh failed: {}", String::from_utf8_lossy(&out.stderr)),
        }
    })
    .clone()
}

/// A long-running azp-sandbox process (`run`, `slurm`) with its log file: `stop()` sends
/// SIGTERM and waits (60 s at most); dropping it kills it, so a failed test leaves none.
pub struct ManagerProc {
    pub child: std::process::Child,
    pub log: PathBuf,
}

impl ManagerProc {
    /// Spawns `cmd` with stderr into `log` (stdout discarded).
    pub fn spawn(mut cmd: Command, log: PathBuf) -> ManagerProc {
        let f = std::fs::File::create(&log).unwrap();
        let child = cmd.stdout(Stdio::null()).stderr(f).spawn().expect("cannot start azp-sandbox");
        ManagerProc { child, log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn stop(mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::SIGTERM).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(std::time::Instant::now() < deadline, "did not stop within 60 s of SIGTERM; log:\n{}", self.log());
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for ManagerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes the PAT to `<home>/pat` (as a sysadmin's token file) and returns its path.
pub fn token_file(h: &TestHome, pat: &str) -> PathBuf {
    let p = h.dir.join("pat");
    std::fs::write(&p, format!("{pat}\n")).unwrap();
    p
}

//! The jobs' init (the program is `src/sys/init/main.rs`; build.rs compiles it): embedded in
//! this binary, written once into the home's cache under a name made from its content,
//! mode 0555 (the job's user, whatever host id it maps to, can run it; nobody can change
//! it), and bound read-only into every job at [`PATH_IN_JOB`], where it runs as pid 1
//! with the job's command as its arguments.
//!
//! Why there: the bind target is a file libcontainer creates on the job's `/dev` tmpfs,
//! so nothing is written into the job's layer and no rootfs needs a path of its own
//! (docker uses /sbin/docker-init, which the container's writable layer then holds).

use crate::config::Home;
use anyhow::{Context, Result};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

/// The init program (static, see build.rs).
pub const BINARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/azp-init"));

/// Where every job sees it (a read-only bind, on the job's /dev tmpfs).
pub const PATH_IN_JOB: &str = "/dev/.azp-init";

/// Its file: `cache/init/azp-init-<hash of its bytes>` in `home`'s cache. libcontainer
/// binds it as the job's root, which in a user namespace of its own is no owner of the
/// home: when a dir above the cache is private (a home in `mktemp -d`, `~/.local` 0700),
/// the file goes beside the overlay's mount point instead (`<mount point>-init`), which
/// is reachable by any id by construction ([`Home::mount_point`]), unless programs cannot
/// run from there (root's is on the noexec `/run`): then the home must be made reachable,
/// and the error says how.
pub fn host_path(home: &Home) -> Result<PathBuf> {
    Ok(host_dir(home)?.join(concat!("azp-init-", env!("AZP_INIT_HASH"))))
}

fn host_dir(home: &Home) -> Result<PathBuf> {
    let in_home = home.cache_dir().join("init");
    let Err(why) = super::check_reachable(&in_home) else { return Ok(in_home) };
    let mount = home.mount_point();
    let mut name = mount.file_name().unwrap_or_default().to_os_string();
    name.push("-init");
    let beside = mount.with_file_name(name);
    let noexec = |dir: &std::path::Path| {
        nix::sys::statvfs::statvfs(dir).is_ok_and(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_NOEXEC))
    };
    match beside.parent() {
        Some(parent) if !noexec(parent) => Ok(beside),
        _ => {
            Err(why.context(format!("the jobs' init in {} must be reachable by the jobs' own ids", in_home.display())))
        }
    }
}

/// The init's file in `home`, written if it is missing or not as written (one stat when it
/// is there, on every job's path).
pub fn ensure(home: &Home) -> Result<PathBuf> {
    let path = host_path(home)?;
    let ok = std::fs::symlink_metadata(&path).is_ok_and(|m| {
        m.is_file()
            && m.len() == BINARY.len() as u64
            && m.mode() & 0o7777 == 0o555
            && m.uid() == nix::unistd::geteuid().as_raw()
    });
    if ok {
        return Ok(path);
    }
    let dir = path.parent().context("the init's path has a parent")?;
    if dir.starts_with(home.cache_dir()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create {}: check free space under the home", dir.display()))?;
    } else {
        // Beside the mount point, maybe in /tmp: ours and writable by nobody else, or refused.
        super::jobdir::create_mount_point(dir)?;
    }
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711));
    // Written under a name of this process, then renamed into place: a job never binds
    // half a file, and concurrent writers (two `exec`s) each rename a whole one.
    let tmp = dir.join(format!(".azp-init.{}.{:?}", std::process::id(), std::thread::current().id()));
    let _ = std::fs::remove_file(&tmp);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o555).open(&tmp)?;
        std::io::Write::write_all(&mut f, BINARY)?;
        // Not left to the umask.
        f.set_permissions(std::fs::Permissions::from_mode(0o555))
    };
    let written = write().and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write the jobs' init to {}: check free space", path.display()));
    }
    Ok(path)
}

/// The job's process arguments: the init, told to install the jobs' seccomp filter
/// (see `sandbox::seccomp`; `core_fixed`: the one that keeps the job's core dump limit
/// as it is, see `sandbox::spec`), then the command.
pub fn args(command: &[String], core_fixed: bool) -> Vec<String> {
    let filter = if core_fixed { "--seccomp-core-fixed" } else { "--seccomp" };
    [PATH_IN_JOB, filter, "--"].into_iter().map(String::from).chain(command.iter().cloned()).collect()
}

/// The init program itself, compiled into these tests too (its pure parts).
#[cfg(test)]
#[path = "../sys/init/main.rs"]
#[allow(dead_code)]
mod program;

#[cfg(test)]
mod tests {
    //! The built init as an ordinary process (not pid 1): what it does with its command,
    //! signals and lifeline does not depend on being pid 1, except that as pid 1 the
    //! kernel then ends the rest of the job.
    use super::*;
    use std::io::Read;
    use std::os::fd::OwnedFd;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    struct Installed {
        _t: tempfile::TempDir,
        path: PathBuf,
    }

    fn installed() -> Installed {
        let t = tempfile::tempdir().unwrap();
        let home = Home::new(t.path().join("home"));
        let path = ensure(&home).unwrap();
        Installed { _t: t, path }
    }

    /// `azp-init ARGS` with stdout and stderr piped; `lifeline`: its read end as fd 3.
    fn init(i: &Installed, args: &[&str], lifeline: Option<OwnedFd>) -> std::process::Child {
        let mut cmd = Command::new(&i.path);
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        if let Some(fd) = &lifeline {
            crate::sys::lifeline::pass_as_fd3(&mut cmd, fd);
        }
        // ETXTBSY: a process another test thread was spawning while `installed()` wrote
        // this init still held a copy of its write fd (until its own exec). Not this
        // init's doing; a fresh-clone CI run hit it once. Tried again for up to 2 s.
        let start = std::time::Instant::now();
        loop {
            match cmd.spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && start.elapsed() < Duration::from_secs(2) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                spawned => return spawned.unwrap(),
            }
        }
    }

    fn output(mut c: std::process::Child) -> (Option<i32>, String, String) {
        let mut out = String::new();
        let mut err = String::new();
        c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        (c.wait().unwrap().code(), out, err)
    }

    /// Reads `child`'s stdout until `line` has been printed.
    fn wait_for_line(child: &mut std::process::Child, line: &str) -> String {
        let mut seen = String::new();
        let out = child.stdout.as_mut().unwrap();
        let mut b = [0u8; 1];
        while !seen.lines().any(|l| l == line) {
            assert_eq!(out.read(&mut b).unwrap(), 1, "ended before printing {line}: {seen}");
            seen.push(b[0] as char);
        }
        seen
    }

    #[test]
    fn written_once_read_only_and_named_by_its_content() {
        let t = tempfile::tempdir().unwrap();
        let home = Home::new(t.path().join("home"));
        let p = ensure(&home).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o555);
        assert_eq!(std::fs::read(&p).unwrap(), BINARY);
        assert!(p.file_name().unwrap().to_str().unwrap().starts_with("azp-init-"));
        let ino = m.ino();
        assert_eq!(std::fs::metadata(ensure(&home).unwrap()).unwrap().ino(), ino, "not rewritten");
        // Damaged (mode or size): replaced.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        ensure(&home).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o555);
        assert!(BINARY.len() < 2 << 20, "the init stays small: {} bytes", BINARY.len());
        assert_eq!(args(&["sh".into(), "-c".into()], false), [PATH_IN_JOB, "--seccomp", "--", "sh", "-c"]);
        assert_eq!(args(&["sh".into()], true), [PATH_IN_JOB, "--seccomp-core-fixed", "--", "sh"]);
    }

    #[test]
    fn exit_codes_and_commands_that_cannot_run() {
        let i = installed();
        assert_eq!(
            output(init(&i, &["sh", "-c", "echo out; echo err >&2; exit 7"], None)),
            (Some(7), "out\n".into(), "err\n".into())
        );
        let (code, out, err) = output(init(&i, &["sh", "-c", "kill -TERM $$"], None));
        assert_eq!((code, out.as_str(), err.as_str()), (Some(143), "", ""), "128 + SIGTERM");
        let (code, _, err) = output(init(&i, &["no-such-command-x"], None));
        assert_eq!((code, err.as_str()), (Some(127), "azp-sandbox: no-such-command-x: command not found\n"));
        let (code, _, err) = output(init(&i, &["/etc/passwd"], None));
        assert_eq!(
            (code, err.as_str()),
            (Some(126), "azp-sandbox: /etc/passwd: permission denied (not an executable file)\n")
        );
        let t = tempfile::tempdir().unwrap();
        let script = t.path().join("s");
        std::fs::write(&script, "#!/no/such/interpreter\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (code, _, err) = output(init(&i, &[script.to_str().unwrap()], None));
        assert_eq!(code, Some(126), "{err}");
        assert!(err.contains("interpreter") && err.lines().count() == 1, "{err}");
        let (code, _, err) = output(init(&i, &[], None));
        assert_eq!(code, Some(2), "{err}");
    }

    #[test]
    fn with_seccomp_the_command_runs_under_the_jobs_filter() {
        let i = installed();
        // unshare(2) is denied (EPERM) by the filter; a plain `sh` is not.
        let probe = "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; unshare -U true && echo UNSHARED; exit 0";
        let (code, out, err) = output(init(&i, &["--seccomp", "--", "sh", "-c", probe], None));
        assert_eq!(code, Some(0), "{err}");
        assert!(out.contains("Seccomp:\t2") && out.contains("NoNewPrivs:\t1"), "{out}");
        assert!(!out.contains("UNSHARED") && err.contains("Operation not permitted"), "{out} {err}");
        let (_, out, _) = output(init(&i, &["sh", "-c", "grep '^Seccomp_filters:' /proc/self/status"], None));
        let ours = std::fs::read_to_string("/proc/self/status").unwrap();
        let ours = ours.lines().find(|l| l.starts_with("Seccomp_filters:")).unwrap();
        assert_eq!(out.trim_end(), ours, "without the option, no filter of the init's own");
        assert_eq!(output(init(&i, &["--seccomp", "--"], None)).0, Some(2), "no command");
    }

    #[test]
    fn options_come_before_the_command() {
        use program::parse_options;
        let a = |v: &[&'static str]| v.iter().map(|s| s.as_bytes()).collect::<Vec<_>>();
        use program::Filter;
        assert_eq!(parse_options(&a(&["init", "--seccomp", "--", "sh"])), (Filter::Jobs, 3));
        assert_eq!(parse_options(&a(&["init", "--seccomp-core-fixed", "--", "sh"])), (Filter::JobsCoreFixed, 3));
        assert_eq!(parse_options(&a(&["init", "sh", "--seccomp"])), (Filter::None, 1));
        assert_eq!(parse_options(&a(&["init", "--", "--seccomp"])), (Filter::None, 2), "after --: the command");
        assert_eq!(parse_options(&a(&["init", "--seccomp", "sh"])), (Filter::Jobs, 2));
        assert_eq!(parse_options(&a(&["init"])), (Filter::None, 1));
    }

    #[test]
    fn signals_reach_the_commands_whole_process_group() {
        let i = installed();
        // The command's child records what it gets; the command waits for it.
        let script = "sh -c 'trap \"echo child-got-TERM; exit 3\" TERM; echo ready; while :; do sleep 0.05; done' & wait $!; echo parent-saw=$?";
        let mut c = init(&i, &["sh", "-c", script], None);
        wait_for_line(&mut c, "ready");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::SIGTERM).unwrap();
        let (code, out, _) = output(c);
        // The command (sh) gets SIGTERM too and dies of it: 143.
        assert_eq!(code, Some(143), "{out}");
        assert!(out.contains("child-got-TERM"), "{out}");
        // USR1, WINCH, HUP: every signal goes on, not only the stop signals.
        for (sig, name) in [(nix::sys::signal::SIGUSR1, "USR1"), (nix::sys::signal::SIGWINCH, "WINCH")] {
            let s = format!("trap 'echo got-{name}; exit 0' {name}; echo ready; while :; do sleep 0.05; done");
            let mut c = init(&i, &["sh", "-c", &s], None);
            wait_for_line(&mut c, "ready");
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig).unwrap();
            let (code, out, _) = output(c);
            assert_eq!((code, out.trim_end().lines().last()), (Some(0), Some(format!("got-{name}").as_str())));
        }
    }

    /// The states of `parent`'s children.
    fn children_states(parent: i32) -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| {
                let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
                let mut f = stat[stat.rfind(')')? + 2..].split(' ');
                let state = f.next()?.to_string();
                (f.next()?.parse::<i32>().ok()? == parent).then_some(state)
            })
            .collect()
    }

    #[test]
    fn zombies_are_reaped_and_the_command_leads_its_own_group() {
        let i = installed();
        let (code, out, err) = output(init(&i, &["sh", "-c", "echo $(cut -d' ' -f5 /proc/$$/stat) $$"], None));
        assert_eq!(code, Some(0), "{err}");
        let (pgid, pid) = out.trim().split_once(' ').unwrap();
        assert_eq!(pgid, pid, "the command is its group's leader");
        // Orphans (double forks) come back to the init, which reaps them.
        let mut c = init(&i, &["sh", "-c", "for n in 1 2 3; do (sleep 0.01 &); done; echo ready; sleep 2"], None);
        wait_for_line(&mut c, "ready");
        std::thread::sleep(Duration::from_millis(300));
        let states = children_states(c.id() as i32);
        assert_eq!(states.len(), 1, "the command only, the orphans reaped: {states:?}");
        assert!(!states.iter().any(|s| s == "Z"), "zombies under the init: {states:?}");
        let _ = c.kill();
        let _ = c.wait();
    }

    #[test]
    fn the_job_ends_when_its_lifeline_is_cut() {
        let i = installed();
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let marker = format!("azp-init-lifeline-{}", std::process::id());
        let s = format!("sh -c 'while :; do sleep 0.05; done' {marker} & echo ready; wait");
        let mut c = init(&i, &["sh", "-c", &s], Some(r));
        wait_for_line(&mut c, "ready");
        // Never handed on to the command: it holds no copy of the read end.
        let started = Instant::now();
        drop(w); // the supervisor dies
        let st = c.wait().unwrap();
        assert_eq!(st.code(), Some(137), "{st:?}");
        assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
        // The command's group is gone, its child included.
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let left: Vec<_> = std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter(|e| {
                    std::fs::read(e.path().join("cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(&marker))
                })
                .collect();
            if left.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "the job's processes survived the lifeline");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(st.signal().is_none());
    }

    #[test]
    fn an_open_lifeline_changes_nothing() {
        let i = installed();
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let (code, out, _) =
            output(init(&i, &["sh", "-c", "[ -e /proc/$$/fd/3 ] && echo HAS-FD-3 || echo no-fd-3; exit 5"], Some(r)));
        assert_eq!((code, out.as_str()), (Some(5), "no-fd-3\n"), "the command never gets the lifeline");
        drop(w);
    }
}

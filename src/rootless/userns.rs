//! Entering the rootless user namespace: the one step that needs help from outside.
//!
//! A process cannot write its own uid/gid map beyond its own id; `newuidmap` and
//! `newgidmap` (setuid root, checking /etc/subuid and /etc/subgid) can, but only for a
//! process in a namespace they are not in. So: fork a child that waits, unshare the user
//! namespace in the parent, let the child run the two tools on the parent's pid, then
//! become uid/gid 0 inside. Must run before any thread exists (unshare(CLONE_NEWUSER)
//! fails with EINVAL in a multi-threaded process).

use super::subid::SubIdRange;
use anyhow::{bail, Context, Result};
use nix::sched::{unshare, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, pipe, read, write, ForkResult, Pid};
use std::os::fd::AsRawFd;

/// The maps: container 0 = the user, container 1..=count = the subordinate range.
pub struct Mapping {
    pub uid: u32,
    pub gid: u32,
    pub subuid: SubIdRange,
    pub subgid: SubIdRange,
}

impl Mapping {
    /// `newuidmap PID` arguments after the pid: `0 UID 1 1 START COUNT`.
    pub fn uid_args(&self) -> Vec<String> {
        args(self.uid, self.subuid)
    }
    pub fn gid_args(&self) -> Vec<String> {
        args(self.gid, self.subgid)
    }
}

fn args(own: u32, sub: SubIdRange) -> Vec<String> {
    ["0", &own.to_string(), "1", "1", &sub.start.to_string(), &sub.count.to_string()].map(str::to_string).to_vec()
}

/// Moves the calling (single-threaded) process into a new user namespace with `map`,
/// as uid/gid 0 there.
pub fn enter(map: &Mapping) -> Result<()> {
    let newuidmap = find_tool("newuidmap")?;
    let newgidmap = find_tool("newgidmap")?;
    let (go_read, go_write) = pipe().context("cannot create a pipe")?;
    let parent = Pid::this();
    // Step 1: the mapper child, forked while this process is still single-threaded.
    // SAFETY: no other thread exists (checked by unshare below, which fails otherwise); the
    // child only reads a pipe, spawns two programs and calls _exit.
    let child = match unsafe { fork() }.context("cannot fork the uid mapper")? {
        ForkResult::Child => {
            drop(go_write);
            let mut b = [0u8; 1];
            let code = match read(go_read.as_raw_fd(), &mut b) {
                Ok(1) => {
                    let ok =
                        run_map(&newuidmap, parent, &map.uid_args()) && run_map(&newgidmap, parent, &map.gid_args());
                    if ok {
                        0
                    } else {
                        1
                    }
                }
                _ => 2,
            };
            // SAFETY: _exit(2) ends the forked child without running the parent's atexit
            // handlers or destructors.
            unsafe { libc::_exit(code) };
        }
        ForkResult::Parent { child } => child,
    };
    drop(go_read);
    // Step 2: the namespace.
    let unshared = unshare(CloneFlags::CLONE_NEWUSER);
    // Step 3: let the child map us (or tell it to give up: EOF).
    if unshared.is_ok() {
        let _ = write(&go_write, b"1");
    }
    drop(go_write);
    let status = waitpid(child, None).context("cannot wait for the uid mapper")?;
    if let Err(e) = unshared {
        bail!(
            "cannot create a user namespace ({e}): enable unprivileged user namespaces \
             (sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1)"
        );
    }
    if !matches!(status, WaitStatus::Exited(_, 0)) {
        bail!(
            "newuidmap/newgidmap could not map ids {:?} / {:?} (see their message above): check /etc/subuid and /etc/subgid",
            map.uid_args(),
            map.gid_args()
        );
    }
    // Step 4: uid/gid 0 inside (we are already mapped to 0; this also drops supplementary
    // groups, which would show up as unmapped "nogroup" in jobs).
    nix::unistd::setgroups(&[]).context("cannot clear supplementary groups in the user namespace")?;
    nix::unistd::setresgid(0.into(), 0.into(), 0.into()).context("cannot become gid 0 in the user namespace")?;
    nix::unistd::setresuid(0.into(), 0.into(), 0.into()).context("cannot become uid 0 in the user namespace")?;
    Ok(())
}

fn run_map(tool: &std::path::Path, pid: Pid, args: &[String]) -> bool {
    std::process::Command::new(tool).arg(pid.to_string()).args(args).status().map(|s| s.success()).unwrap_or(false)
}

fn find_tool(name: &str) -> Result<std::path::PathBuf> {
    ["/usr/bin", "/bin", "/usr/sbin", "/usr/local/bin"]
        .iter()
        .map(|d| std::path::Path::new(d).join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("{name} not found: rootless mode needs the uidmap package (apt-get install uidmap)"))
}

/// True when this process is in a user namespace other than the initial one (its uid map
/// is not the identity over all ids).
pub fn in_child_user_namespace() -> bool {
    match std::fs::read_to_string("/proc/self/uid_map") {
        Ok(m) => !is_identity_map(&m),
        Err(_) => false,
    }
}

fn is_identity_map(map: &str) -> bool {
    let fields: Vec<&str> = map.split_whitespace().collect();
    fields == ["0", "0", "4294967295"]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_arguments() {
        let m = Mapping {
            uid: 1001,
            gid: 1002,
            subuid: SubIdRange { start: 100000, count: 65536 },
            subgid: SubIdRange { start: 200000, count: 65536 },
        };
        assert_eq!(m.uid_args(), ["0", "1001", "1", "1", "100000", "65536"]);
        assert_eq!(m.gid_args(), ["0", "1002", "1", "1", "200000", "65536"]);
    }

    #[test]
    fn identity_map_detection() {
        assert!(is_identity_map("         0          0 4294967295\n"));
        assert!(!is_identity_map("         0       1001          1\n         1     100000      65535\n"));
    }
}

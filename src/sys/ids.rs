//! Changes of identity: setuid mode's privilege split and the rootless user namespace's
//! "become 0 inside".

use super::error::{Error, Result};
use nix::unistd::{Gid, Uid};

/// Real, effective and saved ids 0 and no supplementary groups. As setuid root: the
/// caller can no longer signal or trace this process. In a fresh user namespace where we
/// are mapped to 0: we act as its root.
pub fn become_root() -> Result<()> {
    nix::unistd::setgroups(&[]).map_err(Error::ClearGroups)?;
    let (g, u) = (Gid::from_raw(0), Uid::from_raw(0));
    nix::unistd::setresgid(g, g, g).map_err(|source| Error::SetGid { gid: 0, source })?;
    nix::unistd::setresuid(u, u, u).map_err(|source| Error::SetUid { uid: 0, source })
}

/// No supplementary groups: a job inherits its helper's, and the helper those of whoever
/// started azp-sandbox (`su -` leaves root's group 0, a login its `video`, `disk`, ...).
/// The kernel checks them in every user namespace, mapped or not.
pub fn clear_groups() -> Result<()> {
    nix::unistd::setgroups(&[]).map_err(Error::ClearGroups)
}

/// Real, effective and saved ids all become `uid`/`gid`, then checks that root cannot be
/// regained.
pub fn drop_privileges_for_good(uid: Uid, gid: Gid) -> Result<()> {
    nix::unistd::setresgid(gid, gid, gid).map_err(|source| Error::SetGid { gid: gid.as_raw(), source })?;
    nix::unistd::setresuid(uid, uid, uid).map_err(|source| Error::SetUid { uid: uid.as_raw(), source })?;
    if nix::unistd::setuid(Uid::from_raw(0)).is_ok() || nix::unistd::geteuid().is_root() {
        return Err(Error::RegainedRoot);
    }
    Ok(())
}

/// No core dumps, no ptrace and no /proc/PID/mem or environ for the (unprivileged) user
/// who started this setuid process.
pub fn make_undumpable() -> Result<()> {
    nix::sys::prctl::set_dumpable(false).map_err(Error::NotDumpable)
}

/// Runs `f` with this thread's filesystem identity set to `uid`/`gid` (what the kernel
/// checks path access against), then back to root. When the switch did not take (an
/// id the kernel refused), `f` does not run: PermissionDenied.
pub fn with_fs_identity<R>(uid: u32, gid: u32, f: impl FnOnce() -> std::io::Result<R>) -> std::io::Result<R> {
    use nix::unistd::{setfsgid, setfsuid};
    setfsgid(Gid::from_raw(gid));
    setfsuid(Uid::from_raw(uid));
    // setfsuid/setfsgid report no failure; called with an invalid id (-1) they change
    // nothing and return the current one, which tells whether the switch happened.
    let switched =
        setfsuid(Uid::from_raw(u32::MAX)).as_raw() == uid && setfsgid(Gid::from_raw(u32::MAX)).as_raw() == gid;
    let r = if switched {
        f()
    } else {
        Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, "cannot take the caller's filesystem identity"))
    };
    setfsuid(Uid::from_raw(0));
    setfsgid(Gid::from_raw(0));
    r
}

/// Whether the binary at `path` carries file capabilities (`security.capability`).
pub fn has_file_capabilities(path: &std::path::Path) -> bool {
    super::fs_at::has_xattr(path, c"security.capability")
}

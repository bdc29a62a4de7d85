//! Entering the rootless user namespace: the one step that needs help from outside
//! (`newuidmap` and `newgidmap`, setuid root, checking /etc/subuid and /etc/subgid).
//! What ids to map is decided here; the fork, unshare and id changes are
//! [`crate::sys::ns::enter_user_namespace`]. Must run before any thread exists
//! (unshare(CLONE_NEWUSER) fails with EINVAL in a multi-threaded process).

use super::subid::SubIdRange;
use crate::sys::ns::IdMapTools;
use anyhow::{Context, Result};

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
/// as uid/gid 0 there (see [`crate::sys::ns::enter_user_namespace`]).
pub fn enter(map: &Mapping) -> Result<()> {
    let tools = IdMapTools {
        newuidmap: find_tool("newuidmap")?,
        newgidmap: find_tool("newgidmap")?,
        uid_args: map.uid_args(),
        gid_args: map.gid_args(),
    };
    Ok(crate::sys::ns::enter_user_namespace(&tools)?)
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
    match crate::sys::procfile::read("/proc/self/uid_map") {
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

//! What a sandbox's helper reports across its pipe, and the kinds of failure its
//! callers act on. A failure is classified where it is produced, from the typed error
//! (the failed step and its errno); libcontainer gives only text, read in one place
//! ([`classify_libcontainer`]). Callers match on [`FailureKind`], never on the message.

use serde::{Deserialize, Serialize};

/// What the helper reports to the runner through `<job>/result.json` and its pipe.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum HelperResult {
    /// The job ran; its exit code (128+n when killed by signal n).
    Exited { code: i32, signal: Option<i32> },
    /// The sandbox could not be created or run. (`kind` is absent from the results of
    /// older helpers: Other.)
    Failed {
        #[serde(default)]
        kind: FailureKind,
        error: String,
    },
}

/// Why a sandbox could not be created or run, as far as its callers act on it.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum FailureKind {
    /// ENOSPC or EDQUOT on the way: free space under the home.
    DiskFull,
    /// A read-only layer of the rootfs is gone (removed or re-imported meanwhile).
    RootfsMissing,
    /// The kernel refused a cgroup limit (memory, pids, cpu) the job asked for.
    LimitRefused,
    /// The job's command is not in the rootfs (or not executable there).
    CommandNotFound,
    /// A namespace or mount was refused: not root, or user namespaces are off.
    NotPermitted,
    /// A prepared sandbox was dropped before it started.
    Cancelled,
    #[default]
    Other,
}

/// A sandbox failure with its kind: what [`super::Sandbox::run`] returns when the
/// helper failed, and what the runner's own checks return.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SandboxError {
    pub kind: FailureKind,
    pub message: String,
}

impl SandboxError {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> SandboxError {
        SandboxError { kind, message: message.into() }
    }
}

/// The kind of a failure, from the first cause in its chain that tells: a
/// [`SandboxError`], a step of the privileged boundary, or an errno of disk full.
pub fn kind_of(e: &anyhow::Error) -> FailureKind {
    e.chain().find_map(kind_of_cause).unwrap_or_default()
}

fn kind_of_cause(cause: &(dyn std::error::Error + 'static)) -> Option<FailureKind> {
    use crate::sys::Error as S;
    use nix::errno::Errno;
    if let Some(e) = cause.downcast_ref::<SandboxError>() {
        return Some(e.kind);
    }
    if let Some(e) = cause.downcast_ref::<S>() {
        if e.is_disk_full() {
            return Some(FailureKind::DiskFull);
        }
        return match e {
            S::MountOverlay { source: Errno::ENOENT, .. } => Some(FailureKind::RootfsMissing),
            S::CgroupLimit { .. } => Some(FailureKind::LimitRefused),
            S::UnshareMountNs(Errno::EPERM)
            | S::UnshareCgroupNs(Errno::EPERM)
            | S::UnshareNetNs(Errno::EPERM)
            | S::EnterNetns(Errno::EPERM)
            | S::UnshareUserNs(_) => Some(FailureKind::NotPermitted),
            _ => None,
        };
    }
    let errno = match (cause.downcast_ref::<std::io::Error>(), cause.downcast_ref::<Errno>()) {
        (Some(io), _) => io.raw_os_error().map(Errno::from_raw),
        (None, errno) => errno.copied(),
    };
    matches!(errno, Some(Errno::ENOSPC | Errno::EDQUOT)).then_some(FailureKind::DiskFull)
}

/// libcontainer reports a missing or non-executable command only as text (its
/// `ExecutorValidationError::ArgValidationError`, raised in the container's init and
/// sent back over its channel): "executable 'X' not found in $PATH". This is the one
/// place that reads it.
pub fn classify_libcontainer(text: &str) -> FailureKind {
    if text.contains("executable") && (text.contains("not found") || text.contains("No such file")) {
        return FailureKind::CommandNotFound;
    }
    if text.contains("No space left on device") || text.contains("Disk quota exceeded") {
        return FailureKind::DiskFull;
    }
    FailureKind::Other
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn libcontainer_texts() {
        let not_found = "failed to validate: executable 'no-such-command' not found in $PATH";
        assert_eq!(classify_libcontainer(not_found), FailureKind::CommandNotFound);
        assert_eq!(classify_libcontainer("io error: No space left on device (os error 28)"), FailureKind::DiskFull);
        assert_eq!(classify_libcontainer("failed to prepare rootfs"), FailureKind::Other);
        assert_eq!(classify_libcontainer("file not found"), FailureKind::Other, "not about the executable");
    }

    #[test]
    fn kinds_come_from_the_typed_cause_not_the_message() {
        use crate::sys::Error as S;
        use nix::errno::Errno;
        let enospc = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let e = anyhow::Error::new(enospc).context("cannot write job plan");
        assert_eq!(kind_of(&e), FailureKind::DiskFull);
        let e = anyhow::anyhow!("No space left on device, says the text");
        assert_eq!(kind_of(&e), FailureKind::Other, "text is never read");
        let e = Err::<(), _>(S::MountOverlay { target: "/m".into(), options: "o".into(), source: Errno::ENOENT })
            .context("helper")
            .unwrap_err();
        assert_eq!(kind_of(&e), FailureKind::RootfsMissing);
        let limit =
            S::CgroupLimit { file: "/cg/memory.max".into(), value: "1".into(), source: std::io::Error::other("x") };
        assert_eq!(kind_of(&limit.into()), FailureKind::LimitRefused);
        let full = S::CgroupLimit {
            file: "/f".into(),
            value: "1".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert_eq!(kind_of(&full.into()), FailureKind::DiskFull, "disk full wins over the step");
        assert_eq!(kind_of(&S::UnshareMountNs(Errno::EPERM).into()), FailureKind::NotPermitted);
        let e = anyhow::Error::new(SandboxError::new(FailureKind::Cancelled, "cancelled before start")).context("job");
        assert_eq!(kind_of(&e), FailureKind::Cancelled);
    }

    #[test]
    fn results_of_older_helpers_still_read() {
        let old: HelperResult = serde_json::from_str(r#"{"Failed":{"error":"boom"}}"#).unwrap();
        assert_eq!(old, HelperResult::Failed { kind: FailureKind::Other, error: "boom".into() });
        let new = HelperResult::Failed { kind: FailureKind::DiskFull, error: "x".into() };
        let back: HelperResult = serde_json::from_slice(&serde_json::to_vec(&new).unwrap()).unwrap();
        assert_eq!(back, new);
    }
}

//! `--work-dir DIR` (AZP_WORK, `work_dir`): the agent's work folder (`_work`, where
//! pipelines check out and build) on a host filesystem of the admin's choice, e.g. a
//! node's local NVMe, instead of the job's writable layer. Each job gets
//! `DIR/<home tag>/<job id>`, made empty for it, given to its user, bound read-write at
//! `/azp/agent/_work`, and removed after it (by gc after a crash: the job's record names
//! it; at `run`'s start for a record lost with a reboot). The `<home tag>` level keeps two
//! homes sharing one scratch filesystem apart; it is root's, traversable but not listable
//! (0711): a job with ids of its own binds its dir as those ids, so they must pass through.

use super::phases;
use crate::config::Home;
use crate::sandbox::jobdir::JobDir;
use crate::sandbox::ScratchDir;
use crate::settings::RunSettings;
use anyhow::{bail, Context, Result};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The dir holding this home's per-job work dirs, when `--work-dir` is set.
pub fn root(home: &Home, settings: &RunSettings) -> Option<PathBuf> {
    settings.work_dir.as_ref().map(|w| w.join(home.tag()))
}

/// Job `id`'s work dir under `root`, as the sandbox binds it.
pub fn scratch_for(root: &Path, id: &str) -> ScratchDir {
    ScratchDir { host: root.join(id), container: phases::agent_dir().join(phases::WORK_DIR) }
}

/// At start: the work dir exists, this home's level in it is made, and what an earlier
/// run left there without a live job is removed. Returns what was removed.
pub fn prepare(home: &Home, settings: &RunSettings) -> Result<Vec<PathBuf>> {
    let (Some(given), Some(root)) = (settings.work_dir.as_ref(), root(home, settings)) else {
        return Ok(vec![]);
    };
    match std::fs::metadata(given) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("--work-dir {} is not a directory: give a dir on the scratch filesystem", given.display()),
        Err(e) => {
            bail!("--work-dir {}: {e}: create it (a dir on the node's scratch filesystem) first", given.display())
        }
    }
    match std::fs::DirBuilder::new().mode(0o711).create(&root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("cannot create {} (--work-dir)", root.display())),
    }
    // Made 0700 by earlier versions, and the mode is not the umask's to decide.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o711))
        .with_context(|| format!("cannot chmod 0711 {} (--work-dir)", root.display()))?;
    let mut removed = Vec::new();
    for e in std::fs::read_dir(&root).with_context(|| format!("cannot list {}", root.display()))?.flatten() {
        let id = e.file_name().to_string_lossy().into_owned();
        let record = JobDir::new(home, &id);
        if record.root.exists() && record.is_live() {
            continue;
        }
        crate::sys::fs_at::remove_tree(&e.path()).with_context(|| format!("cannot remove {}", e.path().display()))?;
        removed.push(e.path());
    }
    Ok(removed)
}

/// Why the jobs' work dirs under `--work-dir` get no disk quota (one line with the fix),
/// or None when their filesystem gives them the job's limit (or there is no work dir, or
/// rootless mode, where the layers' own line says why no quota at all). The limit is
/// enforced per filesystem: on the work dir's filesystem for the work dir.
pub fn no_quota(settings: &RunSettings, rootless: bool) -> Option<String> {
    let given = settings.work_dir.as_ref().filter(|_| !rootless)?;
    let err = crate::sandbox::limits::node::quota_mechanism(&crate::sys::Real, given).err()?;
    let fs = nix::sys::statfs::statfs(given.as_path()).map(|s| s.filesystem_type()).ok();
    Some(format!(
        "WARNING: the jobs' work dirs (--work-dir) get no disk quota: {}",
        crate::sandbox::limits::node::quota_why(given, fs, &err)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{merge, FlagSettings};

    fn settings(work: Option<&Path>) -> RunSettings {
        let flags = FlagSettings {
            url: Some("https://dev.azure.com/o".into()),
            pool: Some("p".into()),
            name_prefix: Some("h".into()),
            work_dir: work.map(Path::to_path_buf),
            ..Default::default()
        };
        merge(Default::default(), Default::default(), flags).unwrap()
    }

    #[test]
    fn start_makes_the_home_level_and_sweeps_dead_jobs() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("xdg")).unwrap();
        let home = Home::for_caller(t.path().join("home"), false, Some(t.path().join("xdg")));
        home.ensure().unwrap();
        assert!(prepare(&home, &settings(None)).unwrap().is_empty());
        assert_eq!(root(&home, &settings(None)), None);
        let e = prepare(&home, &settings(Some(&t.path().join("nope")))).unwrap_err();
        assert!(e.to_string().contains("create it"), "{e}");
        let s = settings(Some(&t.path().join("scratch")));
        std::fs::create_dir(t.path().join("scratch")).unwrap();
        assert!(prepare(&home, &s).unwrap().is_empty());
        let root = root(&home, &s).unwrap();
        assert_eq!(root, t.path().join("scratch").join(home.tag()));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&root).unwrap().permissions().mode() & 0o777, 0o711);
        // A job dir left by a dead run goes; a live job's stays.
        std::fs::create_dir_all(root.join("h-0-3/src")).unwrap();
        let plan = crate::sandbox::plan::test_plan("h-0-4", vec![], "");
        let live = JobDir::new(&home, "h-0-4");
        let _lock = live.create(&plan, &mut crate::sandbox::jobdir::JobState::for_plan(&live, &plan), None).unwrap();
        std::fs::create_dir_all(root.join("h-0-4")).unwrap();
        assert_eq!(prepare(&home, &s).unwrap(), [root.join("h-0-3")]);
        assert!(root.join("h-0-4").is_dir());
        assert_eq!(scratch_for(&root, "h-0-4").container, Path::new("/azp/agent/_work"));
    }
}

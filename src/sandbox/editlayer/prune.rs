//! Removing edit layers no job can use any more.

use super::{dir, links, BUILD_PREFIX, KEEP};
use crate::config::Home;
use crate::sys::fs_at;
use std::path::{Path, PathBuf};

/// Removes layers no job can use any more: those whose lower layers are gone (a removed
/// rootfs), then the oldest beyond [`KEEP`], and build dirs of helpers that died. A
/// layer in use (locked by a job) stays. Returns what was removed.
pub fn prune(home: &Home) -> Vec<String> {
    let parent = dir(home);
    let Ok(rd) = std::fs::read_dir(&parent) else { return vec![] };
    let mut removed = vec![];
    let mut kept: Vec<(std::time::SystemTime, PathBuf)> = vec![];
    for e in rd.flatten() {
        let (name, path) = (e.file_name().to_string_lossy().into_owned(), e.path());
        if let Some(rest) = name.strip_prefix(BUILD_PREFIX) {
            let pid = rest.rsplit('-').next().and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) && fs_at::remove_tree(&path).is_ok() {
                removed.push(format!("interrupted edit-layer build {}", path.display()));
            }
            continue;
        }
        let built = std::fs::read_to_string(path.join("lower")).ok().and_then(|lower| {
            let all_there = lower.lines().all(|l| Path::new(l).is_dir())
                && links::links_current(&path)
                && path.join("tree").is_dir();
            let t = std::fs::metadata(path.join("lower")).and_then(|m| m.modified()).ok()?;
            all_there.then_some(t)
        });
        match built {
            Some(t) => kept.push((t, path)),
            None => removed.extend(remove_unused(
                home,
                &path,
                "its lower layers or linked driver files changed, or its tree is gone",
            )),
        }
    }
    kept.sort();
    let excess = kept.len().saturating_sub(KEEP);
    for (_, path) in kept.into_iter().take(excess) {
        removed.extend(remove_unused(home, &path, "one of the oldest"));
    }
    removed
}

/// Renames the layer at `path` into the trash and deletes it, unless a job has it locked.
pub(super) fn remove_unused(home: &Home, path: &Path, why: &str) -> Option<String> {
    let f = std::fs::File::open(path).ok()?;
    fs_at::flock(std::os::fd::AsFd::as_fd(&f), libc::LOCK_EX | libc::LOCK_NB).ok()?;
    let trash = home.trash_dir().join(format!("edit-layer-{}", fs_at::random_suffix()));
    std::fs::create_dir_all(home.trash_dir()).ok()?;
    std::fs::rename(path, &trash).ok()?;
    drop(f);
    let _ = fs_at::remove_tree(&trash);
    Some(format!("edit layer {} ({why})", path.display()))
}

#[cfg(test)]
mod tests {
    use super::super::lease;
    use super::*;

    fn fake_layer(home: &Home, key: &str, lower: &Path) -> PathBuf {
        let d = dir(home).join(key);
        std::fs::create_dir_all(d.join("tree/etc")).unwrap();
        std::fs::write(d.join("lower"), format!("{}\n", lower.display())).unwrap();
        d
    }

    #[test]
    fn prune_removes_unusable_and_excess_layers_but_never_one_in_use() {
        let t = tempfile::tempdir().unwrap();
        let home = Home::new(t.path().join("home"));
        let rootfs = t.path().join("rootfs");
        std::fs::create_dir_all(&rootfs).unwrap();
        let gone = t.path().join("removed-rootfs");
        let stale = fake_layer(&home, "stale", &gone);
        let stale_in_use = fake_layer(&home, "stale-in-use", &gone);
        let lease = lease(&stale_in_use).unwrap().expect("an existing layer is leased");
        assert_eq!(lease.tree, stale_in_use.join("tree"));
        let dead_build = dir(&home).join(format!("{BUILD_PREFIX}k-{}", u32::MAX - 1));
        let live_build = dir(&home).join(format!("{BUILD_PREFIX}k-{}", std::process::id()));
        std::fs::create_dir_all(&dead_build).unwrap();
        std::fs::create_dir_all(&live_build).unwrap();
        let damaged = fake_layer(&home, "damaged", &rootfs);
        std::fs::remove_dir_all(damaged.join("tree")).unwrap();
        let mut good = vec![];
        for i in 0..KEEP + 2 {
            let l = fake_layer(&home, &format!("good{i:02}"), &rootfs);
            let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + i as u64);
            std::fs::File::options().write(true).open(l.join("lower")).unwrap().set_modified(t).unwrap();
            good.push(l);
        }
        let removed = prune(&home);
        assert!(!stale.exists() && !dead_build.exists() && !damaged.exists(), "{removed:?}");
        assert!(stale_in_use.exists(), "a layer a job holds stays");
        assert!(live_build.exists(), "a running build stays");
        assert!(!good[0].exists() && !good[1].exists(), "the two oldest beyond KEEP go");
        assert!(good[2..].iter().all(|l| l.exists()));
        assert_eq!(removed.len(), 5, "{removed:?}");
        assert_eq!(std::fs::read_dir(home.trash_dir()).unwrap().count(), 0, "deleted, not left in the trash");
        // Once released, the stale one goes too; a lease of a removed layer is None.
        drop(lease);
        assert_eq!(prune(&home).len(), 1);
        assert!(lease_of_missing(&stale_in_use));
    }

    fn lease_of_missing(p: &Path) -> bool {
        matches!(lease(p), Ok(None))
    }
}

//! Reusing the linker cache of GPU jobs.
//!
//! A GPU job needs `/etc/ld.so.cache` rebuilt (host `ldconfig -r` in the container's mount
//! namespace, once the driver libraries are bound), which costs ~15 ms per job. Its result
//! depends only on what ldconfig sees: the rootfs layers, the bound driver files, the
//! library dirs and symlinks the edits add. So the first job with a given set of those
//! keeps the result (taken from its upper dir right after the container is built, before
//! the job's command has run), and later jobs with the same key get a copy instead of the
//! hook.

use super::plan::JobPlan;
use crate::config::Home;
use sha2::{Digest, Sha256};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where the cached `ld.so.cache` for `plan` lives, or None when the job needs no refresh.
/// Every input ldconfig reads is part of the key: the identity (device, inode, size,
/// mtime, ctime) of each lower layer's root, of its library dirs and ld.so.conf(.d), and of
/// each bound driver file, the container paths, the library dirs and the symlinks. A re-imported rootfs or an upgraded driver
/// gives a new key.
pub fn cache_file(home: &Home, plan: &JobPlan) -> Option<PathBuf> {
    if !plan.edits.update_ldcache || !plan.edits.hooks.is_empty() {
        // Hooks (CDI) may change what ldconfig sees: no reuse then.
        return None;
    }
    let mut h = Sha256::new();
    let id = |p: &Path| match std::fs::metadata(p) {
        Ok(m) => format!("{} {} {} {} {} {}", m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec(), m.ctime_nsec()),
        Err(_) => "missing".into(),
    };
    for l in &plan.lower {
        h.update(format!("lower {} {}\n", l.display(), id(l)));
        // The dirs ldconfig scans: their mtime changes when a library is added or removed.
        for d in ["etc/ld.so.conf", "etc/ld.so.conf.d", "lib", "lib64", "usr/lib", "usr/lib64", "usr/local/lib"] {
            h.update(format!("{d} {}\n", id(&l.join(d))));
        }
        if let Ok(rd) = std::fs::read_dir(l.join("usr/lib")) {
            for e in rd.flatten().filter(|e| e.file_name().to_string_lossy().ends_with("-linux-gnu")) {
                h.update(format!("{} {}\n", e.path().display(), id(&e.path())));
            }
        }
    }
    for m in &plan.edits.mounts {
        h.update(format!("mount {} {} {}\n", m.host_path.display(), m.container_path.display(), id(&m.host_path)));
    }
    for d in &plan.edits.ld_library_dirs {
        h.update(format!("dir {}\n", d.display()));
    }
    for (link, target) in &plan.edits.symlinks {
        h.update(format!("link {} {}\n", link.display(), target.display()));
    }
    let key = crate::rootfs::archive::hex(&h.finalize()[..16]);
    Some(home.cache_dir().join("ldcache").join(format!("{key}.ld.so.cache")))
}

/// Largest linker cache we copy (a real one is tens of KiB).
const MAX_SIZE: u64 = 16 << 20;

/// Reads a cached linker cache (a regular file, not a symlink).
pub fn load(file: &Path) -> Option<Vec<u8>> {
    let m = std::fs::symlink_metadata(file).ok()?;
    if !m.is_file() || m.len() > MAX_SIZE || m.len() == 0 {
        return None;
    }
    std::fs::read(file).ok()
}

/// Keeps `upper/etc/ld.so.cache` (just written by the ldconfig hook, before the job ran)
/// as the cache for its key; atomic, never following a symlink.
pub fn store(upper: &Path, file: &Path) -> std::io::Result<()> {
    let src = upper.join("etc/ld.so.cache");
    let Some(bytes) = load(&src) else { return Ok(()) };
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.{}", file.file_name().and_then(|n| n.to_str()).unwrap_or("c"), std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edits::BindMount;

    fn plan(lower: &Path, lib: &Path) -> JobPlan {
        let mut p = JobPlan {
            id: "j".into(),
            lower: vec![lower.into()],
            args: vec!["true".into()],
            env: vec![],
            cwd: "/".into(),
            uid: 0,
            gid: 0,
            hostname: "j".into(),
            volumes: vec![],
            limits: Default::default(),
            network: Default::default(),
            edits: Default::default(),
            cgroup_path: "/x".into(),
            owned_dirs: vec![],
            rootless: false,
        };
        p.edits.update_ldcache = true;
        p.edits.mounts.push(BindMount {
            host_path: lib.into(),
            container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.535".into(),
            options: vec![],
            optional: false,
        });
        p
    }

    #[test]
    fn key_follows_what_ldconfig_sees() {
        let t = tempfile::tempdir().unwrap();
        let home = Home::new(t.path().join("home"));
        let (lower, lib) = (t.path().join("rootfs"), t.path().join("libcuda.so.535"));
        std::fs::create_dir_all(&lower).unwrap();
        std::fs::write(&lib, "v1").unwrap();
        let a = cache_file(&home, &plan(&lower, &lib)).unwrap();
        assert_eq!(cache_file(&home, &plan(&lower, &lib)).unwrap(), a, "same inputs, same key");
        // The driver file changes (an upgrade): new key.
        std::fs::write(&lib, "v2 longer").unwrap();
        let b = cache_file(&home, &plan(&lower, &lib)).unwrap();
        assert_ne!(a, b);
        // The rootfs is re-imported (a new dir at the same path): new key.
        std::fs::remove_dir(&lower).unwrap();
        std::fs::create_dir_all(&lower).unwrap();
        assert_ne!(cache_file(&home, &plan(&lower, &lib)).unwrap(), b);
        // No refresh needed, or hooks that could change the view: no cache.
        let mut p = plan(&lower, &lib);
        p.edits.update_ldcache = false;
        assert!(cache_file(&home, &p).is_none());
    }

    #[test]
    fn store_and_load_refuse_symlinks_and_empty_files() {
        let t = tempfile::tempdir().unwrap();
        let upper = t.path().join("upper");
        std::fs::create_dir_all(upper.join("etc")).unwrap();
        let out = t.path().join("c/k.ld.so.cache");
        std::os::unix::fs::symlink("/etc/shadow", upper.join("etc/ld.so.cache")).unwrap();
        store(&upper, &out).unwrap();
        assert!(!out.exists(), "a symlink planted in the upper dir is not followed");
        std::fs::remove_file(upper.join("etc/ld.so.cache")).unwrap();
        std::fs::write(upper.join("etc/ld.so.cache"), b"glibc-ld.so.cache1.1").unwrap();
        store(&upper, &out).unwrap();
        assert_eq!(load(&out).unwrap(), b"glibc-ld.so.cache1.1");
    }
}

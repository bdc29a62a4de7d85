//! A GPU job's changes to its tree, made once into a cached read-only layer.
//!
//! Every job with the same rootfs and driver changes its tree the same way: empty files
//! and dirs where the driver's files and the datasets are bound, the libraries' SONAME
//! links, the `ld.so.conf.d` entry, and the linker cache host `ldconfig` builds over all
//! of them. Made per job, those went into the job's upper layer (copy-ups of `/etc`,
//! `/usr`, `/usr/bin`, new dirs, each deleted again at teardown with a discard per block
//! on this VM's disk) and `ldconfig` ran as a hook (~15 ms). Here they are made once per
//! [`key`]: in an overlay over the job's own lower layers, whose upper dir then becomes
//! the topmost lower layer of every job with that key. A job's upper layer starts empty.
//!
//! As root, with the home on the driver's filesystem, the driver's plain files are hard
//! links in the layer instead of per-job binds (`links.rs`).
//!
//! Layout: `HOME/cache/edit-layers/<key>/{tree,lower,linked}` (`lower`: the layers it
//! was built over, one per line; `linked`: the hard-linked files and their host
//! identity); `.build-<key>-<pid>` while a helper builds one.
//!
//! Lifetime: a job's helper holds a shared flock on its layer's dir while the job lives.
//! [`prune`] (after each build, `gc`, the end of `run`, `rootfs rm`) removes layers whose
//! lower layers are gone, whose linked host files were replaced or whose tree is gone,
//! and the oldest beyond [`KEEP`], each only under an exclusive flock that it holds while
//! renaming the layer into the trash. A helper that finds the name gone after its lock,
//! or the tree deleted, builds the layer again.
//!
//! Not used when the edits carry hooks (a CDI spec's hooks run per job and may change
//! anything in the tree): those jobs get the edits in their own upper layer, as before.

mod build;
mod links;
mod prune;

pub use prune::prune;

use super::inroot;
use super::plan::JobPlan;
use crate::config::Home;
use crate::edits::ContainerEdits;
use crate::sys::fs_at;
use crate::sys::Sys;
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// At most this many usable layers are kept per home, the oldest built go first (a new
/// rootfs, driver or dataset list each makes a new key).
pub const KEEP: usize = 16;
pub(super) const BUILD_PREFIX: &str = ".build-";
/// Bumped when what a layer holds changes, so old layers are not reused.
const FORMAT: &str = "edit-layer 1";

/// Where a home keeps its edit layers.
pub fn dir(home: &Home) -> PathBuf {
    home.cache_dir().join("edit-layers")
}

/// Do these edits get a cached layer? Only when they change the tree, and carry no hooks.
pub fn wanted(edits: &ContainerEdits) -> bool {
    edits.hooks.is_empty()
        && (!edits.mounts.is_empty()
            || !edits.symlinks.is_empty()
            || !edits.ld_library_dirs.is_empty()
            || edits.update_ldcache)
}

/// Identity of a bound host file: an upgraded driver file (a new inode, or written in
/// place: size, mtime) differs. Not its ctime: hard-linking the file into a layer (see
/// [`links::link_bound_files`]) changes that.
pub(super) fn source_identity(p: &Path) -> String {
    identity_of(p, false)
}

/// Identity of a lower layer's dir: a re-imported rootfs differs.
fn identity(p: &Path) -> String {
    identity_of(p, true)
}

fn identity_of(p: &Path, with_ctime: bool) -> String {
    let Ok(m) = std::fs::metadata(p) else { return "missing".into() };
    let ctime = if with_ctime { format!(" {}", m.ctime_nsec()) } else { String::new() };
    let kind = m.mode() & libc::S_IFMT;
    format!("{kind:o} {} {} {} {} {}{ctime}", m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec())
}

/// Everything a layer depends on, hashed: the lower layers (each root's identity and that
/// of the dirs ldconfig scans, whose mtime changes when a library is added or removed),
/// each bound file's identity and container path, each dataset's container path and
/// kind, the links, the library dirs, and the mode (rootless layers keep overlayfs
/// metadata in other xattrs).
pub fn key(plan: &JobPlan) -> String {
    let mut text = format!("{FORMAT} rootless={} ldcache={}\n", plan.rootless, plan.edits.update_ldcache);
    for l in &plan.lower {
        text += &format!("lower {} {}\n", l.display(), identity(l));
        for d in ["etc/ld.so.conf", "etc/ld.so.conf.d", "lib", "lib64", "usr/lib", "usr/lib64", "usr/local/lib"] {
            text += &format!("{d} {}\n", identity(&l.join(d)));
        }
        if let Ok(rd) = std::fs::read_dir(l.join("usr/lib")) {
            let mut arch: Vec<PathBuf> = rd
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with("-linux-gnu"))
                .map(|e| e.path())
                .collect();
            arch.sort();
            for p in arch {
                text += &format!("{} {}\n", p.display(), identity(&p));
            }
        }
    }
    for m in &plan.edits.mounts {
        let id = source_identity(&m.host_path);
        text += &format!("mount {} {} {id}\n", m.host_path.display(), m.container_path.display());
    }
    for v in &plan.volumes {
        text += &format!("volume {} {}\n", v.container.display(), if v.host.is_dir() { "dir" } else { "file" });
    }
    for d in &plan.edits.ld_library_dirs {
        text += &format!("libdir {}\n", d.display());
    }
    for (link, target) in &plan.edits.symlinks {
        text += &format!("link {} {}\n", link.display(), target.display());
    }
    crate::digest::hex(&Sha256::digest(text.as_bytes())[..16])
}

/// A layer in use: its dir stays locked (shared) until this is dropped.
pub struct EditLayer {
    _lock: std::fs::File,
    /// The layer's root, to stack above the job's lower layers.
    pub tree: PathBuf,
    /// Container paths of bound files the layer holds as hard links to the host file.
    pub linked: Vec<PathBuf>,
}

impl EditLayer {
    /// Puts the layer on top of the plan's lower layers; the edits it holds are then
    /// not made again in the job's upper layer, nor is the linker cache rebuilt, nor
    /// are the files it links bound.
    pub fn stack_on(&self, plan: &mut JobPlan) {
        plan.edits.mounts.retain(|m| !self.linked.contains(&m.container_path));
        plan.lower.insert(0, self.tree.clone());
        plan.edits.symlinks.clear();
        plan.edits.ld_library_dirs.clear();
        plan.edits.update_ldcache = false;
    }
}

/// The layer for `plan`, built first when no earlier job left it. Runs in the helper,
/// in its private mount namespace (the build mounts there).
pub fn obtain(home: &Home, plan: &JobPlan, sys: &dyn Sys) -> Result<EditLayer> {
    let key = key(plan);
    let path = dir(home).join(&key);
    for _ in 0..3 {
        if let Some(layer) = lease(&path)? {
            if layer.tree.is_dir() {
                return Ok(layer);
            }
            // Damaged by hand (its tree deleted): no job can mount it. Replace it.
            drop(layer);
            if let Some(r) = prune::remove_unused(home, &path, "its tree is missing") {
                tracing::warn!("removed {r}; building it again");
            }
        }
        build::build(home, plan, &key, sys)?;
    }
    bail!(
        "the edit layer {} was removed while being taken three times: is another gc running in a loop?",
        path.display()
    )
}

/// Locks the layer at `path` (shared) if it is there. A prune holds the lock while it
/// renames the layer away, so after the lock the name must still be this dir.
pub(super) fn lease(path: &Path) -> Result<Option<EditLayer>> {
    let f = match std::fs::File::open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        r => r.with_context(|| format!("cannot open the edit layer {}", path.display()))?,
    };
    fs_at::flock(std::os::fd::AsFd::as_fd(&f), libc::LOCK_SH)
        .with_context(|| format!("cannot lock the edit layer {}", path.display()))?;
    let held = f.metadata().with_context(|| format!("cannot stat the edit layer {}", path.display()))?;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.dev() == held.dev() && m.ino() == held.ino() => {
            // Unreadable or malformed: no links, so the job binds every file (also right).
            let linked = links::read_links(path).unwrap_or_default().into_iter().map(|r| r.container).collect();
            Ok(Some(EditLayer { _lock: f, tree: path.join("tree"), linked }))
        }
        _ => Ok(None),
    }
}

/// Writes what the edits need before the container exists: library symlinks and the
/// linker search path entry. Paths resolve inside the tree (see [`inroot`]): the rootfs
/// is image content and may hold hostile symlinks. Into the edit layer, or into the
/// job's own upper layer when there is none.
pub fn write_edits(merged: &Path, edits: &ContainerEdits) -> Result<()> {
    if !edits.ld_library_dirs.is_empty() {
        // "000-" sorts first: ldconfig scans these dirs before the rootfs's own, and for
        // one soname the first dir scanned wins (verified in the gpu tests).
        let body: String = edits.ld_library_dirs.iter().map(|d| format!("{}\n", d.display())).collect();
        inroot::write_file(merged, Path::new(crate::gpu::inject::LDCONF_D_FILE), body.as_bytes(), 0o644)
            .context("cannot write the sandbox's ld.so.conf.d entry")?;
    }
    for (link, target) in &edits.symlinks {
        inroot::symlink(merged, link, target).with_context(|| {
            format!("cannot create symlink {} -> {} in the sandbox", link.display(), target.display())
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Volume;
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
            net: Default::default(),
            edits: Default::default(),
            cgroup_path: "/x".into(),
            owned_dirs: vec![],
            rootless: false,
            process: Default::default(),
            userns: None,
            scratch: None,
            caches: vec![],
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
    fn key_follows_what_the_layer_is_made_of() {
        let t = tempfile::tempdir().unwrap();
        let (lower, lib) = (t.path().join("rootfs"), t.path().join("libcuda.so.535"));
        std::fs::create_dir_all(&lower).unwrap();
        std::fs::write(&lib, "v1").unwrap();
        let a = key(&plan(&lower, &lib));
        assert_eq!(key(&plan(&lower, &lib)), a, "same inputs, same key");
        assert_eq!(a.len(), 32);
        // The driver file changes (an upgrade): new key.
        std::fs::write(&lib, "v2 longer").unwrap();
        let b = key(&plan(&lower, &lib));
        assert_ne!(a, b);
        // The rootfs is re-imported (a new dir at the same path): new key.
        std::fs::remove_dir(&lower).unwrap();
        std::fs::create_dir_all(&lower).unwrap();
        let c = key(&plan(&lower, &lib));
        assert_ne!(c, b);
        // A dataset is a mount target too: its path and kind are part of the key, its
        // contents are not.
        let data = t.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let mut p = plan(&lower, &lib);
        p.volumes.push(Volume { host: data.clone(), container: "/data".into(), env: None });
        let d = key(&p);
        assert_ne!(d, c);
        std::fs::write(data.join("new-file"), "x").unwrap();
        assert_eq!(key(&p), d);
        // Rootless layers differ (overlayfs keeps its metadata in user. xattrs there).
        p.rootless = true;
        assert_ne!(key(&p), d);
    }

    #[test]
    fn only_tree_changing_edits_without_hooks_get_a_layer() {
        let t = tempfile::tempdir().unwrap();
        let p = plan(t.path(), &t.path().join("lib"));
        assert!(wanted(&p.edits));
        assert!(!wanted(&ContainerEdits::default()));
        let env_only = ContainerEdits { env: vec![("A".into(), "b".into())], ..Default::default() };
        assert!(!wanted(&env_only));
        let mut hooked = p.edits.clone();
        hooked.hooks.push(crate::edits::Hook {
            stage: crate::edits::HookStage::CreateContainer,
            path: "/bin/hook".into(),
            args: vec![],
            env: vec![],
            timeout: None,
        });
        assert!(!wanted(&hooked), "a CDI hook may change the tree per job");
    }
}

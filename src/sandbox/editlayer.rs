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
//! Layout: `HOME/cache/edit-layers/<key>/{tree,lower}` (`lower`: the layers it was
//! built over, one per line); `.build-<key>-<pid>` while a helper builds one.
//!
//! Lifetime: a job's helper holds a shared flock on its layer's dir while the job lives.
//! [`prune`] (after each build, `gc`, `rootfs rm`) removes layers whose lower layers are
//! gone and the oldest beyond [`KEEP`], each only under an exclusive flock that it holds
//! while renaming the layer into the trash. A helper that finds the name gone after its
//! lock builds the layer again.
//!
//! Not used when the edits carry hooks (a CDI spec's hooks run per job and may change
//! anything in the tree): those jobs get the edits in their own upper layer, as before.

use super::inroot;
use super::plan::JobPlan;
use crate::config::Home;
use crate::edits::ContainerEdits;
use crate::rootfs::fs as sysfs;
use crate::sys::{Overlay, Sys};
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Layers kept per home beyond the ones whose lower layers are gone (an upgraded
/// driver, a changed dataset list, ... each makes a new key).
pub const KEEP: usize = 16;
const BUILD_PREFIX: &str = ".build-";
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
/// [`link_bound_files`]) changes that.
fn source_identity(p: &Path) -> String {
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
    crate::rootfs::archive::hex(&Sha256::digest(text.as_bytes())[..16])
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
            return Ok(layer);
        }
        build(home, plan, &key, sys)?;
    }
    bail!(
        "the edit layer {} was removed while being taken three times: is another gc running in a loop?",
        path.display()
    )
}

/// Locks the layer at `path` (shared) if it is there. A prune holds the lock while it
/// renames the layer away, so after the lock the name must still be this dir.
fn lease(path: &Path) -> Result<Option<EditLayer>> {
    let f = match std::fs::File::open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        r => r.with_context(|| format!("cannot open the edit layer {}", path.display()))?,
    };
    sysfs::flock(std::os::fd::AsFd::as_fd(&f), libc::LOCK_SH)
        .with_context(|| format!("cannot lock the edit layer {}", path.display()))?;
    let held = f.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.dev() == held.dev() && m.ino() == held.ino() => {
            let links = std::fs::read_to_string(path.join(LINKED)).unwrap_or_default();
            let linked = parse_links(&links).into_iter().map(|l| l.container).collect();
            Ok(Some(EditLayer { _lock: f, tree: path.join("tree"), linked }))
        }
        _ => Ok(None),
    }
}

/// Builds the layer for `plan` under `key`: an overlay over the plan's lower layers in a
/// private build dir, the edits made in it, its upper dir synced and renamed into place.
/// Another helper building the same key at the same time is fine: the first rename wins.
fn build(home: &Home, plan: &JobPlan, key: &str, sys: &dyn Sys) -> Result<()> {
    let parent = dir(home);
    let b = parent.join(format!("{BUILD_PREFIX}{key}-{}", std::process::id()));
    let started = std::time::Instant::now();
    std::fs::create_dir_all(&parent).with_context(|| format!("cannot create {}: disk full?", parent.display()))?;
    sysfs::remove_tree(&b).with_context(|| format!("cannot remove the old build dir {}", b.display()))?;
    let result = build_in(plan, &b, sys);
    if let Err(e) = result {
        let _ = sysfs::remove_tree(&b);
        return Err(e.context(format!("cannot build the sandbox's edit layer in {}", b.display())));
    }
    let target = parent.join(key);
    match sysfs::rename_noreplace(&b, &target) {
        Ok(()) => {
            let _ = sysfs::fsync_dir(&parent);
            tracing::info!(layer = %target.display(), ms = started.elapsed().as_millis() as u64, "built the GPU edit layer (driver binds, links, linker cache) for later jobs");
        }
        Err(e) if matches!(sysfs::errno(&e), libc::EEXIST | libc::ENOTEMPTY) => {
            let _ = sysfs::remove_tree(&b);
        }
        Err(e) => {
            let _ = sysfs::remove_tree(&b);
            return Err(e).with_context(|| format!("cannot move the edit layer into {}", target.display()));
        }
    }
    for r in prune(home) {
        tracing::info!("removed {r}");
    }
    Ok(())
}

fn build_in(plan: &JobPlan, b: &Path, sys: &dyn Sys) -> Result<()> {
    let (tree, work, merged) = (b.join("tree"), b.join("work"), b.join("merged"));
    for d in [b, &tree, &work, &merged] {
        std::fs::create_dir(d).with_context(|| format!("cannot create {}: disk full?", d.display()))?;
    }
    sys.mount_overlay(&Overlay {
        lower: plan.lower.clone(),
        upper: tree.clone(),
        work: work.clone(),
        target: merged.clone(),
        userxattr: plan.rootless,
    })?;
    let made = make_edits(plan, &merged, sys);
    // Detaches the binds made for ldconfig with it.
    sys.unmount(&merged)?;
    let candidates = made?;
    sysfs::remove_tree(&work).with_context(|| format!("cannot remove {}", work.display()))?;
    std::fs::remove_dir(&merged).with_context(|| format!("cannot remove {}", merged.display()))?;
    let linked = link_bound_files(&tree, candidates);
    std::fs::write(b.join(LINKED), format_links(&linked)).context("cannot write the edit layer's links: disk full?")?;
    let lower: String = plan.lower.iter().map(|l| format!("{}\n", l.display())).collect();
    std::fs::write(b.join("lower"), lower).context("cannot write the edit layer's lower list: disk full?")?;
    // The overlay was volatile: nothing of it reached the disk for sure. A layer outlives
    // the job and a crash, so it is synced before its name appears.
    sync_tree(b).context("cannot sync the edit layer: disk full or failing?")
}

/// The edits, made in the tree mounted at `merged`: links, the linker config, every bind
/// target, and the linker cache over the bound files. Returns the bound files that may
/// become hard links (see [`link_bound_files`]).
fn make_edits(plan: &JobPlan, merged: &Path, sys: &dyn Sys) -> Result<Vec<Link>> {
    write_edits(merged, &plan.edits)?;
    let targets = plan.edits.mounts.iter().map(|m| (&m.container_path, m.host_path.is_dir()));
    for (path, is_dir) in targets.chain(plan.volumes.iter().map(|v| (&v.container, v.host.is_dir()))) {
        inroot::create_mount_target(merged, path, is_dir)
            .with_context(|| format!("cannot create the mount point {} in the sandbox", path.display()))?;
    }
    let candidates = plan.edits.mounts.iter().filter_map(|m| link_candidate(merged, m)).collect();
    if !plan.edits.update_ldcache {
        return Ok(candidates);
    }
    // ldconfig reads each library's SONAME: it must see the bound files, not the
    // empty targets.
    for m in plan.edits.mounts.iter().filter(|m| m.host_path.is_file()) {
        let fd = inroot::open_existing(merged, &m.container_path)
            .with_context(|| format!("cannot open {} in the sandbox", m.container_path.display()))?;
        if !sysfs::fstat(fd.as_raw_fd()).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG) {
            continue;
        }
        sys.bind_mount(&m.host_path, &PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())))?;
    }
    let ldconfig = super::spec::host_ldconfig()?;
    let out = std::process::Command::new(ldconfig)
        .arg("-r")
        .arg(merged)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", ldconfig.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!("{} -r failed ({}): {}", ldconfig.display(), out.status, err.lines().last().unwrap_or("no output"));
    }
    Ok(candidates)
}

/// Name of the file in a layer's dir listing its hard-linked bound files.
const LINKED: &str = "linked";

/// A bound file held in a layer as a hard link to the host file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Link {
    container: PathBuf,
    host: PathBuf,
    /// Where the layer holds it (relative to the layer's tree).
    in_tree: PathBuf,
}

/// A read-only bind of a plain host file (not setuid/setgid: a bind would be nosuid)
/// whose mount target is an empty file in the layer: it can be a hard link instead.
fn link_candidate(merged: &Path, m: &crate::edits::BindMount) -> Option<Link> {
    let meta = std::fs::symlink_metadata(&m.host_path).ok()?;
    let plain_ro = ["ro", "nosuid", "nodev"].iter().all(|o| m.options.iter().any(|x| x == o));
    let text = |p: &Path| p.to_str().filter(|s| !s.contains(['\t', '\n'])).map(String::from);
    text(&m.host_path)?;
    text(&m.container_path)?;
    if !meta.is_file() || meta.mode() & 0o6000 != 0 || !plain_ro {
        return None;
    }
    let fd = inroot::open_existing(merged, &m.container_path).ok()?;
    let st = sysfs::fstat(fd.as_raw_fd()).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size != 0 {
        return None;
    }
    let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    let in_tree = real.strip_prefix(merged).ok()?.to_path_buf();
    Some(Link { container: m.container_path.clone(), host: m.host_path.clone(), in_tree })
}

/// Replaces the empty mount targets of `candidates` in the finished layer with hard links
/// to the host files: a job then needs no bind for them (each costs libcontainer ~35
/// syscalls and a mount). The job sees the host file's inode, read-only in effect (a
/// write copies it up into the job's own layer). Only where the build itself created the
/// target (an empty file in the layer, not one of the rootfs's), and where the kernel
/// allows it: another filesystem (EXDEV) or protected_hardlinks for a non-root user
/// (EPERM) leave the bind.
fn link_bound_files(tree: &Path, candidates: Vec<Link>) -> Vec<Link> {
    let mut linked = vec![];
    for c in candidates {
        let at = tree.join(&c.in_tree);
        if !std::fs::symlink_metadata(&at).is_ok_and(|m| m.is_file() && m.len() == 0) {
            continue;
        }
        let tmp = at.with_file_name(format!(".link-{}", sysfs::random_suffix()));
        match std::fs::hard_link(&c.host, &tmp).and_then(|()| std::fs::rename(&tmp, &at)) {
            Ok(()) => linked.push(c),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                tracing::debug!("{} stays a bind ({e})", c.container.display());
            }
        }
    }
    linked
}

/// `container \t host-identity \t host` per line.
fn format_links(links: &[Link]) -> String {
    links
        .iter()
        .map(|l| format!("{}\t{}\t{}\n", l.container.display(), source_identity(&l.host), l.host.display()))
        .collect()
}

fn parse_links(text: &str) -> Vec<Link> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, '\t');
            let (c, _, h) = (f.next()?, f.next()?, f.next()?);
            Some(Link { container: c.into(), host: h.into(), in_tree: PathBuf::new() })
        })
        .collect()
}

/// Do the host files a layer links still have the identity they had at the build? A
/// driver upgrade replaces them (new inodes): the layer's links then keep the old
/// files on disk, and no new job can use it (its key differs).
fn links_current(layer: &Path) -> bool {
    let text = std::fs::read_to_string(layer.join(LINKED)).unwrap_or_default();
    text.lines().all(|l| {
        let mut f = l.splitn(3, '\t');
        match (f.next(), f.next(), f.next()) {
            (Some(_), Some(id), Some(host)) => source_identity(Path::new(host)) == id,
            _ => false,
        }
    })
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

/// fsync of every file and dir under `dir` (a few dozen entries), then of `dir`.
fn sync_tree(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            sync_tree(&e.path())?;
        } else if t.is_file() {
            std::fs::File::open(e.path())?.sync_all()?;
        }
    }
    sysfs::fsync_dir(dir)
}

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
            if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) && sysfs::remove_tree(&path).is_ok() {
                removed.push(format!("interrupted edit-layer build {}", path.display()));
            }
            continue;
        }
        let built = std::fs::read_to_string(path.join("lower")).ok().and_then(|lower| {
            let all_there = lower.lines().all(|l| Path::new(l).is_dir()) && links_current(&path);
            let t = std::fs::metadata(path.join("lower")).and_then(|m| m.modified()).ok()?;
            all_there.then_some(t)
        });
        match built {
            Some(t) => kept.push((t, path)),
            None => removed.extend(remove_unused(home, &path, "its lower layers or linked driver files changed")),
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
fn remove_unused(home: &Home, path: &Path, why: &str) -> Option<String> {
    let f = std::fs::File::open(path).ok()?;
    sysfs::flock(std::os::fd::AsFd::as_fd(&f), libc::LOCK_EX | libc::LOCK_NB).ok()?;
    let trash = home.trash_dir().join(format!("edit-layer-{}", sysfs::random_suffix()));
    std::fs::create_dir_all(home.trash_dir()).ok()?;
    std::fs::rename(path, &trash).ok()?;
    drop(f);
    let _ = sysfs::remove_tree(&trash);
    Some(format!("edit layer {} ({why})", path.display()))
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
        let mut good = vec![];
        for i in 0..KEEP + 2 {
            let l = fake_layer(&home, &format!("good{i:02}"), &rootfs);
            let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + i as u64);
            std::fs::File::options().write(true).open(l.join("lower")).unwrap().set_modified(t).unwrap();
            good.push(l);
        }
        let removed = prune(&home);
        assert!(!stale.exists() && !dead_build.exists(), "{removed:?}");
        assert!(stale_in_use.exists(), "a layer a job holds stays");
        assert!(live_build.exists(), "a running build stays");
        assert!(!good[0].exists() && !good[1].exists(), "the two oldest beyond KEEP go");
        assert!(good[2..].iter().all(|l| l.exists()));
        assert_eq!(removed.len(), 4, "{removed:?}");
        assert_eq!(std::fs::read_dir(home.trash_dir()).unwrap().count(), 0, "deleted, not left in the trash");
        // Once released, the stale one goes too; a lease of a removed layer is None.
        drop(lease);
        assert_eq!(prune(&home).len(), 1);
        assert!(lease_of_missing(&stale_in_use));
    }

    #[test]
    fn bound_files_become_hard_links_where_the_build_made_the_target() {
        let t = tempfile::tempdir().unwrap();
        let tree = t.path().join("tree");
        std::fs::create_dir_all(tree.join("lib")).unwrap();
        let host = t.path().join("libcuda.so.1.2");
        std::fs::write(&host, "elf").unwrap();
        std::fs::write(tree.join("lib/libcuda.so.1.2"), "").unwrap();
        std::fs::write(tree.join("lib/rootfs-own.so"), "not empty: the rootfs's file").unwrap();
        let link = |name: &str| Link {
            container: Path::new("/lib").join(name),
            host: host.clone(),
            in_tree: Path::new("lib").join(name),
        };
        let candidates = vec![link("libcuda.so.1.2"), link("rootfs-own.so"), link("absent.so")];
        let linked = link_bound_files(&tree, candidates);
        assert_eq!(linked, vec![link("libcuda.so.1.2")], "only the empty target the build made");
        let (a, b) = (std::fs::metadata(&host).unwrap(), std::fs::metadata(tree.join("lib/libcuda.so.1.2")).unwrap());
        assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()), "the host file's inode");
        assert_eq!(std::fs::read(tree.join("lib/rootfs-own.so")).unwrap(), b"not empty: the rootfs's file");
        // The list round-trips, and tells when the host file was replaced (an upgrade).
        let layer = t.path();
        std::fs::write(layer.join(LINKED), format_links(&linked)).unwrap();
        let back = parse_links(&std::fs::read_to_string(layer.join(LINKED)).unwrap());
        assert_eq!(
            back.iter().map(|l| (&l.container, &l.host)).collect::<Vec<_>>(),
            vec![(&linked[0].container, &host)]
        );
        assert!(links_current(layer));
        std::fs::remove_file(&host).unwrap();
        std::fs::write(&host, "new driver").unwrap();
        assert!(!links_current(layer));
    }

    fn lease_of_missing(p: &Path) -> bool {
        matches!(lease(p), Ok(None))
    }
}

//! Building an edit layer: an overlay over the job's lower layers in a private build
//! dir, the edits made in it, the upper dir synced and renamed into place.

use super::links::{self, Link};
use super::{dir, inroot, prune, write_edits, BUILD_PREFIX};
use crate::config::Home;
use crate::sandbox::plan::JobPlan;
use crate::sys::fs_at;
use crate::sys::{InTree, Overlay, Sys};
use anyhow::{bail, Context, Result};
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;

/// Builds the layer for `plan` under `key`: an overlay over the plan's lower layers in a
/// private build dir, the edits made in it, its upper dir synced and renamed into place.
/// Another helper building the same key at the same time is fine: the first rename wins.
pub(super) fn build(home: &Home, plan: &JobPlan, key: &str, sys: &dyn Sys) -> Result<()> {
    let parent = dir(home);
    let b = parent.join(format!("{BUILD_PREFIX}{key}-{}", std::process::id()));
    let started = std::time::Instant::now();
    std::fs::create_dir_all(&parent).with_context(|| format!("cannot create {}: disk full?", parent.display()))?;
    sys.remove_tree(&b).context("cannot remove the old build dir")?;
    let result = build_in(plan, &b, sys);
    if let Err(e) = result {
        let _ = sys.remove_tree(&b);
        return Err(e.context(format!("cannot build the sandbox's edit layer in {}", b.display())));
    }
    let target = parent.join(key);
    match fs_at::rename_noreplace(&b, &target) {
        Ok(()) => {
            let _ = fs_at::fsync_dir(&parent);
            tracing::info!(layer = %target.display(), ms = started.elapsed().as_millis() as u64, "built the GPU edit layer (driver binds, links, linker cache) for later jobs");
        }
        Err(e) if matches!(fs_at::errno(&e), libc::EEXIST | libc::ENOTEMPTY) => {
            let _ = sys.remove_tree(&b);
        }
        Err(e) => {
            let _ = sys.remove_tree(&b);
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
    sys.remove_tree(&work)?;
    sys.remove_dir(&merged)?;
    let linked = links::link_bound_files(&tree, candidates);
    std::fs::write(b.join(links::LINKED), links::format_links(&linked))
        .context("cannot write the edit layer's links: disk full?")?;
    let lower: String = plan.lower.iter().map(|l| format!("{}\n", l.display())).collect();
    std::fs::write(b.join("lower"), lower).context("cannot write the edit layer's lower list: disk full?")?;
    // The overlay was volatile: nothing of it reached the disk for sure. A layer outlives
    // the job and a crash, so it is synced before its name appears.
    sync_tree(b).context("cannot sync the edit layer: disk full or failing?")
}

/// The edits, made in the tree mounted at `merged`: links, the linker config, every bind
/// target, and the linker cache over the bound files. Returns the bound files that may
/// become hard links (see [`links::link_bound_files`]).
fn make_edits(plan: &JobPlan, merged: &Path, sys: &dyn Sys) -> Result<Vec<Link>> {
    write_edits(merged, &plan.edits)?;
    let targets = plan.edits.mounts.iter().map(|m| (&m.container_path, m.host_path.is_dir()));
    for (path, is_dir) in targets.chain(plan.volumes.iter().map(|v| (&v.container, v.host.is_dir()))) {
        inroot::create_mount_target(merged, path, is_dir)
            .with_context(|| format!("cannot create the mount point {} in the sandbox", path.display()))?;
    }
    let candidates = plan.edits.mounts.iter().filter_map(|m| links::link_candidate(merged, m)).collect();
    if !plan.edits.update_ldcache {
        return Ok(candidates);
    }
    // ldconfig reads each library's SONAME: it must see the bound files, not the
    // empty targets.
    for m in plan.edits.mounts.iter().filter(|m| m.host_path.is_file()) {
        let fd = inroot::open_existing(merged, &m.container_path)
            .with_context(|| format!("cannot open {} in the sandbox", m.container_path.display()))?;
        if !fs_at::fstat(fd.as_raw_fd()).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG) {
            continue;
        }
        sys.bind_in_tree(&m.host_path, InTree { fd: fd.as_fd(), dst: &m.container_path })?;
    }
    let ldconfig = crate::sandbox::spec::host_ldconfig()?;
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
    fs_at::fsync_dir(dir)
}

//! Bound driver files held in an edit layer as hard links to the host files.

use super::{inroot, source_identity};
use crate::sys::fs_at;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Name of the file in a layer's dir listing its hard-linked bound files.
pub(super) const LINKED: &str = "linked";

/// A bound file held in a layer as a hard link to the host file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Link {
    pub(super) container: PathBuf,
    pub(super) host: PathBuf,
    /// Where the layer holds it (relative to the layer's tree).
    in_tree: PathBuf,
}

/// A read-only bind of a plain host file (not setuid/setgid: a bind would be nosuid)
/// whose mount target is an empty file in the layer: it can be a hard link instead.
pub(super) fn link_candidate(merged: &Path, m: &crate::edits::BindMount) -> Option<Link> {
    let meta = std::fs::symlink_metadata(&m.host_path).ok()?;
    let plain_ro = ["ro", "nosuid", "nodev"].iter().all(|o| m.options.iter().any(|x| x == o));
    // Both paths go on one tab-separated line of the layer's `linked` file.
    let one_field = |p: &Path| p.to_str().is_some_and(|s| !s.contains(['\t', '\n']));
    if !one_field(&m.host_path) || !one_field(&m.container_path) {
        return None;
    }
    if !meta.is_file() || meta.mode() & 0o6000 != 0 || !plain_ro {
        return None;
    }
    let fd = inroot::open_existing(merged, &m.container_path).ok()?;
    let st = fs_at::fstat(fd.as_raw_fd()).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size != 0 {
        return None;
    }
    let real = fs_at::fd_path(fd.as_raw_fd()).ok()?;
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
pub(super) fn link_bound_files(tree: &Path, candidates: Vec<Link>) -> Vec<Link> {
    let mut linked = vec![];
    for c in candidates {
        let at = tree.join(&c.in_tree);
        if !std::fs::symlink_metadata(&at).is_ok_and(|m| m.is_file() && m.len() == 0) {
            continue;
        }
        let tmp = at.with_file_name(format!(".link-{}", fs_at::random_suffix()));
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
pub(super) fn format_links(links: &[Link]) -> String {
    links
        .iter()
        .map(|l| format!("{}\t{}\t{}\n", l.container.display(), source_identity(&l.host), l.host.display()))
        .collect()
}

/// One line of a layer's `linked` file.
pub(super) struct Recorded {
    pub(super) container: PathBuf,
    pub(super) host: PathBuf,
    /// The host file's identity when it was linked.
    identity: String,
}

/// A layer's `linked` file (no file: no links); None when a line is malformed.
pub(super) fn read_links(layer: &Path) -> Option<Vec<Recorded>> {
    let text = std::fs::read_to_string(layer.join(LINKED)).unwrap_or_default();
    text.lines()
        .map(|l| {
            let mut f = l.splitn(3, '\t');
            let (c, id, h) = (f.next()?, f.next()?, f.next()?);
            Some(Recorded { container: c.into(), host: h.into(), identity: id.into() })
        })
        .collect()
}

/// Do the host files a layer links still have the identity they had at the build? A
/// driver upgrade replaces them (new inodes): the layer's links then keep the old
/// files on disk, and no new job can use it (its key differs).
pub(super) fn links_current(layer: &Path) -> bool {
    read_links(layer).is_some_and(|all| all.iter().all(|r| source_identity(&r.host) == r.identity))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let back = read_links(layer).unwrap();
        assert_eq!(
            back.iter().map(|l| (&l.container, &l.host)).collect::<Vec<_>>(),
            vec![(&linked[0].container, &host)]
        );
        assert!(links_current(layer));
        std::fs::remove_file(&host).unwrap();
        std::fs::write(&host, "new driver").unwrap();
        assert!(!links_current(layer));
    }
}

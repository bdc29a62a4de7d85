//! Path resolution inside a driver root, as `chroot` would see it.
//!
//! Driver trees are full of absolute symlinks (`usr/lib/x86_64-linux-gnu/libcuda.so.1 ->
//! /etc/alternatives/... -> /usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1`). With
//! `--driver-root DIR` those must resolve under DIR, never on the host's `/`.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

const MAX_SYMLINKS: usize = 40;

/// Resolves `path` (as seen inside `root`; relative paths count from the root) following
/// every symlink, with absolute targets and `..` kept inside `root`. Returns the in-root
/// path of the final, non-symlink file. Fails with `NotFound` when a component is missing.
pub fn resolve_in_root(root: &Path, path: &Path) -> io::Result<PathBuf> {
    let mut todo: VecDeque<OsString> = components(path).into();
    let mut resolved = PathBuf::from("/");
    let mut hops = 0;
    while let Some(comp) = todo.pop_front() {
        if comp == ".." {
            resolved.pop();
            continue;
        }
        let candidate = resolved.join(&comp);
        let host = host_path(root, &candidate);
        let meta = std::fs::symlink_metadata(&host)?;
        if meta.file_type().is_symlink() {
            hops += 1;
            if hops > MAX_SYMLINKS {
                return Err(io::Error::other(format!("too many levels of symbolic links at {}", host.display())));
            }
            let target = std::fs::read_link(&host)?;
            if target.is_absolute() {
                resolved = PathBuf::from("/");
            }
            for (i, c) in components(&target).into_iter().enumerate() {
                todo.insert(i, c);
            }
        } else {
            resolved = candidate;
        }
    }
    Ok(resolved)
}

/// `root` + in-root absolute `path`.
pub fn host_path(root: &Path, path: &Path) -> PathBuf {
    let rel = path.strip_prefix("/").unwrap_or(path);
    if rel.as_os_str().is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    }
}

/// Resolves in root and returns the host path of the final file.
pub fn resolve_host(root: &Path, path: &Path) -> io::Result<PathBuf> {
    resolve_in_root(root, path).map(|p| host_path(root, &p))
}

/// Maps a host path back to its in-root path, when it lies under `root`.
pub fn in_root(root: &Path, host: &Path) -> Option<PathBuf> {
    host.strip_prefix(root).ok().map(|rel| Path::new("/").join(rel))
}

fn components(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn absolute_links_and_dotdot_stay_in_root() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir_all(r.join("usr/lib/nv/current")).unwrap();
        std::fs::create_dir_all(r.join("etc/alternatives")).unwrap();
        std::fs::write(r.join("usr/lib/nv/current/libx.so.1.2"), b"x").unwrap();
        symlink("libx.so.1.2", r.join("usr/lib/nv/current/libx.so.1")).unwrap();
        symlink("/usr/lib/nv/current/libx.so.1", r.join("etc/alternatives/libx")).unwrap();
        symlink("/etc/alternatives/libx", r.join("usr/lib/libx.so.1")).unwrap();
        // `..` past the root is clamped, as in a chroot.
        symlink("../../../../../usr/lib/libx.so.1", r.join("etc/escape")).unwrap();
        assert_eq!(
            resolve_in_root(r, Path::new("/usr/lib/libx.so.1")).unwrap(),
            PathBuf::from("/usr/lib/nv/current/libx.so.1.2")
        );
        assert_eq!(
            resolve_in_root(r, Path::new("/etc/escape")).unwrap(),
            PathBuf::from("/usr/lib/nv/current/libx.so.1.2")
        );
        assert_eq!(resolve_host(r, Path::new("usr/lib/libx.so.1")).unwrap(), r.join("usr/lib/nv/current/libx.so.1.2"));
        symlink("/missing", r.join("dangling")).unwrap();
        assert_eq!(resolve_in_root(r, Path::new("/dangling")).unwrap_err().kind(), io::ErrorKind::NotFound);
        symlink("/loop", r.join("loop")).unwrap();
        assert!(resolve_in_root(r, Path::new("/loop")).is_err());
        assert_eq!(in_root(r, &r.join("dev/nvidia0")), Some(PathBuf::from("/dev/nvidia0")));
        assert_eq!(host_path(Path::new("/"), Path::new("/dev/x")), PathBuf::from("/dev/x"));
    }
}

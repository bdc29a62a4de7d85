//! A job's changes to a cache (its overlay's upper dir, after the job) become the cache's
//! next snapshot: a hard-link copy of the current snapshot (one link per file: no data
//! copied), the upper's entries moved into it by rename (whiteouts delete, opaque dirs
//! replace), then `current` swapped by rename. Readers never see a partial snapshot; a
//! commit killed at any point leaves `snapshots/.tmp-N`, which gc removes, and the old
//! snapshot current. Sharing files by hard link is safe because snapshots are never
//! written: jobs see them only as an overlay's read-only lower (a write copies up).
//!
//! Ids: snapshots keep the ids the job saw (container ids). A root-mode job ran as its
//! own block of host ids and its upper holds those, so they are mapped back here; jobs
//! then mount the snapshot idmapped with their own block, as they do the rootfs.
//! Rootless, every job has the same nested map: the upper's ids are already the store's.

use super::store::{self, Info, BUILDING};
use crate::identity::JobIds;
use anyhow::{bail, Context, Result};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// What a commit did, for the job's log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Committed {
    /// The job changed nothing in the cache.
    Unchanged,
    Snapshot {
        n: u64,
        size_bytes: u64,
        entries: u64,
    },
}

/// Commits `upper` (a job's cache upper dir, its overlay gone) into the cache at `store`.
/// Serialized with other commits; `ids`: the job's user namespace when its layers were
/// idmapped (root mode). On any error the current snapshot stays and the new tree goes.
pub fn commit(store: &Path, upper: &Path, ids: Option<&JobIds>, job: &str, max_size: Option<u64>) -> Result<Committed> {
    if fs::read_dir(upper).map(|mut d| d.next().is_none()).unwrap_or(true) {
        return Ok(Committed::Unchanged);
    }
    store::ensure(store)?;
    let _serial = lock_exclusive(&store.join("commit.lock"))?;
    let cur = store::current(store)?;
    let n = next_number(store, cur)?;
    let tmp = store.join("snapshots").join(format!("{BUILDING}{n}"));
    let built = build(store, cur, &tmp, upper, ids, max_size);
    let (size_bytes, entries) = match built {
        Ok(b) => b,
        Err(e) => {
            let _ = crate::sys::fs_at::remove_tree(&tmp);
            return Err(e);
        }
    };
    let dest = store.join("snapshots").join(n.to_string());
    fs::rename(&tmp, &dest).with_context(|| format!("cannot move {} into place", tmp.display()))?;
    {
        let _swap = lock_exclusive(&store.join("current.lock"))?;
        store::point_current(store, n)?;
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|t| t.as_secs()).unwrap_or(0);
    let info = Info { last_committer: Some(job.into()), committed_unix: Some(now), size_bytes };
    if let Err(e) = store::write_info(store, &info) {
        tracing::warn!("cache {}: snapshot {n} committed, but its info was not written: {e:#}", store.display());
    }
    drop(_serial);
    if let Err(e) = store::gc(store) {
        tracing::warn!("cache {}: gc of old snapshots failed ({e:#}); `azp-sandbox cache gc` retries", store.display());
    }
    Ok(Committed::Snapshot { n, size_bytes, entries })
}

fn build(
    store: &Path,
    cur: u64,
    tmp: &Path,
    upper: &Path,
    ids: Option<&JobIds>,
    max_size: Option<u64>,
) -> Result<(u64, u64)> {
    let from = store.join("snapshots").join(cur.to_string());
    // A leftover of a killed commit under this name (gc had not run yet).
    let _ = crate::sys::fs_at::remove_tree(tmp);
    link_tree(&from, tmp).with_context(|| format!("cannot link snapshot {} into {}", from.display(), tmp.display()))?;
    let mut entries = 0;
    let mut copies = Copies { max: max_size, ..Default::default() };
    apply(upper, tmp, ids, &mut entries, &mut copies)?;
    let size = super::size::tree_size(tmp)?;
    if let Some(max) = max_size.filter(|m| size > *m) {
        bail!("{}", over_max_size(size, max));
    }
    // The upper was written without syncs (a volatile overlay): make the snapshot durable
    // before any job can be given it.
    let dir = fs::File::open(tmp)?;
    nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir))
        .with_context(|| format!("cannot sync {}", tmp.display()))?;
    Ok((size, entries))
}

fn over_max_size(size: u64, max: u64) -> String {
    format!(
        "the snapshot would be {} > max_size {}: raise max_size or empty the cache (`azp-sandbox cache rm`)",
        crate::config::human_size(size),
        crate::config::human_size(max)
    )
}

fn lock_exclusive(path: &Path) -> Result<nix::fcntl::Flock<fs::File>> {
    let f = fs::File::options().create(true).truncate(false).write(true).open(path)?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("cannot lock {}: {e}", path.display()))
}

fn next_number(store: &Path, cur: u64) -> Result<u64> {
    let mut max = cur;
    for e in fs::read_dir(store.join("snapshots"))? {
        let name = e?.file_name().to_string_lossy().into_owned();
        let digits = name.trim_start_matches(|c: char| !c.is_ascii_digit());
        if let Ok(k) = digits.parse::<u64>() {
            max = max.max(k);
        }
    }
    Ok(max + 1)
}

/// `to` as a tree of hard links to the files of `from` (dirs made with the same mode and
/// owner; symlinks and device nodes are linked too).
fn link_tree(from: &Path, to: &Path) -> Result<()> {
    let m = fs::symlink_metadata(from)?;
    fs::create_dir(to).with_context(|| format!("cannot create {}: disk full?", to.display()))?;
    copy_owner_mode(&m, to)?;
    for e in fs::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type()?.is_dir() {
            link_tree(&src, &dst)?;
        } else {
            fs::hard_link(&src, &dst).with_context(|| format!("cannot link {}: disk full?", dst.display()))?;
        }
    }
    Ok(())
}

fn copy_owner_mode(m: &fs::Metadata, to: &Path) -> Result<()> {
    std::os::unix::fs::lchown(to, Some(m.uid()), Some(m.gid()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(m.mode() & 0o7777))?;
    Ok(())
}

/// overlayfs's own metadata: `trusted.` as root, `user.` in rootless mode (the cache's
/// overlay is mounted `userxattr` there, see `sandbox::cachemount`). Only that one: as
/// root, a job sets `user.overlay.*` on its files like any other xattr (overlayfs guards
/// only the namespace it uses), and reading it as overlay's let a job refuse every
/// commit with a false "redirect_dir/metacopy is on", or empty a dir of the snapshot
/// with `opaque` (found by a red-team pass).
fn overlay_xattr(path: &Path, key: &str) -> Option<Vec<u8>> {
    let ns = if crate::rootless::mode().rootless { "user.overlay." } else { "trusted.overlay." };
    xattr::get(path, format!("{ns}{key}")).ok().flatten()
}

/// Applies the upper dir `upper` onto `dst` (a fresh tree of links), moving its entries.
fn apply(upper: &Path, dst: &Path, ids: Option<&JobIds>, entries: &mut u64, copies: &mut Copies) -> Result<()> {
    for e in fs::read_dir(upper)? {
        let e = e?;
        let (src, to) = (e.path(), dst.join(e.file_name()));
        let m = fs::symlink_metadata(&src)?;
        *entries += 1;
        let kind = m.file_type();
        use std::os::unix::fs::FileTypeExt;
        if kind.is_char_device() && m.rdev() == 0 {
            remove_any(&to)?;
            continue;
        }
        if overlay_xattr(&src, "redirect").is_some() || overlay_xattr(&src, "metacopy").is_some() {
            bail!(
                "{} was renamed or copied up metadata-only (overlayfs redirect_dir/metacopy is on): not committed; \
                 turn those overlay module options off",
                src.display()
            );
        }
        if kind.is_dir() {
            let opaque = overlay_xattr(&src, "opaque").is_some_and(|v| v == b"y");
            let keep = !opaque && fs::symlink_metadata(&to).is_ok_and(|t| t.is_dir());
            if !keep {
                remove_any(&to)?;
                fs::create_dir(&to).with_context(|| format!("cannot create {}: disk full?", to.display()))?;
            }
            set_owner_mode(&m, &to, ids)?;
            apply(&src, &to, ids, entries, copies)?;
            continue;
        }
        remove_any(&to)?;
        if !(kind.is_file() || kind.is_symlink()) {
            // What the path held is gone in the job's view; a socket or fifo (or a device
            // node) is not kept.
            tracing::debug!("cache commit: {} (not a file, dir or symlink) is not kept", src.display());
            continue;
        }
        match fs::rename(&src, &to) {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => copy_entry(&src, &to, &m, copies)?,
            r => r.with_context(|| format!("cannot move {} into the snapshot: disk full?", src.display()))?,
        }
        for key in ["origin", "impure", "nlink", "upper", "uuid"] {
            for ns in ["trusted.overlay.", "user.overlay."] {
                let _ = xattr::remove(&to, format!("{ns}{key}"));
            }
        }
        if ids.is_some() || !kind.is_symlink() {
            set_owner_mode(&m, &to, ids)?;
        }
    }
    Ok(())
}

/// What a commit's copies did so far (see [`copy_entry`]).
#[derive(Default)]
struct Copies {
    /// A file of several links (device, inode) -> its first copy.
    linked: std::collections::HashMap<(u64, u64), std::path::PathBuf>,
    /// Blocks written by the copies, in bytes.
    bytes: u64,
    max: Option<u64>,
}

/// Across filesystems (a btrfs subvolume's or an XFS project quota's boundary refuses
/// rename too): a copy of a file or symlink (the only kinds [`apply`] keeps). A job's
/// file of many links stays one file of many links, and a sparse file stays sparse; the
/// copies stop at `max_size` before they write past it. Copied plainly, a job's 3 GiB
/// sparse file and 30 links to one file were written out whole, on the home's disk, before
/// the size was checked (found by a red-team pass).
fn copy_entry(src: &Path, to: &Path, m: &fs::Metadata, copies: &mut Copies) -> Result<()> {
    if !m.is_file() {
        std::os::unix::fs::symlink(fs::read_link(src)?, to)?;
        return Ok(());
    }
    let key = (m.dev(), m.ino());
    if let Some(first) = copies.linked.get(&key).filter(|_| m.nlink() > 1) {
        return fs::hard_link(first, to).with_context(|| format!("cannot link {} into the snapshot", to.display()));
    }
    let written = copies.bytes + m.blocks() * 512;
    if let Some(max) = copies.max.filter(|max| written > *max) {
        bail!("{}", over_max_size(written, max));
    }
    copy_sparse(src, to).with_context(|| format!("cannot copy {} into the snapshot: disk full?", src.display()))?;
    copies.bytes = written;
    if m.nlink() > 1 {
        copies.linked.insert(key, to.to_path_buf());
    }
    Ok(())
}

/// Bytes `start..end` of `from` to the same offsets of `out`: copy_file_range (a reflink
/// where the filesystem can), or reads and writes where it refuses (across filesystems
/// it gives EXDEV since Linux 5.19).
fn copy_range(from: &fs::File, out: &fs::File, start: u64, end: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let (mut off_in, mut off_out) = (start as i64, start as i64);
    while (off_in as u64) < end {
        let left = (end - off_in as u64) as usize;
        match nix::fcntl::copy_file_range(from, Some(&mut off_in), out, Some(&mut off_out), left) {
            Ok(0) => return Ok(()), // the file shrank meanwhile
            Ok(_) => {}
            Err(nix::errno::Errno::EXDEV | nix::errno::Errno::ENOSYS | nix::errno::Errno::EOPNOTSUPP) => break,
            Err(e) => return Err(e.into()),
        }
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut at = off_in as u64;
    while at < end {
        let want = buf.len().min((end - at) as usize);
        let n = from.read_at(&mut buf[..want], at)?;
        if n == 0 {
            return Ok(());
        }
        out.write_all_at(&buf[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// Copies the file `src` to the new file `to`, its data extents only: its holes stay
/// holes (SEEK_DATA/SEEK_HOLE, then copy_file_range, which reflinks where it can).
fn copy_sparse(src: &Path, to: &Path) -> std::io::Result<()> {
    use nix::unistd::{lseek, Whence};
    use std::os::fd::AsRawFd;
    let from = fs::File::open(src)?;
    let out = fs::File::options().write(true).create_new(true).open(to)?;
    let len = from.metadata()?.len() as i64;
    out.set_len(len as u64)?;
    let mut at = 0i64;
    while at < len {
        let data = match lseek(from.as_raw_fd(), at, Whence::SeekData) {
            Ok(d) => d,
            Err(nix::errno::Errno::ENXIO) => break, // only a hole is left
            Err(e) => return Err(e.into()),
        };
        let end = lseek(from.as_raw_fd(), data, Whence::SeekHole)?;
        copy_range(&from, &out, data as u64, end as u64)?;
        at = end;
    }
    Ok(())
}

/// The owner the job saw (mapped back from its host ids), and the mode (not for symlinks).
fn set_owner_mode(m: &fs::Metadata, to: &Path, ids: Option<&JobIds>) -> Result<()> {
    let (uid, gid) = match ids {
        Some(ids) => (inside(&ids.uid_map, m.uid()), inside(&ids.gid_map, m.gid())),
        None => (m.uid(), m.gid()),
    };
    std::os::unix::fs::lchown(to, Some(uid), Some(gid))
        .with_context(|| format!("cannot give {} to {uid}:{gid}", to.display()))?;
    if !m.file_type().is_symlink() {
        // chown clears setuid bits: a cache keeps none.
        fs::set_permissions(to, fs::Permissions::from_mode(m.mode() & 0o1777))?;
    }
    Ok(())
}

/// The container id of host id `host` in `map` (65534, nobody, when it is not mapped).
fn inside(map: &[crate::identity::IdMap], host: u32) -> u32 {
    map.iter()
        .find(|m| host >= m.outside && host - m.outside < m.count)
        .map(|m| m.inside + (host - m.outside))
        .unwrap_or(65534)
}

fn remove_any(p: &Path) -> Result<()> {
    match fs::symlink_metadata(p) {
        Err(_) => Ok(()),
        Ok(m) if m.is_dir() => {
            crate::sys::fs_at::remove_tree(p).with_context(|| format!("cannot remove {}", p.display()))
        }
        Ok(_) => fs::remove_file(p).with_context(|| format!("cannot remove {}", p.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(p: &Path) -> String {
        fs::read_to_string(p).unwrap_or_else(|_| "<none>".into())
    }

    #[test]
    fn a_commit_applies_the_upper_and_keeps_the_old_snapshot_whole() {
        let t = tempfile::tempdir().unwrap();
        let store = t.path().join("c");
        store::ensure(&store).unwrap();
        let s1 = store.join("snapshots/1");
        fs::create_dir_all(s1.join("d/sub")).unwrap();
        fs::write(s1.join("keep"), "k").unwrap();
        fs::write(s1.join("gone"), "g").unwrap();
        fs::write(s1.join("d/sub/old"), "o").unwrap();
        fs::write(s1.join("changed"), "v1").unwrap();
        let held = store::lease_current(&store).unwrap();
        // The job's upper: a new file, a changed file, a whiteout (needs mknod: root).
        let upper = t.path().join("upper");
        fs::create_dir_all(upper.join("d")).unwrap();
        fs::write(upper.join("changed"), "v2").unwrap();
        fs::write(upper.join("d/new"), "n").unwrap();
        let whiteout = nix::sys::stat::mknod(
            &upper.join("gone"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::empty(),
            0,
        );
        // A fifo over a file of the snapshot: the file is gone, the fifo not kept.
        nix::unistd::mkfifo(&upper.join("keep-fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        fs::write(s1.join("keep-fifo"), "f").unwrap();
        let r = commit(&store, &upper, None, "job-1", None).unwrap();
        assert!(matches!(r, Committed::Snapshot { n: 2, .. }), "{r:?}");
        let s2 = store.join("snapshots/2");
        assert!(fs::symlink_metadata(s2.join("keep-fifo")).is_err(), "a fifo is not committed");
        assert_eq!(store::current(&store).unwrap(), 2);
        assert_eq!((read(&s2.join("keep")), read(&s2.join("changed"))), ("k".into(), "v2".into()));
        assert_eq!((read(&s2.join("d/new")), read(&s2.join("d/sub/old"))), ("n".into(), "o".into()));
        if whiteout.is_ok() {
            assert!(!s2.join("gone").exists(), "a whiteout deletes");
        } else {
            crate::test_skip::skip_part("mknod of a whiteout needs root");
        }
        // The job that held snapshot 1 still sees it as it was.
        assert_eq!((read(&s1.join("changed")), read(&s1.join("gone"))), ("v1".into(), "g".into()));
        assert_eq!(fs::metadata(s1.join("keep")).unwrap().ino(), fs::metadata(s2.join("keep")).unwrap().ino());
        assert_eq!(store::read_info(&store).last_committer.as_deref(), Some("job-1"));
        drop(held);
        store::gc(&store).unwrap();
        assert!(!s1.exists(), "unheld, not current: collected");
        // Nothing changed: no snapshot.
        fs::create_dir(t.path().join("empty")).unwrap();
        assert_eq!(commit(&store, &t.path().join("empty"), None, "j", None).unwrap(), Committed::Unchanged);
    }

    /// As root the cache's overlay keeps its metadata in `trusted.overlay.*`: the same
    /// names under `user.` are a job's own xattrs, which must neither refuse the commit
    /// nor empty a dir of the snapshot; `trusted.overlay.redirect` still refuses it.
    #[test]
    #[cfg_attr(not(test_as_root), ignore = "needs root: root mode's trusted.overlay xattrs")]
    fn a_jobs_user_overlay_xattrs_are_its_own_as_root() {
        let t = tempfile::tempdir().unwrap();
        let store = t.path().join("c");
        store::ensure(&store).unwrap();
        fs::create_dir_all(store.join("snapshots/1/d")).unwrap();
        fs::write(store.join("snapshots/1/d/old"), "o").unwrap();
        let upper = t.path().join("upper");
        fs::create_dir_all(upper.join("d")).unwrap();
        fs::write(upper.join("f"), "x").unwrap();
        xattr::set(upper.join("f"), "user.overlay.redirect", b"/x").unwrap();
        xattr::set(upper.join("f"), "user.overlay.metacopy", b"").unwrap();
        xattr::set(upper.join("d"), "user.overlay.opaque", b"y").unwrap();
        let r = commit(&store, &upper, None, "job-1", None).unwrap();
        assert!(matches!(r, Committed::Snapshot { n: 2, .. }), "{r:?}");
        assert_eq!(read(&store.join("snapshots/2/d/old")), "o", "not opaque: the dir's old files stay");
        assert_eq!(read(&store.join("snapshots/2/f")), "x");
        let upper2 = t.path().join("upper2");
        fs::create_dir_all(&upper2).unwrap();
        fs::write(upper2.join("g"), "y").unwrap();
        xattr::set(upper2.join("g"), "trusted.overlay.redirect", b"/x").unwrap();
        let e = commit(&store, &upper2, None, "job-2", None).unwrap_err().to_string();
        assert!(e.contains("redirect_dir/metacopy"), "{e}");
    }

    /// Across filesystems (the store on a tmpfs, the upper on the test's disk: rename gives
    /// EXDEV) a job's sparse file stays sparse, its links stay one file, and a file past
    /// max_size is refused before it is copied.
    #[test]
    #[cfg_attr(not(test_as_root), ignore = "needs root: mounts a tmpfs")]
    fn copies_across_filesystems_keep_holes_and_links_and_stop_at_max_size() {
        on_tmpfs("size=256m", |tmp, fs_dir| {
            let store = fs_dir.join("c");
            store::ensure(&store).unwrap();
            let upper = tmp.join("upper");
            fs::create_dir(&upper).unwrap();
            let sparse = fs::File::create(upper.join("sparse")).unwrap();
            sparse.set_len(64 << 20).unwrap();
            std::os::unix::fs::FileExt::write_at(&sparse, &[7u8; 4096], (64 << 20) - 4096).unwrap();
            fs::write(upper.join("a"), vec![1u8; 1 << 20]).unwrap();
            for l in ["b", "c"] {
                fs::hard_link(upper.join("a"), upper.join(l)).unwrap();
            }
            assert!(matches!(commit(&store, &upper, None, "j", None).unwrap(), Committed::Snapshot { n: 2, .. }));
            let s2 = store.join("snapshots/2");
            let m = fs::metadata(s2.join("sparse")).unwrap();
            assert_eq!(m.len(), 64 << 20);
            assert!(m.blocks() * 512 < 1 << 20, "holes kept: {} bytes allocated", m.blocks() * 512);
            let tail = fs::read(s2.join("sparse")).unwrap();
            assert_eq!(&tail[(64 << 20) - 4096..], &[7u8; 4096][..]);
            let inos: Vec<u64> = ["a", "b", "c"].iter().map(|l| fs::metadata(s2.join(l)).unwrap().ino()).collect();
            assert!(inos.iter().all(|i| *i == inos[0]), "links kept: {inos:?}");
            // A dense 8 MiB file against max_size 4 MiB: refused before it is written.
            let upper2 = tmp.join("upper2");
            fs::create_dir(&upper2).unwrap();
            fs::write(upper2.join("big"), vec![1u8; 8 << 20]).unwrap();
            let e = commit(&store, &upper2, None, "j2", Some(4 << 20)).unwrap_err().to_string();
            assert!(e.contains("> max_size 4.0M"), "{e}");
            assert_eq!(store::current(&store).unwrap(), 2);
        });
    }

    #[test]
    fn over_max_size_the_commit_is_refused_and_the_old_snapshot_stays() {
        let t = tempfile::tempdir().unwrap();
        let store = t.path().join("c");
        let upper = t.path().join("upper");
        fs::create_dir_all(&upper).unwrap();
        fs::write(upper.join("big"), vec![7u8; 256 << 10]).unwrap();
        let e = commit(&store, &upper, None, "j", Some(64 << 10)).unwrap_err().to_string();
        assert!(e.starts_with("the snapshot would be ") && e.contains("> max_size 64.0K"), "{e}");
        assert_eq!(store::current(&store).unwrap(), 1);
        let left: Vec<_> = fs::read_dir(store.join("snapshots")).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left, ["1"], "the new tree is gone");
    }

    #[test]
    fn a_full_disk_during_a_commit_leaves_the_old_snapshot() {
        if !nix::unistd::geteuid().is_root() {
            return crate::test_skip::skip("needs root: mounts a tmpfs with few inodes");
        }
        // Few inodes: the snapshot's 20 dirs fit once, not twice (a commit links files but
        // makes every dir anew).
        on_tmpfs("nr_inodes=40", |_, fs_dir| {
            let store = fs_dir.join("c");
            store::ensure(&store).unwrap();
            for k in 0..20 {
                fs::create_dir(store.join(format!("snapshots/1/d{k}"))).unwrap();
            }
            let upper = fs_dir.join("upper");
            fs::create_dir(&upper).unwrap();
            fs::write(upper.join("new"), "n").unwrap();
            let e = format!("{:#}", commit(&store, &upper, None, "j", None).unwrap_err());
            assert!(e.contains("disk full?") && e.contains("No space left on device"), "{e}");
            assert_eq!(store::current(&store).unwrap(), 1);
            let left: Vec<_> =
                fs::read_dir(store.join("snapshots")).unwrap().flatten().map(|e| e.file_name()).collect();
            assert_eq!(left, ["1"], "the half-built tree is gone");
            assert_eq!(fs::read_dir(store.join("snapshots/1")).unwrap().count(), 20, "the old snapshot whole");
        });
    }

    /// Runs `test(tmp, fs)` with a tmpfs mounted with `options` at `fs`, in the temporary
    /// dir `tmp` (on the test's own disk); unmounted however the test ends (root only).
    fn on_tmpfs(options: &str, test: impl FnOnce(&Path, &Path) + std::panic::UnwindSafe) {
        let t = tempfile::tempdir().unwrap();
        let fs_dir = t.path().join("fs");
        fs::create_dir(&fs_dir).unwrap();
        nix::mount::mount(Some("azp-test"), &fs_dir, Some("tmpfs"), nix::mount::MsFlags::empty(), Some(options))
            .unwrap();
        let result = std::panic::catch_unwind(|| test(t.path(), &fs_dir));
        nix::mount::umount2(&fs_dir, nix::mount::MntFlags::MNT_DETACH).unwrap();
        result.unwrap();
    }

    #[test]
    fn host_ids_of_a_root_mode_job_are_mapped_back() {
        let ids = JobIds::block(3, (300_000, 300_000), (1000, 1000));
        assert_eq!(inside(&ids.uid_map, 301_000), 1000);
        assert_eq!(inside(&ids.uid_map, 300_000), 0);
        assert_eq!(inside(&ids.uid_map, 5), 65534, "not the job's: nobody");
    }
}

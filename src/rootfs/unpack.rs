//! Safe streaming extraction of a tar stream into a directory.
//!
//! Runs as root on untrusted archives, so:
//! * every path is resolved component by component from a directory fd of the tree with
//!   `O_NOFOLLOW | O_DIRECTORY`: a symlink in a parent position is never followed (the
//!   archive is refused), `..` that would leave the tree is refused, absolute paths are
//!   re-rooted;
//! * the final component is created relative to its parent fd (`openat(O_CREAT|O_EXCL|
//!   O_NOFOLLOW)`, `mkdirat`, `symlinkat`, `linkat`, `mknodat`), replacing an earlier entry
//!   of the same name by unlinking it (never following it);
//! * hard links may only point at entries inside the tree, resolved the same way;
//! * file data is streamed (no buffering), sparse maps become holes;
//! * directories are created 0700 and get their mode, owner, xattrs and mtime at the end,
//!   deepest first, so restrictive modes cannot block later entries.
//!
//! [`unpack`] can be called several times on the same directory (image layers); with
//! [`UnpackOptions::oci_whiteouts`] it applies OCI whiteouts instead of creating them.

use super::tarstream::{Entry, Kind, TarError, TarReader};
use crate::sys::fs_at::{self, errno};
use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::io::{self, BufRead, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Clone)]
pub struct UnpackOptions {
    /// Give entries the archive's numeric uid/gid (needs root). Default: when euid is 0.
    pub same_owner: bool,
    /// Create device nodes and fifos (needs root). Default: when euid is 0; otherwise they
    /// are skipped and counted in [`UnpackStats::skipped_devices`].
    pub create_devices: bool,
    /// Apply OCI layer whiteouts: `.wh.NAME` removes NAME from the tree, `.wh..wh..opq`
    /// empties its directory of everything this layer did not create; neither marker is
    /// written. Also lets an entry replace a non-empty directory (removed recursively).
    pub oci_whiteouts: bool,
    /// An entry whose parent path contains a symlink: `false` refuses the archive; `true`
    /// resolves the symlink inside the tree, as if the tree were the root (`openat2`
    /// `RESOLVE_IN_ROOT`), the way image layers are applied by container runtimes.
    pub follow_symlinks_in_root: bool,
    /// Checked between entries; when set the unpack stops with [`UnpackError::Interrupted`].
    pub cancel: Option<&'static AtomicBool>,
    /// Added to every uid and gid given to an entry (with `same_owner`): the rootless
    /// store is shifted by one (see [`crate::identity::store_shift`]). Default: that.
    pub id_shift: u32,
}

impl Default for UnpackOptions {
    fn default() -> Self {
        let root = fs_at::is_root();
        UnpackOptions {
            same_owner: root,
            create_devices: root,
            oci_whiteouts: false,
            follow_symlinks_in_root: false,
            cancel: None,
            id_shift: crate::identity::store_shift(),
        }
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UnpackStats {
    /// Entries written to the tree (files, directories, links, nodes).
    pub entries: u64,
    /// Bytes of file data written.
    pub bytes: u64,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub hardlinks: u64,
    pub devices: u64,
    /// Device nodes and fifos not created (not root, or the kernel refused).
    pub skipped_devices: u64,
    /// Entries of types that are not extracted (volume labels, unknown type flags).
    pub skipped_other: u64,
    pub whiteouts: u64,
    /// Extended attributes the filesystem refused.
    pub xattr_failures: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("corrupt archive: {what} at entry {index} ({path})")]
    Corrupt { what: String, index: u64, path: String },
    #[error("refusing archive: entry {index} ({path}) {why}")]
    Hostile { index: u64, path: String, why: String },
    #[error("no space left on device (wrote {written} bytes)")]
    NoSpace { written: u64 },
    #[error("cannot extract entry {index} ({path}): {err}")]
    Io { index: u64, path: String, err: io::Error },
    #[error("import interrupted")]
    Interrupted,
}

type Result<T> = std::result::Result<T, UnpackError>;

/// Extracts the tar stream `src` into the directory `dest` (which must exist).
pub fn unpack<R: BufRead>(src: R, dest: &Path, opts: &UnpackOptions) -> Result<UnpackStats> {
    let fd =
        fs_at::open_dir(dest).map_err(|err| UnpackError::Io { index: 0, path: dest.display().to_string(), err })?;
    unpack_at(src, std::os::fd::AsFd::as_fd(&fd), opts)
}

/// Like [`unpack`], into the directory open as `dest`.
pub fn unpack_at<R: BufRead>(src: R, dest: BorrowedFd<'_>, opts: &UnpackOptions) -> Result<UnpackStats> {
    let mut u = Unpacker {
        opts,
        root: dest.as_raw_fd(),
        stack: DirStack::default(),
        stack_dirty: false,
        dirs: Vec::new(),
        stats: UnpackStats::default(),
        umask: read_umask(),
        layer_paths: HashSet::new(),
        index: 0,
        path: String::new(),
        warned_xattr: false,
        warned_devices: false,
    };
    let mut tr = TarReader::new(src);
    loop {
        if u.cancelled() {
            return Err(UnpackError::Interrupted);
        }
        u.index += 1;
        let entry = match tr.next_entry() {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(e) => return Err(u.tar_error(e)),
        };
        u.path = String::from_utf8_lossy(&entry.path).into_owned();
        u.entry(&mut tr, entry)?;
    }
    u.index -= 1;
    if let Err(e) = tr.finish() {
        return Err(u.read_error(e, true));
    }
    u.finish_dirs()?;
    if u.stats.skipped_devices > 0 {
        tracing::warn!(
            "skipped {} device nodes/fifos: {}",
            u.stats.skipped_devices,
            if u.opts.create_devices { "the kernel refused to create them" } else { "creating them needs root" }
        );
    }
    if u.stats.xattr_failures > 1 {
        tracing::warn!("{} extended attributes could not be set", u.stats.xattr_failures);
    }
    Ok(u.stats)
}

struct Deferred {
    comps: Vec<Vec<u8>>,
    /// `None`: created implicitly as the parent of an entry; gets mode 0755.
    meta: Option<Meta>,
}

struct Meta {
    mode: u32,
    uid: u64,
    gid: u64,
    mtime: (i64, u32),
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Meta {
    fn of(e: &Entry) -> Meta {
        Meta { mode: e.mode, uid: e.uid, gid: e.gid, mtime: e.mtime, xattrs: e.xattrs.clone() }
    }
}

struct Unpacker<'o> {
    opts: &'o UnpackOptions,
    root: RawFd,
    stack: DirStack,
    /// Something was removed: drop the cached directory fds before the next lookup (lazily,
    /// so the current entry's parent fd stays valid). Resolving the parent of whatever is
    /// replaced already truncates the cache below it; this is a second line of defence.
    stack_dirty: bool,
    dirs: Vec<Deferred>,
    stats: UnpackStats,
    umask: u32,
    /// Paths written by this call (whiteout mode only, for opaque directories).
    layer_paths: HashSet<Vec<u8>>,
    index: u64,
    path: String,
    warned_xattr: bool,
    warned_devices: bool,
}

/// Splits an archive path into components: leading `/` and `.` dropped, `..` applied
/// lexically and refused when it would leave the tree.
pub(crate) fn split_path(raw: &[u8]) -> std::result::Result<Vec<&[u8]>, &'static str> {
    let mut out: Vec<&[u8]> = Vec::new();
    for c in raw.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                if out.pop().is_none() {
                    return Err("has a '..' component that leads outside the tree");
                }
            }
            c if c.contains(&0) => return Err("contains a NUL byte"),
            c => out.push(c),
        }
    }
    Ok(out)
}

fn join(comps: &[&[u8]]) -> Vec<u8> {
    comps.join(&b'/')
}

enum ResolveError {
    /// Component `depth` exists but is not a directory.
    NotDir {
        depth: usize,
        symlink: bool,
    },
    Missing,
    Io(io::Error),
}

/// Open fds of the directories along the last resolved path (entries of a tar stream
/// mostly share their parent with the previous entry, so most lookups cost nothing).
#[derive(Default)]
struct DirStack {
    names: Vec<Vec<u8>>,
    fds: Vec<OwnedFd>,
}

impl DirStack {
    fn clear(&mut self) {
        self.names.clear();
        self.fds.clear();
    }

    fn top(&self, root: RawFd) -> RawFd {
        self.fds.last().map_or(root, |f| f.as_raw_fd())
    }

    /// The directory at `comps` below `root`, without following symlinks (or following
    /// them inside the tree when `follow_in_root`). With `create`, missing directories are
    /// made (mode 0700) and reported in `created`.
    fn resolve(
        &mut self,
        root: RawFd,
        comps: &[&[u8]],
        create: bool,
        follow_in_root: bool,
        created: &mut Vec<Vec<Vec<u8>>>,
    ) -> std::result::Result<RawFd, ResolveError> {
        let common = self.names.iter().zip(comps).take_while(|(a, b)| a.as_slice() == **b).count();
        self.names.truncate(common);
        self.fds.truncate(common);
        for (i, comp) in comps.iter().enumerate().skip(common) {
            let cur = self.top(root);
            let c = fs_at::cstring(comp).map_err(ResolveError::Io)?;
            let fd = match fs_at::open_dir_at(cur, &c) {
                Ok(fd) => fd,
                Err(e) if errno(&e) == libc::ENOENT && create => {
                    match fs_at::mkdirat(cur, &c, 0o700) {
                        Ok(()) => created.push(comps[..=i].iter().map(|c| c.to_vec()).collect()),
                        Err(e) if errno(&e) == libc::EEXIST => {}
                        Err(e) => return Err(ResolveError::Io(e)),
                    }
                    match fs_at::open_dir_at(cur, &c) {
                        Ok(fd) => fd,
                        Err(e) if errno(&e) == libc::ELOOP || errno(&e) == libc::ENOTDIR => {
                            return Err(ResolveError::NotDir { depth: i, symlink: false })
                        }
                        Err(e) => return Err(ResolveError::Io(e)),
                    }
                }
                Err(e) if errno(&e) == libc::ENOENT => return Err(ResolveError::Missing),
                Err(e) if errno(&e) == libc::ELOOP || errno(&e) == libc::ENOTDIR => {
                    let symlink = fs_at::fstatat_nofollow(cur, &c).map(|st| fs_at::is_symlink(&st)).unwrap_or(false);
                    if !(symlink && follow_in_root) {
                        return Err(ResolveError::NotDir { depth: i, symlink });
                    }
                    let path = fs_at::cstring(&join(&comps[..=i])).map_err(ResolveError::Io)?;
                    match fs_at::openat2(
                        root,
                        &path,
                        libc::O_RDONLY | libc::O_DIRECTORY,
                        fs_at::RESOLVE_IN_ROOT | fs_at::RESOLVE_NO_MAGICLINKS,
                    ) {
                        Ok(fd) => fd,
                        Err(e) if errno(&e) == libc::ENOENT => return Err(ResolveError::Missing),
                        Err(e) if errno(&e) == libc::ENOTDIR || errno(&e) == libc::ELOOP => {
                            return Err(ResolveError::NotDir { depth: i, symlink: true })
                        }
                        Err(e) => return Err(ResolveError::Io(e)),
                    }
                }
                Err(e) => return Err(ResolveError::Io(e)),
            };
            self.names.push(comp.to_vec());
            self.fds.push(fd);
        }
        Ok(self.top(root))
    }
}

/// Empties `dir` of everything the current layer did not write (`keep`), descending
/// into the directories it did write: lower-layer content below them goes too.
fn opaque_clear(dir: RawFd, prefix: Vec<u8>, keep: &HashSet<Vec<u8>>) -> io::Result<()> {
    for n in fs_at::read_dir_names(dir)? {
        let mut full = prefix.clone();
        if !full.is_empty() {
            full.push(b'/');
        }
        full.extend_from_slice(n.to_bytes());
        if !keep.contains(&full) {
            fs_at::remove_all_at(dir, &n)?;
        } else if fs_at::fstatat_nofollow(dir, &n).is_ok_and(|st| fs_at::is_dir(&st)) {
            let sub = fs_at::open_dir_at(dir, &n)?;
            opaque_clear(sub.as_raw_fd(), full, keep)?;
        }
    }
    Ok(())
}

fn read_umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Umask:")).and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o777)
}

fn timespecs(mtime: (i64, u32)) -> [libc::timespec; 2] {
    [
        libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
        libc::timespec { tv_sec: mtime.0 as libc::time_t, tv_nsec: mtime.1 as libc::c_long },
    ]
}

fn id32(v: u64) -> io::Result<u32> {
    u32::try_from(v).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("uid/gid {v} out of range")))
}

impl Unpacker<'_> {
    /// The owner an entry of the archive's `uid`/`gid` gets in the store.
    fn owner(&self, uid: u64, gid: u64) -> io::Result<(u32, u32)> {
        let shift = self.opts.id_shift as u64;
        Ok((id32(uid + shift)?, id32(gid + shift)?))
    }

    fn cancelled(&self) -> bool {
        self.opts.cancel.is_some_and(|c| c.load(Ordering::Relaxed))
    }

    fn hostile(&self, why: impl Into<String>) -> UnpackError {
        UnpackError::Hostile { index: self.index, path: self.path.clone(), why: why.into() }
    }

    fn corrupt(&self, what: impl Into<String>) -> UnpackError {
        UnpackError::Corrupt { what: what.into(), index: self.index, path: self.path.clone() }
    }

    /// A failure reading the decompressed stream (truncation, decoder error, cancel).
    fn read_error(&self, e: io::Error, after_last: bool) -> UnpackError {
        if self.cancelled() || e.to_string() == super::archive::CANCELLED {
            return UnpackError::Interrupted;
        }
        let what = if e.kind() == io::ErrorKind::UnexpectedEof {
            "unexpected end of archive (truncated?)".to_string()
        } else {
            e.to_string()
        };
        if after_last {
            UnpackError::Corrupt { what, index: self.index, path: format!("after {}", self.path_or_start()) }
        } else {
            self.corrupt(what)
        }
    }

    fn path_or_start(&self) -> String {
        if self.path.is_empty() {
            "the start".into()
        } else {
            self.path.clone()
        }
    }

    fn tar_error(&self, e: TarError) -> UnpackError {
        if let Some(io) = e.io {
            if self.cancelled() || io.to_string() == super::archive::CANCELLED {
                return UnpackError::Interrupted;
            }
        }
        let path = match e.path {
            Some(p) => String::from_utf8_lossy(&p).into_owned(),
            None => format!("after {}", self.path_or_start()),
        };
        UnpackError::Corrupt { what: e.what, index: self.index, path }
    }

    /// A failure of a filesystem operation on the current entry.
    fn write_error(&self, err: io::Error) -> UnpackError {
        match errno(&err) {
            libc::ENOSPC | libc::EDQUOT => UnpackError::NoSpace { written: self.stats.bytes },
            _ => UnpackError::Io { index: self.index, path: self.path.clone(), err },
        }
    }

    fn resolve_error(&self, e: ResolveError, comps: &[&[u8]]) -> UnpackError {
        match e {
            ResolveError::NotDir { depth, symlink: true } => self.hostile(format!(
                "goes through '{}', which is a symlink; refusing to write through it",
                String::from_utf8_lossy(&join(&comps[..=depth]))
            )),
            ResolveError::NotDir { depth, symlink: false } => {
                self.corrupt(format!("'{}' is not a directory", String::from_utf8_lossy(&join(&comps[..=depth]))))
            }
            ResolveError::Missing => self.write_error(io::Error::from_raw_os_error(libc::ENOENT)),
            ResolveError::Io(e) => self.write_error(e),
        }
    }

    /// The parent directory of an entry, created if missing.
    fn parent(&mut self, comps: &[&[u8]]) -> Result<RawFd> {
        if self.stack_dirty {
            self.stack.clear();
            self.stack_dirty = false;
        }
        let mut created = Vec::new();
        let r = self.stack.resolve(self.root, comps, true, self.opts.follow_symlinks_in_root, &mut created);
        for c in created {
            self.dirs.push(Deferred { comps: c, meta: None });
        }
        r.map_err(|e| self.resolve_error(e, comps))
    }

    fn entry<R: BufRead>(&mut self, tr: &mut TarReader<R>, e: Entry) -> Result<()> {
        let path = e.path.clone();
        let comps = split_path(&path).map_err(|why| self.hostile(why))?;
        let Some((name, parent)) = comps.split_last() else {
            return match e.kind {
                Kind::Dir => {
                    self.dirs.push(Deferred { comps: Vec::new(), meta: Some(Meta::of(&e)) });
                    self.stats.entries += 1;
                    Ok(())
                }
                _ => Err(self.hostile("names the root of the tree")),
            };
        };
        if self.opts.oci_whiteouts {
            if let Some(target) = name.strip_prefix(b".wh.") {
                return self.whiteout(parent, target);
            }
        }
        match e.kind {
            Kind::Other(t) => {
                tracing::debug!("skipping entry {} ({}) of type {:?}", self.index, self.path, t as char);
                self.stats.skipped_other += 1;
                return Ok(());
            }
            Kind::Char | Kind::Block | Kind::Fifo if !self.opts.create_devices => {
                self.stats.skipped_devices += 1;
                return Ok(());
            }
            _ => {}
        }
        let cname = fs_at::cstring(name).map_err(|_| self.hostile("contains a NUL byte"))?;
        let pfd = self.parent(parent)?;
        match e.kind {
            Kind::File => self.file(tr, pfd, &cname, &e)?,
            Kind::Dir => self.dir(pfd, &cname, &comps, &e)?,
            Kind::Symlink => self.symlink(pfd, &cname, &e)?,
            Kind::HardLink => self.hardlink(pfd, &cname, &comps, &e)?,
            Kind::Char | Kind::Block | Kind::Fifo => {
                if !self.node(pfd, &cname, &e)? {
                    return Ok(());
                }
            }
            Kind::Other(_) => unreachable!(),
        }
        self.stats.entries += 1;
        if self.opts.oci_whiteouts {
            // The entry and its parents (even those created implicitly) are this layer's:
            // an opaque marker later in the layer must not remove them.
            for k in (1..=comps.len()).rev() {
                if !self.layer_paths.insert(join(&comps[..k])) {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Makes room for a new entry whose creation failed with EEXIST: unlinks the old one
    /// (never following it). A directory is only removed if empty, unless in layer mode.
    fn make_room(&mut self, pfd: RawFd, name: &CStr) -> io::Result<()> {
        let st = fs_at::fstatat_nofollow(pfd, name)?;
        if fs_at::is_dir(&st) {
            if self.opts.oci_whiteouts {
                fs_at::remove_all_at(pfd, name)?;
            } else {
                fs_at::unlinkat(pfd, name, libc::AT_REMOVEDIR).map_err(|e| {
                    if errno(&e) == libc::ENOTEMPTY || errno(&e) == libc::EEXIST {
                        io::Error::other("an earlier entry made it a non-empty directory, which an entry of another type cannot replace")
                    } else {
                        e
                    }
                })?;
            }
        } else {
            fs_at::unlinkat(pfd, name, 0)?;
        }
        self.stack_dirty = true;
        Ok(())
    }

    /// Runs `op`; if the name exists, replaces it and runs `op` again.
    fn create<T>(&mut self, pfd: RawFd, name: &CStr, mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
        match op() {
            Err(e) if errno(&e) == libc::EEXIST => {
                self.make_room(pfd, name)?;
                op()
            }
            r => r,
        }
    }

    fn file<R: BufRead>(&mut self, tr: &mut TarReader<R>, pfd: RawFd, name: &CStr, e: &Entry) -> Result<()> {
        let perm = (e.mode & 0o777) as libc::mode_t;
        let fd = self
            .create(pfd, name, || {
                fs_at::openat(pfd, name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW, perm)
            })
            .map_err(|err| self.write_error(err))?;
        let mut f = std::fs::File::from(fd);
        match &e.sparse {
            None => self.copy(tr, e.size, |chunk, _| f.write_all(chunk))?,
            Some(sp) => {
                for &(off, len) in &sp.map {
                    self.copy(tr, len, |chunk, done| f.write_all_at(chunk, off + done))?;
                }
                f.set_len(sp.real_size).map_err(|err| self.write_error(err))?;
            }
        }
        self.apply_fd(f.as_raw_fd(), &Meta::of(e), false).map_err(|err| self.write_error(err))?;
        self.stats.files += 1;
        Ok(())
    }

    /// Streams `len` bytes of entry data to `write(chunk, offset_in_run)`.
    fn copy<R: BufRead>(
        &mut self,
        tr: &mut TarReader<R>,
        len: u64,
        mut write: impl FnMut(&[u8], u64) -> io::Result<()>,
    ) -> Result<()> {
        let mut done = 0u64;
        while done < len {
            let chunk = match tr.data() {
                Ok(c) => c,
                Err(err) => return Err(self.read_error(err, false)),
            };
            let n = (chunk.len() as u64).min(len - done) as usize;
            if n == 0 {
                return Err(self.corrupt("unexpected end of archive (truncated?)"));
            }
            if let Err(err) = write(&chunk[..n], done) {
                return Err(self.write_error(err));
            }
            tr.consume(n);
            done += n as u64;
            self.stats.bytes += n as u64;
        }
        Ok(())
    }

    /// Owner, mode (after chown, which clears set-id bits), xattrs (after chown, which
    /// clears file capabilities), mtime.
    fn apply_fd(&mut self, fd: RawFd, m: &Meta, is_dir: bool) -> io::Result<()> {
        if self.opts.same_owner {
            let (uid, gid) = self.owner(m.uid, m.gid)?;
            fs_at::fchown(fd, uid, gid)?;
        }
        let mode = m.mode & 0o7777;
        if is_dir || mode & 0o7000 != 0 || mode & self.umask != 0 {
            fs_at::fchmod(fd, mode as libc::mode_t)?;
        }
        for (k, v) in &m.xattrs {
            let r = fs_at::cstring(k).and_then(|k| fs_at::fsetxattr(fd, &k, v));
            if let Err(e) = r {
                self.xattr_failed(k, &e);
            }
        }
        fs_at::futimens(fd, &timespecs(m.mtime))?;
        Ok(())
    }

    fn xattr_failed(&mut self, key: &[u8], e: &io::Error) {
        self.stats.xattr_failures += 1;
        let key = String::from_utf8_lossy(key);
        if !self.warned_xattr {
            self.warned_xattr = true;
            tracing::warn!("cannot set extended attribute {key} on {}: {e} (continuing)", self.path);
        } else {
            tracing::debug!("cannot set extended attribute {key} on {}: {e}", self.path);
        }
    }

    fn dir(&mut self, pfd: RawFd, name: &CStr, comps: &[&[u8]], e: &Entry) -> Result<()> {
        match fs_at::mkdirat(pfd, name, 0o700) {
            Ok(()) => {}
            Err(err) if errno(&err) == libc::EEXIST => {
                let st = fs_at::fstatat_nofollow(pfd, name).map_err(|err| self.write_error(err))?;
                if !fs_at::is_dir(&st) {
                    self.make_room(pfd, name).map_err(|err| self.write_error(err))?;
                    fs_at::mkdirat(pfd, name, 0o700).map_err(|err| self.write_error(err))?;
                }
            }
            Err(err) => return Err(self.write_error(err)),
        }
        self.dirs.push(Deferred { comps: comps.iter().map(|c| c.to_vec()).collect(), meta: Some(Meta::of(e)) });
        self.stats.dirs += 1;
        Ok(())
    }

    fn symlink(&mut self, pfd: RawFd, name: &CStr, e: &Entry) -> Result<()> {
        let target = match e.link.as_deref() {
            Some(t) if !t.is_empty() => t,
            _ => return Err(self.corrupt("symlink without a target")),
        };
        let target = fs_at::cstring(target).map_err(|_| self.hostile("has a symlink target with a NUL byte"))?;
        self.create(pfd, name, || fs_at::symlinkat(&target, pfd, name)).map_err(|err| self.write_error(err))?;
        self.lmeta(pfd, name, e, false).map_err(|err| self.write_error(err))?;
        self.stats.symlinks += 1;
        Ok(())
    }

    /// Owner, (mode), mtime of a non-regular entry by name, never following it.
    fn lmeta(&mut self, pfd: RawFd, name: &CStr, e: &Entry, chmod: bool) -> io::Result<()> {
        if self.opts.same_owner {
            let (uid, gid) = self.owner(e.uid, e.gid)?;
            fs_at::fchownat_nofollow(pfd, name, uid, gid)?;
        }
        if chmod {
            // Only called for nodes just created under this name in our own tree.
            fs_at::fchmodat(pfd, name, (e.mode & 0o7777) as libc::mode_t)?;
        }
        fs_at::utimensat_nofollow(pfd, name, &timespecs(e.mtime))?;
        Ok(())
    }

    fn hardlink(&mut self, pfd: RawFd, name: &CStr, comps: &[&[u8]], e: &Entry) -> Result<()> {
        let raw = match e.link.as_deref() {
            Some(t) if !t.is_empty() => t,
            _ => return Err(self.corrupt("hard link without a target")),
        };
        let shown = String::from_utf8_lossy(raw).into_owned();
        let tcomps =
            split_path(raw).map_err(|why| self.hostile(format!("is a hard link to '{shown}', which {why}")))?;
        if tcomps == comps {
            return Ok(()); // a link to itself: nothing to do
        }
        let Some((tname, tparent)) = tcomps.split_last() else {
            return Err(self.hostile("is a hard link to the root of the tree"));
        };
        let tname = fs_at::cstring(tname).map_err(|_| self.hostile("has a link target with a NUL byte"))?;
        // Resolve the target's directory on its own stack: `pfd` must stay valid.
        let mut tstack = DirStack::default();
        let (_, parent) = comps.split_last().expect("non-empty");
        let tpfd = if tparent == parent {
            pfd
        } else {
            match tstack.resolve(self.root, tparent, false, self.opts.follow_symlinks_in_root, &mut Vec::new()) {
                Ok(fd) => fd,
                Err(ResolveError::Missing) | Err(ResolveError::NotDir { symlink: false, .. }) => {
                    return Err(self.hostile(format!(
                        "is a hard link to '{shown}', which is not in the archive (links must point inside the tree)"
                    )))
                }
                Err(ResolveError::NotDir { depth, symlink: true }) => {
                    return Err(self.hostile(format!(
                        "is a hard link through '{}', which is a symlink; refusing to follow it",
                        String::from_utf8_lossy(&join(&tparent[..=depth]))
                    )))
                }
                Err(ResolveError::Io(err)) => return Err(self.write_error(err)),
            }
        };
        let r = self.create(pfd, name, || fs_at::linkat(tpfd, &tname, pfd, name));
        match r {
            Ok(_) => {}
            Err(err) if errno(&err) == libc::ENOENT => {
                return Err(self.hostile(format!(
                    "is a hard link to '{shown}', which is not in the archive (links must point inside the tree)"
                )))
            }
            Err(err) if errno(&err) == libc::EPERM && self.is_dir_at(tpfd, &tname) => {
                return Err(self.hostile(format!("is a hard link to the directory '{shown}'")))
            }
            Err(err) => return Err(self.write_error(err)),
        }
        self.stats.hardlinks += 1;
        Ok(())
    }

    fn is_dir_at(&self, dfd: RawFd, name: &CStr) -> bool {
        fs_at::fstatat_nofollow(dfd, name).is_ok_and(|st| fs_at::is_dir(&st))
    }

    /// Device node or fifo; `false` when the kernel refused (counted as skipped).
    fn node(&mut self, pfd: RawFd, name: &CStr, e: &Entry) -> Result<bool> {
        let kind = match e.kind {
            Kind::Char => libc::S_IFCHR,
            Kind::Block => libc::S_IFBLK,
            _ => libc::S_IFIFO,
        };
        let dev = libc::makedev(e.dev.0, e.dev.1);
        let mode = kind | (e.mode & 0o777) as libc::mode_t;
        let r = self.create(pfd, name, || fs_at::mknodat(pfd, name, mode, dev));
        match r {
            Ok(_) => {}
            Err(err) if errno(&err) == libc::EPERM || errno(&err) == libc::EACCES => {
                self.stats.skipped_devices += 1;
                if !self.warned_devices {
                    self.warned_devices = true;
                    tracing::debug!("cannot create device node {}: {err}", self.path);
                }
                return Ok(false);
            }
            Err(err) => return Err(self.write_error(err)),
        }
        self.lmeta(pfd, name, e, true).map_err(|err| self.write_error(err))?;
        self.stats.devices += 1;
        Ok(true)
    }

    /// `.wh.NAME` / `.wh..wh..opq` in `parent` (OCI layer mode).
    fn whiteout(&mut self, parent: &[&[u8]], target: &[u8]) -> Result<()> {
        if self.stack_dirty {
            self.stack.clear();
            self.stack_dirty = false;
        }
        let opaque = target == b".wh..opq";
        if !opaque && (target.is_empty() || target == b"." || target == b"..") {
            return Err(self.hostile("is an invalid whiteout"));
        }
        let mut created = Vec::new();
        let r = self.stack.resolve(self.root, parent, opaque, self.opts.follow_symlinks_in_root, &mut created);
        for c in created {
            self.dirs.push(Deferred { comps: c, meta: None });
        }
        let pfd = match r {
            Ok(fd) => fd,
            Err(ResolveError::Missing) => return Ok(()), // nothing to white out
            Err(e) => return Err(self.resolve_error(e, parent)),
        };
        let res = if opaque {
            opaque_clear(pfd, join(parent), &self.layer_paths)
        } else {
            let t = CString::new(target).map_err(|_| self.hostile("contains a NUL byte"))?;
            fs_at::remove_all_at(pfd, &t)
        };
        res.map_err(|err| self.write_error(err))?;
        self.stack_dirty = true;
        self.stats.whiteouts += 1;
        Ok(())
    }

    /// Directory metadata, deepest first, once all entries are written.
    fn finish_dirs(&mut self) -> Result<()> {
        let mut dirs = std::mem::take(&mut self.dirs);
        // Stable: for the same path, a later entry is applied later and wins.
        dirs.sort_by(|a, b| b.comps.cmp(&a.comps));
        self.stack.clear();
        for d in dirs {
            let comps: Vec<&[u8]> = d.comps.iter().map(|c| c.as_slice()).collect();
            self.path = String::from_utf8_lossy(&join(&comps)).into_owned();
            let fd = match self.stack.resolve(
                self.root,
                &comps,
                false,
                self.opts.follow_symlinks_in_root,
                &mut Vec::new(),
            ) {
                Ok(fd) => fd,
                // Replaced by a later non-directory entry.
                Err(ResolveError::Missing) | Err(ResolveError::NotDir { .. }) => continue,
                Err(ResolveError::Io(err)) => return Err(self.write_error(err)),
            };
            let r = match &d.meta {
                Some(m) => self.apply_fd(fd, m, true),
                None => fs_at::fchmod(fd, 0o755),
            };
            r.map_err(|err| self.write_error(err))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_paths() {
        let s = |p: &str| {
            split_path(p.as_bytes())
                .map(|v| v.iter().map(|c| String::from_utf8_lossy(c).into_owned()).collect::<Vec<_>>())
        };
        assert_eq!(s("a/b/c").unwrap(), ["a", "b", "c"]);
        assert_eq!(s("/etc/passwd").unwrap(), ["etc", "passwd"]);
        assert_eq!(s("./a//./b/").unwrap(), ["a", "b"]);
        assert_eq!(s("a/../b").unwrap(), ["b"]);
        assert_eq!(s("./").unwrap(), Vec::<String>::new());
        assert!(s("../x").is_err());
        assert!(s("a/../../x").is_err());
        assert!(s("/../etc").is_err());
        assert!(split_path(b"a\0b").is_err());
    }

    fn tree() -> (tempfile::TempDir, OwnedFd) {
        let d = tempfile::tempdir().unwrap();
        let fd = fs_at::open_dir(d.path()).unwrap();
        (d, fd)
    }

    #[test]
    fn stack_never_follows_symlinks() {
        let (d, fd) = tree();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::os::unix::fs::symlink("/", d.path().join("a/link")).unwrap();
        std::fs::write(d.path().join("a/file"), b"").unwrap();
        let mut st = DirStack::default();
        let mut created = Vec::new();
        let root = fd.as_raw_fd();
        assert!(st.resolve(root, &[b"a", b"b"], false, false, &mut created).is_ok());
        assert_eq!(st.names.len(), 2);
        match st.resolve(root, &[b"a", b"link", b"etc"], true, false, &mut created) {
            Err(ResolveError::NotDir { depth: 1, symlink: true }) => {}
            _ => panic!("symlink must not be followed"),
        }
        match st.resolve(root, &[b"a", b"file", b"x"], true, false, &mut created) {
            Err(ResolveError::NotDir { depth: 1, symlink: false }) => {}
            _ => panic!("file is not a dir"),
        }
        assert!(matches!(st.resolve(root, &[b"nope"], false, false, &mut created), Err(ResolveError::Missing)));
        assert!(created.is_empty());
        st.resolve(root, &[b"new", b"deep"], true, false, &mut created).ok().unwrap();
        assert_eq!(created, vec![vec![b"new".to_vec()], vec![b"new".to_vec(), b"deep".to_vec()]]);
        assert!(d.path().join("new/deep").is_dir());
    }

    #[test]
    fn stack_follows_inside_root_when_asked() {
        let (d, fd) = tree();
        std::fs::create_dir_all(d.path().join("usr/lib")).unwrap();
        std::os::unix::fs::symlink("/usr/lib", d.path().join("lib")).unwrap();
        std::os::unix::fs::symlink("../../../../../../usr", d.path().join("up")).unwrap();
        let mut st = DirStack::default();
        let root = fd.as_raw_fd();
        let lib = st.resolve(root, &[b"lib"], false, true, &mut Vec::new()).ok().unwrap();
        let sta = fs_at::fstat(lib).unwrap();
        let stb = std::fs::metadata(d.path().join("usr/lib")).unwrap();
        assert_eq!(sta.st_ino, std::os::unix::fs::MetadataExt::ino(&stb));
        // `..` in a symlink is clamped at the tree root too.
        let up = st.resolve(root, &[b"up"], false, true, &mut Vec::new()).ok().unwrap();
        let stu = fs_at::fstat(up).unwrap();
        let stc = std::fs::metadata(d.path().join("usr")).unwrap();
        assert_eq!(stu.st_ino, std::os::unix::fs::MetadataExt::ino(&stc));
    }
}

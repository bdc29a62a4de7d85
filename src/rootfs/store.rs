//! The rootfs store: `<home>/rootfs/<name>/{tree/, meta.json}`.
//!
//! * Imports unpack into `<store>/.tmp-<name>-<pid>-<random>/tree`, write `meta.json`
//!   beside it, and rename the temp dir to `<store>/<name>` (atomic: a name is either
//!   complete or absent). The importer holds an exclusive `flock` on the temp dir; `gc`
//!   removes temp dirs whose lock it can take (importers that died).
//! * A [`RootfsLease`] holds a shared `flock` on `<store>/<name>`; `remove` takes it
//!   exclusively without waiting, so a rootfs in use cannot be removed. Removal renames
//!   the dir to `.rm-<name>-…` first, so the name disappears at once.

use super::archive::{self, StreamError};
use super::unpack::{self, UnpackError, UnpackOptions};
use super::{probe, validate_name, CANCEL};
use crate::sys::fs_at::{self, errno};
use anyhow::{anyhow, bail, Context, Result};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What `rootfs list` shows; stored as `<store>/<name>/meta.json`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RootfsInfo {
    pub name: String,
    /// The tree: `<store>/<name>/tree`.
    pub path: PathBuf,
    /// Bytes of file data.
    pub size_bytes: u64,
    /// Entries written (files, directories, links, nodes).
    pub entries: u64,
    /// Where it came from: the label given to [`Store::import_labeled`] and the format,
    /// e.g. `ubuntu.tar.zst (tar+zstd)`; just the format for [`Store::import`].
    pub source: String,
    /// SHA-256 of the archive stream as read (compressed bytes).
    pub sha256: Option<String>,
    /// RFC 3339, UTC.
    pub imported_at: String,
    /// `uname -m` style, from the ELF header of `/bin/sh` or `/usr/bin/env`.
    pub arch: Option<String>,
    /// From `usr/local/cuda/version.json` (or `version.txt`, or the dpkg database).
    pub cuda_version: Option<String>,
    /// What was added to the archive's uids and gids (see [`crate::identity::store_shift`]):
    /// 1 in a rootless store, 0 as root and in rootless stores made before jobs got ids of
    /// their own (those are refused: re-import).
    #[serde(default)]
    pub id_shift: u32,
}

/// A rootfs in use: while this value lives, `remove` refuses the name.
#[derive(Debug)]
pub struct RootfsLease {
    info: RootfsInfo,
    _lock: OwnedFd,
}

impl RootfsLease {
    /// The tree directory, `<store>/<name>/tree`.
    pub fn path(&self) -> &Path {
        &self.info.path
    }
    pub fn info(&self) -> &RootfsInfo {
        &self.info
    }
}

#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

const META: &str = "meta.json";
const TREE: &str = "tree";
const TMP_PREFIX: &str = ".tmp-";
const RM_PREFIX: &str = ".rm-";

fn unknown(name: &str) -> anyhow::Error {
    anyhow!("unknown rootfs '{name}': see `azp-sandbox rootfs list`")
}

/// A temp import dir, locked; removed on drop unless committed.
struct TempImport {
    path: PathBuf,
    /// Held (exclusive flock) until the import is committed or abandoned.
    _lock: OwnedFd,
    armed: bool,
}

impl TempImport {
    fn create(store: &Path, name: &str) -> Result<TempImport> {
        for _ in 0..8 {
            let path = store.join(format!("{TMP_PREFIX}{name}-{}-{}", std::process::id(), fs_at::random_suffix()));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).with_context(|| format!("cannot create a temp dir in {}", store.display())),
            }
            let lock = match fs_at::open_dir(&path) {
                Ok(fd) => fd,
                Err(_) => continue, // removed by a concurrent gc before we locked it
            };
            if fs_at::flock(lock.as_fd(), libc::LOCK_EX | libc::LOCK_NB).is_err() {
                continue; // a gc holds it and is deleting it
            }
            if fs_at::fstat(lock.as_raw_fd()).map(|st| st.st_nlink).unwrap_or(0) == 0 {
                continue; // deleted between our mkdir and our lock
            }
            return Ok(TempImport { path, _lock: lock, armed: true });
        }
        bail!("cannot create a temp dir in {}: gave up after 8 attempts", store.display())
    }
}

impl Drop for TempImport {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = fs_at::remove_tree(&self.path) {
                tracing::warn!("cannot remove {}: {e} (`rootfs gc` retries)", self.path.display());
            }
        }
    }
}

use std::os::unix::fs::DirBuilderExt;

/// The files every job bind-mounts over (`/etc/hosts`, `/etc/resolv.conf`), made empty in
/// the shared tree when the archive lacks them (images built by Docker usually do: the
/// engine supplies them at run time). Otherwise each job's start copies `/etc` up into
/// its upper layer and creates them there: a dir and two files on disk per job, ~0.8 ms
/// of a trivial job measured. They get `/etc`'s times, and `/etc` keeps its own. Nothing
/// is followed: an `etc` that is a symlink or no dir, or names already there in any
/// form, are left as they are.
fn add_mount_targets(tree: &Path) -> io::Result<()> {
    let tree_fd = fs_at::open_dir(tree)?;
    let etc = match fs_at::open_dir_at(tree_fd.as_raw_fd(), c"etc") {
        Ok(fd) => fd,
        Err(e) if matches!(errno(&e), libc::ENOENT | libc::ELOOP | libc::ENOTDIR) => return Ok(()),
        Err(e) => return Err(e),
    };
    let st = fs_at::fstat(etc.as_raw_fd())?;
    let times = [
        libc::timespec { tv_sec: st.st_atime, tv_nsec: st.st_atime_nsec },
        libc::timespec { tv_sec: st.st_mtime, tv_nsec: st.st_mtime_nsec },
    ];
    let mut made = false;
    for name in [c"hosts", c"resolv.conf"] {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let file = match fs_at::openat(etc.as_raw_fd(), name, flags, 0o644) {
            Err(e) if errno(&e) == libc::EEXIST => continue,
            r => r?,
        };
        // fchmod: the mode does not depend on the umask.
        fs_at::fchmod(file.as_raw_fd(), 0o644)?;
        fs_at::futimens(file.as_raw_fd(), &times)?;
        made = true;
    }
    if made {
        fs_at::futimens(etc.as_raw_fd(), &times)?;
    }
    Ok(())
}

impl Store {
    /// The store of `home`: `home.rootfs_dir()`.
    pub fn new(home: &crate::config::Home) -> Store {
        Store { dir: home.rootfs_dir() }
    }

    /// A store in an arbitrary directory.
    pub fn at(dir: impl Into<PathBuf>) -> Store {
        Store { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Imports a tar archive (plain, gzip or zstd, detected from its first bytes) as
    /// `name`. `progress` gets the number of archive bytes read so far.
    pub fn import(&self, src: &mut dyn Read, name: &str, progress: &mut dyn FnMut(u64)) -> Result<RootfsInfo> {
        self.import_inner(src, name, None, progress)
    }

    /// [`Store::import`], recording `label` (e.g. the file name, or `-` for stdin) as the
    /// source.
    pub fn import_labeled(
        &self,
        src: &mut dyn Read,
        name: &str,
        label: &str,
        progress: &mut dyn FnMut(u64),
    ) -> Result<RootfsInfo> {
        self.import_inner(src, name, Some(label), progress)
    }

    fn exists_error(name: &str) -> anyhow::Error {
        anyhow!("rootfs '{name}' already exists: remove it with `azp-sandbox rootfs rm {name}` first")
    }

    fn no_space(&self, name: &str, written: u64) -> anyhow::Error {
        anyhow!(
            "no space left on device while importing '{name}' (wrote {written} bytes): free space under {}",
            self.dir.display()
        )
    }

    fn import_inner(
        &self,
        src: &mut dyn Read,
        name: &str,
        label: Option<&str>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<RootfsInfo> {
        let (final_dir, mut tmp, tree_fd) = self.begin(name)?;

        let opts = UnpackOptions { cancel: Some(&CANCEL), ..UnpackOptions::default() };
        let piped = archive::pipeline(src, progress, &CANCEL, |_, r| unpack::unpack_at(r, tree_fd.as_fd(), &opts));
        let (stream, stats) = match piped {
            Err(StreamError::Source(e)) => bail!("cannot read the archive for '{name}': {e}"),
            Err(e) => return Err(e.into()),
            Ok((_, Err(UnpackError::NoSpace { written }))) => return Err(self.no_space(name, written)),
            Ok((_, Err(UnpackError::Interrupted))) => bail!("import of '{name}' interrupted"),
            Ok((_, Err(e))) => return Err(e.into()),
            Ok((stream, Ok(stats))) => (stream, stats),
        };
        if stats.entries == 0 {
            bail!("the archive has no entries: nothing to import as '{name}'");
        }
        if stream.trailing_bytes > 0 {
            tracing::warn!("ignored {} bytes after the end of the gzip stream", stream.trailing_bytes);
        }
        let source = match label {
            Some(l) => format!("{l} ({})", stream.compression.describe()),
            None => stream.compression.describe().to_string(),
        };
        let mut info = RootfsInfo {
            name: name.to_string(),
            path: final_dir.join(TREE),
            size_bytes: stats.bytes,
            entries: stats.entries,
            source,
            sha256: Some(stream.sha256),
            imported_at: rfc3339_now(),
            arch: probe::arch(tree_fd.as_raw_fd()),
            cuda_version: probe::cuda_version(tree_fd.as_raw_fd()),
            id_shift: if opts.same_owner { opts.id_shift } else { 0 },
        };
        drop(tree_fd);

        self.commit(&mut tmp, name, &final_dir, &info)?;
        drop(tmp);
        info.path = final_dir.join(TREE);
        Ok(info)
    }

    /// Starts an import of `name`: checks the name is valid and free, and creates the
    /// locked temp dir with an empty tree. Returns the final dir, the temp import and the
    /// tree's fd.
    fn begin(&self, name: &str) -> Result<(PathBuf, TempImport, OwnedFd)> {
        validate_name(name)?;
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("cannot create the rootfs store {}", self.dir.display()))?;
        let final_dir = self.dir.join(name);
        if final_dir.symlink_metadata().is_ok() {
            return Err(Self::exists_error(name));
        }
        let tmp = TempImport::create(&self.dir, name)?;
        let tree = tmp.path.join(TREE);
        std::fs::DirBuilder::new().mode(0o755).create(&tree).map_err(|e| self.io_error(name, e, 0, "cannot create"))?;
        let tree_fd = fs_at::open_dir(&tree).with_context(|| format!("cannot open {}", tree.display()))?;
        Ok((final_dir, tmp, tree_fd))
    }

    /// Makes a finished temp import the rootfs `name`: metadata written and synced, then
    /// an atomic rename (never over an existing rootfs) and a sync of the store dir.
    fn commit(&self, tmp: &mut TempImport, name: &str, final_dir: &Path, info: &RootfsInfo) -> Result<()> {
        add_mount_targets(&tmp.path.join(TREE))
            .map_err(|e| self.io_error(name, e, info.size_bytes, "cannot create"))?;
        let meta = tmp.path.join(META);
        let write_meta = || -> io::Result<()> {
            let mut f = std::fs::File::create(&meta)?;
            f.write_all(&serde_json::to_vec_pretty(info).map_err(io::Error::other)?)?;
            f.write_all(b"\n")?;
            f.sync_all()
        };
        write_meta().map_err(|e| self.io_error(name, e, info.size_bytes, "cannot write"))?;
        std::fs::set_permissions(&tmp.path, std::fs::Permissions::from_mode(0o711))
            .with_context(|| format!("cannot chmod {}", tmp.path.display()))?;
        match fs_at::rename_noreplace(&tmp.path, final_dir) {
            Ok(()) => tmp.armed = false,
            Err(e) if matches!(errno(&e), libc::EEXIST | libc::ENOTEMPTY) => return Err(Self::exists_error(name)),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot rename {} to {}", tmp.path.display(), final_dir.display()))
            }
        }
        fs_at::fsync_dir(&self.dir).with_context(|| format!("cannot fsync {}", self.dir.display()))?;
        Ok(())
    }

    fn io_error(&self, name: &str, e: io::Error, written: u64, what: &str) -> anyhow::Error {
        match errno(&e) {
            libc::ENOSPC | libc::EDQUOT => self.no_space(name, written),
            _ => anyhow!("{what} files for '{name}' in {}: {e}", self.dir.display()),
        }
    }

    fn read_meta(dir: &Path, name: &str) -> Result<RootfsInfo> {
        let p = dir.join(META);
        let bytes = std::fs::read(&p).with_context(|| format!("cannot read {}", p.display()))?;
        let mut info: RootfsInfo =
            serde_json::from_slice(&bytes).with_context(|| format!("malformed {}", p.display()))?;
        // The store may have moved since the import.
        info.name = name.to_string();
        info.path = dir.join(TREE);
        Ok(info)
    }

    /// All imported root filesystems, by name.
    pub fn list(&self) -> Result<Vec<RootfsInfo>> {
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("cannot list {}", self.dir.display())),
        };
        let mut out = Vec::new();
        for ent in rd {
            let ent = ent.with_context(|| format!("cannot list {}", self.dir.display()))?;
            let Some(name) = ent.file_name().to_str().map(str::to_owned) else { continue };
            if validate_name(&name).is_err() || !ent.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            match Self::read_meta(&ent.path(), &name) {
                Ok(info) => out.push(info),
                Err(e) => tracing::warn!("skipping rootfs '{name}': {e:#}"),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Opens `<store>/<name>`, checking it is still that name's directory once locked.
    fn open_locked(&self, name: &str, op: libc::c_int) -> Result<(PathBuf, OwnedFd)> {
        validate_name(name)?;
        let dir = self.dir.join(name);
        let fd = match fs_at::open_dir(&dir) {
            Ok(fd) => fd,
            Err(e) if matches!(errno(&e), libc::ENOENT | libc::ENOTDIR | libc::ELOOP) => return Err(unknown(name)),
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", dir.display())),
        };
        if let Err(e) = fs_at::flock(fd.as_fd(), op) {
            if errno(&e) == libc::EWOULDBLOCK {
                bail!("rootfs '{name}' is in use by a running sandbox");
            }
            return Err(e).with_context(|| format!("cannot lock {}", dir.display()));
        }
        let st = fs_at::fstat(fd.as_raw_fd()).with_context(|| format!("cannot stat {}", dir.display()))?;
        let same = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.dev() == st.st_dev && m.ino() == st.st_ino);
        if st.st_nlink == 0 || !same {
            return Err(unknown(name)); // removed (or replaced) while we waited
        }
        Ok((dir, fd))
    }

    /// Removes `name`; refused while a lease on it is held.
    pub fn remove(&self, name: &str) -> Result<()> {
        let (dir, lock) = self.open_locked(name, libc::LOCK_EX | libc::LOCK_NB)?;
        let trash = self.dir.join(format!("{RM_PREFIX}{name}-{}-{}", std::process::id(), fs_at::random_suffix()));
        std::fs::rename(&dir, &trash)
            .with_context(|| format!("cannot rename {} to {}", dir.display(), trash.display()))?;
        let _ = fs_at::fsync_dir(&self.dir);
        if let Err(e) = fs_at::remove_tree(&trash) {
            tracing::warn!("removed rootfs '{name}', but cannot delete {}: {e} (`rootfs gc` retries)", trash.display());
        }
        drop(lock);
        Ok(())
    }

    /// Takes a shared lock on `name` for as long as the lease lives.
    pub fn lease(&self, name: &str) -> Result<RootfsLease> {
        let (dir, lock) = self.open_locked(name, libc::LOCK_SH)?;
        let info = match Self::read_meta(&dir, name) {
            Ok(i) => i,
            Err(e) => return Err(e.context(format!("rootfs '{name}' is damaged: remove it and import it again"))),
        };
        let want = crate::identity::store_shift();
        if info.id_shift != want {
            bail!(
                "rootfs '{name}' was imported with its ids shifted by {} but jobs here need {want} (a rootless store \
                 made before jobs got ids of their own): re-import it (`azp-sandbox rootfs rm {name}`, then \
                 `rootfs import` or `rootfs pull` again)",
                info.id_shift
            );
        }
        Ok(RootfsLease { info, _lock: lock })
    }

    /// Removes leftovers of imports and removals whose process died (temp dirs nobody
    /// holds a lock on). Returns the removed paths.
    pub fn gc(&self) -> Result<Vec<PathBuf>> {
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("cannot list {}", self.dir.display())),
        };
        let mut removed = Vec::new();
        for ent in rd {
            let ent = ent.with_context(|| format!("cannot list {}", self.dir.display()))?;
            let fname = ent.file_name();
            let fname = fname.to_string_lossy();
            if !(fname.starts_with(TMP_PREFIX) || fname.starts_with(RM_PREFIX)) {
                continue;
            }
            let path = ent.path();
            let fd = match fs_at::open_dir(&path) {
                Ok(fd) => fd,
                Err(_) => continue, // gone, or not a directory: not ours
            };
            if fs_at::flock(fd.as_fd(), libc::LOCK_EX | libc::LOCK_NB).is_err() {
                continue; // a live import or removal
            }
            if fs_at::fstat(fd.as_raw_fd()).map(|st| st.st_nlink).unwrap_or(0) == 0 {
                continue;
            }
            fs_at::remove_tree(&path).with_context(|| format!("cannot remove {}", path.display()))?;
            drop(fd);
            removed.push(path);
        }
        Ok(removed)
    }
}

/// What [`Store::import_with`] records about a tree its closure wrote.
#[derive(Debug, Clone, Default)]
pub struct ImportFacts {
    pub source: String,
    pub sha256: Option<String>,
    pub size_bytes: u64,
    pub entries: u64,
    /// `None`: probed from the tree, as [`Store::import`] does.
    pub arch: Option<String>,
    /// `None`: probed from the tree, as [`Store::import`] does.
    pub cuda_version: Option<String>,
}

impl Store {
    /// Imports `name` from whatever `fill` writes into the empty tree directory it gets
    /// (e.g. image layers applied in order), with the atomicity of [`Store::import`]: on
    /// an error nothing is left, on success the name appears complete.
    pub fn import_with(
        &self,
        name: &str,
        fill: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> Result<ImportFacts>,
    ) -> Result<RootfsInfo> {
        let (final_dir, mut tmp, tree_fd) = self.begin(name)?;
        let facts = fill(tree_fd.as_fd())?;
        let info = RootfsInfo {
            name: name.to_string(),
            path: final_dir.join(TREE),
            size_bytes: facts.size_bytes,
            entries: facts.entries,
            source: facts.source,
            sha256: facts.sha256,
            imported_at: rfc3339_now(),
            arch: facts.arch.or_else(|| probe::arch(tree_fd.as_raw_fd())),
            cuda_version: facts.cuda_version.or_else(|| probe::cuda_version(tree_fd.as_raw_fd())),
            id_shift: crate::identity::store_shift(),
        };
        drop(tree_fd);
        self.commit(&mut tmp, name, &final_dir, &info)?;
        Ok(info)
    }
}

fn rfc3339_now() -> String {
    crate::clock::rfc3339(crate::clock::now_unix())
}

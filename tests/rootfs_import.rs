//! `rootfs import` through the library API: formats, metadata fidelity, hostile archives,
//! atomicity, leases and gc. The hostile cases check that nothing outside the store was
//! written, using a sentinel directory next to it.

#[path = "common/digest.rs"]
mod digest;
#[path = "common/skip.rs"]
mod skip;

use azp_sandbox::config::Home;
use azp_sandbox::rootfs::{unpack, RootfsInfo, Store, UnpackError, UnpackOptions};
use skip::skip;
use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tar::{EntryType, Header};

const MTIME: u64 = 1_600_000_000;

fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// A tar archive built header by header (paths are raw bytes: `../`, absolute paths and
/// anything else a hostile archive may contain).
struct Ar(Vec<u8>);

impl Ar {
    fn new() -> Ar {
        Ar(Vec::new())
    }

    fn push_block(&mut self, h: &Header, data: &[u8]) {
        self.0.extend_from_slice(h.as_bytes());
        self.0.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.0.extend(std::iter::repeat_n(0u8, pad));
    }

    fn long(&mut self, ty: EntryType, value: &[u8]) {
        let mut h = Header::new_gnu();
        h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
        h.set_entry_type(ty);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        let mut v = value.to_vec();
        v.push(0);
        h.set_size(v.len() as u64);
        h.set_cksum();
        self.push_block(&h, &v);
    }

    /// One entry; `f` may adjust the header (owner, mode, device numbers).
    fn entry(
        &mut self,
        path: &[u8],
        ty: EntryType,
        link: &[u8],
        mode: u32,
        data: &[u8],
        f: impl FnOnce(&mut Header),
    ) -> &mut Self {
        if path.len() > 100 {
            self.long(EntryType::GNULongName, path);
        }
        if link.len() > 100 {
            self.long(EntryType::GNULongLink, link);
        }
        let mut h = Header::new_gnu();
        let n = path.len().min(100);
        h.as_old_mut().name[..n].copy_from_slice(&path[..n]);
        let l = link.len().min(100);
        h.as_old_mut().linkname[..l].copy_from_slice(&link[..l]);
        h.set_entry_type(ty);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(MTIME);
        h.set_size(data.len() as u64);
        f(&mut h);
        h.set_cksum();
        self.push_block(&h, data);
        self
    }

    fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> &mut Self {
        self.entry(path.as_bytes(), EntryType::Regular, b"", mode, data, |_| {})
    }
    fn dir(&mut self, path: &str, mode: u32) -> &mut Self {
        self.entry(path.as_bytes(), EntryType::Directory, b"", mode, b"", |_| {})
    }
    fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.entry(path.as_bytes(), EntryType::Symlink, target.as_bytes(), 0o777, b"", |_| {})
    }
    fn hardlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.entry(path.as_bytes(), EntryType::Link, target.as_bytes(), 0o644, b"", |_| {})
    }
    /// A PAX extended header for the next entry.
    fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        let mut data = Vec::new();
        for (k, v) in records {
            let rest = k.len() + v.len() + 3; // ' ' '=' '\n'
            let mut len = rest + 1;
            while len != rest + len.to_string().len() {
                len = rest + len.to_string().len();
            }
            data.extend_from_slice(format!("{len} {k}=").as_bytes());
            data.extend_from_slice(v);
            data.push(b'\n');
        }
        self.entry(b"PaxHeaders/x", EntryType::XHeader, b"", 0o644, &data, |_| {})
    }
    fn finish(&mut self) -> Vec<u8> {
        let mut v = std::mem::take(&mut self.0);
        v.extend_from_slice(&[0u8; 1024]);
        v
    }
}

fn gz(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn zst(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

struct Env {
    _tmp: tempfile::TempDir,
    store: Store,
    /// Outside the store: hostile archives aim here; must stay untouched.
    sentinel: PathBuf,
}

impl Env {
    /// `Store::remove`, retried for a moment while "in use": the store's locks are flocks
    /// on directory fds, and a process another test thread forks at that instant holds a
    /// copy of such an fd until it execs (O_CLOEXEC closes it only then).
    fn remove_settled(&self, name: &str) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match self.store.remove(name) {
                Err(e) if e.to_string().contains("in use") && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                r => return r,
            }
        }
    }

    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let home = Home::new(tmp.path().join("home"));
        let sentinel = tmp.path().join("sentinel");
        std::fs::create_dir(&sentinel).unwrap();
        std::fs::write(sentinel.join("victim"), b"original").unwrap();
        Env { store: Store::new(&home), sentinel, _tmp: tmp }
    }

    fn import(&self, bytes: &[u8], name: &str) -> anyhow::Result<RootfsInfo> {
        self.store.import(&mut &bytes[..], name, &mut |_| {})
    }

    fn tree(&self, name: &str) -> PathBuf {
        self.store.dir().join(name).join("tree")
    }

    fn sentinel_str(&self) -> &str {
        self.sentinel.to_str().unwrap()
    }

    /// Nothing was written outside the store, no `name` and no temp dir are left.
    fn assert_clean_failure(&self, name: &str) {
        let names: Vec<_> = std::fs::read_dir(&self.sentinel).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("victim")], "sentinel dir changed");
        assert_eq!(std::fs::read(self.sentinel.join("victim")).unwrap(), b"original");
        assert_eq!(std::fs::metadata(self.sentinel.join("victim")).unwrap().nlink(), 1);
        assert!(!self.store.dir().join(name).exists(), "{name} must not exist");
        assert_eq!(self.leftovers(), Vec::<String>::new());
    }

    fn leftovers(&self) -> Vec<String> {
        match std::fs::read_dir(self.store.dir()) {
            Ok(rd) => rd
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with('.'))
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

fn err_of(r: anyhow::Result<RootfsInfo>) -> String {
    format!("{:#}", r.expect_err("import must fail"))
}

fn simple_tar() -> Vec<u8> {
    Ar::new().dir("etc/", 0o755).file("etc/hostname", 0o644, b"box\n").symlink("etc/link", "hostname").finish()
}

// ---------------------------------------------------------------- formats

#[test]
fn plain_gzip_and_zstd_are_detected_by_magic() {
    let env = Env::new();
    let tar = simple_tar();
    for (name, bytes, kind) in
        [("plain", tar.clone(), "tar"), ("gz", gz(&tar), "tar+gzip"), ("zst", zst(&tar), "tar+zstd")]
    {
        let mut seen = 0;
        let info = env.store.import(&mut &bytes[..], name, &mut |n| seen = n).unwrap();
        assert_eq!(info.source, kind);
        assert_eq!(info.sha256.as_deref(), Some(digest::sha256_hex(&bytes).as_str()));
        assert_eq!(seen, bytes.len() as u64, "progress reports all bytes read");
        assert_eq!(info.entries, 3);
        assert_eq!(info.size_bytes, 4);
        assert_eq!(info.path, env.tree(name));
        assert_eq!(std::fs::read(env.tree(name).join("etc/hostname")).unwrap(), b"box\n");
        assert_eq!(std::fs::read_link(env.tree(name).join("etc/link")).unwrap(), Path::new("hostname"));
        assert!(info.imported_at.ends_with('Z') && info.imported_at.len() == 20, "{}", info.imported_at);
    }
    let names: Vec<_> = env.store.list().unwrap().into_iter().map(|i| i.name).collect();
    assert_eq!(names, ["gz", "plain", "zst"]);
}

#[test]
fn mount_targets_are_added_only_where_missing_and_never_through_symlinks() {
    use std::os::unix::fs::MetadataExt;
    let env = Env::new();
    // No /etc/hosts or /etc/resolv.conf: both are made, empty, 0644, with /etc's times.
    let info = env.store.import(&mut &simple_tar()[..], "bare", &mut |_| {}).unwrap();
    assert_eq!(info.entries, 3, "the added files are not archive entries");
    let etc = std::fs::metadata(env.tree("bare").join("etc")).unwrap();
    for f in ["etc/hosts", "etc/resolv.conf"] {
        let m = std::fs::symlink_metadata(env.tree("bare").join(f)).unwrap();
        assert!(m.is_file() && m.len() == 0, "{f}");
        assert_eq!(m.mode() & 0o7777, 0o644, "{f}");
        assert_eq!(m.mtime(), etc.mtime(), "{f}");
    }
    // The archive's own files (any type) are left as they are.
    let own = Ar::new()
        .dir("etc/", 0o755)
        .file("etc/hosts", 0o600, b"10.0.0.1 own\n")
        .symlink("etc/resolv.conf", "../run/resolv.conf")
        .finish();
    env.store.import(&mut &own[..], "own", &mut |_| {}).unwrap();
    assert_eq!(std::fs::read(env.tree("own").join("etc/hosts")).unwrap(), b"10.0.0.1 own\n");
    assert_eq!(std::fs::read_link(env.tree("own").join("etc/resolv.conf")).unwrap(), Path::new("../run/resolv.conf"));
    assert!(!env.tree("own").join("run").exists(), "the symlink was not followed");
    // /etc as a symlink (here to a dir outside the tree): nothing is written through it.
    let outside = env.sentinel.clone();
    let linked = Ar::new().symlink("etc", outside.to_str().unwrap()).finish();
    env.store.import(&mut &linked[..], "linked", &mut |_| {}).unwrap();
    assert!(!outside.join("hosts").exists() && !outside.join("resolv.conf").exists());
    // No /etc at all: none is made.
    let none = Ar::new().dir("bin/", 0o755).finish();
    env.store.import(&mut &none[..], "none", &mut |_| {}).unwrap();
    assert!(!env.tree("none").join("etc").exists());
}

#[test]
fn a_tar_gz_named_file_that_is_zstd_works() {
    let env = Env::new();
    let path = env.sentinel.parent().unwrap().join("image.tar.gz");
    std::fs::write(&path, zst(&simple_tar())).unwrap();
    let mut f = std::fs::File::open(&path).unwrap();
    let info = env.store.import_labeled(&mut f, "mislabelled", "image.tar.gz", &mut |_| {}).unwrap();
    assert_eq!(info.source, "image.tar.gz (tar+zstd)");
    assert_eq!(std::fs::read(env.tree("mislabelled").join("etc/hostname")).unwrap(), b"box\n");
}

#[test]
fn unsupported_and_unrecognised_input() {
    let env = Env::new();
    let xz = [0xfd, b'7', b'z', b'X', b'Z', 0, 0, 4, 0xe6, 0xd6, 0xb4, 0x46];
    assert_eq!(err_of(env.import(&xz, "x")), "unsupported compression: xz; recompress with gzip or zstd");
    assert_eq!(
        err_of(env.import(b"BZh91AY&SY....", "x")),
        "unsupported compression: bzip2; recompress with gzip or zstd"
    );
    assert!(err_of(env.import(&[b'z'; 4096], "x")).starts_with("not a tar archive"));
    assert!(err_of(env.import(b"", "x")).starts_with("empty input"));
    assert_eq!(err_of(env.import(&[0u8; 10240], "x")), "the archive has no entries: nothing to import as 'x'");
    env.assert_clean_failure("x");
}

#[test]
fn names_are_validated_and_never_overwritten() {
    let env = Env::new();
    let e = err_of(env.import(&simple_tar(), "../evil"));
    assert!(e.starts_with("invalid rootfs name '../evil': use 1 to 64 characters"), "{e}");
    env.import(&simple_tar(), "dup").unwrap();
    assert_eq!(
        err_of(env.import(&simple_tar(), "dup")),
        "rootfs 'dup' already exists: remove it with `azp-sandbox rootfs rm dup` first"
    );
    assert_eq!(env.leftovers(), Vec::<String>::new());
}

// ---------------------------------------------------------------- fidelity

#[test]
fn modes_owners_times_and_links_are_preserved() {
    let env = Env::new();
    let own = |h: &mut Header| {
        h.set_uid(1234);
        h.set_gid(5678);
    };
    let tar = Ar::new()
        .dir("./", 0o755)
        .dir("bin/", 0o755)
        .entry(b"bin/su", EntryType::Regular, b"", 0o4755, b"#!suid", own)
        .entry(b"bin/wall", EntryType::Regular, b"", 0o2755, b"#!sgid", own)
        .file("bin/plain", 0o640, b"data")
        .file("bin/world", 0o666, b"rw")
        .hardlink("bin/su-again", "bin/su")
        .symlink("bin/sh", "/bin/busybox")
        .dir("tmp/", 0o1777)
        .entry(b"srv/", EntryType::Directory, b"", 0o2750, b"", own)
        // A mode-000 directory must not stop its contents from being written.
        .dir("locked/", 0o000)
        .file("locked/inner", 0o600, b"x")
        .dir("locked/sub/", 0o555)
        .file("locked/sub/deep", 0o444, b"y")
        // Contents before their directory entry, and implicit parents.
        .file("late/f", 0o644, b"z")
        .dir("late/", 0o710)
        .file("implicit/parent/f", 0o644, b"")
        .finish();
    env.import(&tar, "meta").unwrap();
    let t = env.tree("meta");
    let md = |p: &str| std::fs::symlink_metadata(t.join(p)).unwrap();
    let mode = |p: &str| md(p).mode() & 0o7777;
    assert_eq!(mode("bin/su"), 0o4755, "setuid survives chown");
    assert_eq!(mode("bin/wall"), 0o2755);
    assert_eq!(mode("bin/plain"), 0o640);
    assert_eq!(mode("bin/world"), 0o666, "umask does not apply");
    assert_eq!(mode("tmp"), 0o1777);
    assert_eq!(mode("srv"), 0o2750);
    assert_eq!(mode("locked"), 0o000);
    // Non-root cannot look inside a mode-000 directory: open it up to check, then restore.
    std::fs::set_permissions(t.join("locked"), std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(mode("locked/sub"), 0o555);
    assert_eq!(mode("locked/sub/deep"), 0o444);
    assert_eq!(std::fs::read(t.join("locked/sub/deep")).unwrap(), b"y");
    assert_eq!(std::fs::read(t.join("locked/inner")).unwrap(), b"x");
    assert_eq!(md("locked/sub").mtime(), MTIME as i64);
    std::fs::set_permissions(t.join("locked"), std::fs::Permissions::from_mode(0o000)).unwrap();
    assert_eq!(mode("late"), 0o710);
    assert_eq!(mode("implicit"), 0o755);
    assert_eq!(mode("implicit/parent"), 0o755);
    assert_eq!(mode(""), 0o755);
    if is_root() {
        assert_eq!((md("bin/su").uid(), md("bin/su").gid()), (1234, 5678));
        assert_eq!((md("srv").uid(), md("srv").gid()), (1234, 5678));
        assert_eq!((md("bin/plain").uid(), md("bin/plain").gid()), (0, 0));
    } else {
        let me = unsafe { libc::geteuid() };
        assert_eq!(md("bin/su").uid(), me);
    }
    assert_eq!(md("bin/su").ino(), md("bin/su-again").ino());
    assert_eq!(md("bin/su").nlink(), 2);
    assert!(md("bin/sh").file_type().is_symlink());
    assert_eq!(std::fs::read_link(t.join("bin/sh")).unwrap(), Path::new("/bin/busybox"));
    for p in ["bin/su", "bin/plain", "bin/sh", "tmp", "locked", "late", "", "bin"] {
        assert_eq!(md(p).mtime(), MTIME as i64, "mtime of '{p}'");
    }
    // The store can still remove it (mode-000 directories included).
    env.remove_settled("meta").unwrap();
    assert!(!env.store.dir().join("meta").exists());
}

#[test]
fn pax_paths_times_and_long_names() {
    let env = Env::new();
    let long = format!("{}/file", "d".repeat(200));
    let tar = Ar::new()
        .pax(&[("path", b"pax/named"), ("mtime", b"1700000000.25")])
        .file("ignored-name", 0o644, b"p")
        .file(&long, 0o644, b"l")
        .entry(b"sym", EntryType::Symlink, "t".repeat(300).as_bytes(), 0o777, b"", |_| {})
        .finish();
    env.import(&tar, "pax").unwrap();
    let t = env.tree("pax");
    let m = std::fs::metadata(t.join("pax/named")).unwrap();
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_700_000_000, 250_000_000));
    assert!(!t.join("ignored-name").exists());
    assert_eq!(std::fs::read(t.join(&long)).unwrap(), b"l");
    assert_eq!(std::fs::read_link(t.join("sym")).unwrap().as_os_str().len(), 300);
}

fn getxattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (r >= 0).then(|| buf[..r as usize].to_vec())
}

fn setxattr(p: &Path, name: &str, v: &[u8]) -> std::io::Result<()> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let r = unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn xattrs_from_pax_headers() {
    let env = Env::new();
    std::fs::create_dir_all(env.store.dir()).unwrap();
    let probe = env.store.dir().join("probe");
    std::fs::write(&probe, b"").unwrap();
    if let Err(e) = setxattr(&probe, "user.azp_probe", b"1") {
        return skip(format!("the filesystem refuses user xattrs: {e}"));
    }
    std::fs::remove_file(&probe).unwrap();
    // File capabilities (security.capability, VFS_CAP_REVISION_2, CAP_NET_RAW effective)
    // are cleared by chown: they must be set after it.
    let mut cap = Vec::new();
    cap.extend_from_slice(&(0x0200_0000u32 | 1).to_le_bytes());
    cap.extend_from_slice(&(1u32 << 13).to_le_bytes());
    cap.extend_from_slice(&[0u8; 12]);
    let tar = Ar::new()
        .pax(&[("SCHILY.xattr.user.origin", b"test\x00bin"), ("SCHILY.xattr.trusted.x", b"t")])
        .file("f", 0o644, b"")
        .pax(&[("SCHILY.xattr.user.dir", b"d")])
        .dir("d/", 0o755)
        .pax(&[("SCHILY.xattr.security.capability", &cap)])
        .entry(b"ping", EntryType::Regular, b"", 0o755, b"", |h| h.set_uid(1234))
        .finish();
    env.import(&tar, "x").unwrap();
    let t = env.tree("x");
    assert_eq!(getxattr(&t.join("f"), "user.origin").as_deref(), Some(&b"test\x00bin"[..]));
    assert_eq!(getxattr(&t.join("d"), "user.dir").as_deref(), Some(&b"d"[..]));
    if is_root() {
        assert_eq!(getxattr(&t.join("f"), "trusted.x").as_deref(), Some(&b"t"[..]));
        assert_eq!(getxattr(&t.join("ping"), "security.capability"), Some(cap), "file caps survive the chown");
        assert_eq!(std::fs::metadata(t.join("ping")).unwrap().uid(), 1234);
    } else {
        assert_eq!(getxattr(&t.join("f"), "trusted.x"), None, "refused as non-root, import goes on");
    }
}

#[test]
fn device_nodes_and_fifos() {
    let env = Env::new();
    let tar = Ar::new()
        .entry(b"dev/null", EntryType::Char, b"", 0o666, b"", |h| {
            h.set_device_major(1).unwrap();
            h.set_device_minor(3).unwrap();
        })
        .entry(b"dev/loop9", EntryType::Block, b"", 0o660, b"", |h| {
            h.set_device_major(7).unwrap();
            h.set_device_minor(9).unwrap();
        })
        .entry(b"run/fifo", EntryType::Fifo, b"", 0o600, b"", |_| {})
        .file("etc/ok", 0o644, b"ok")
        .finish();
    let info = env.import(&tar, "dev").unwrap();
    let t = env.tree("dev");
    assert_eq!(std::fs::read(t.join("etc/ok")).unwrap(), b"ok");
    if is_root() {
        let m = std::fs::symlink_metadata(t.join("dev/null")).unwrap();
        assert!(m.file_type().is_char_device());
        assert_eq!(m.rdev(), libc::makedev(1, 3));
        assert_eq!(m.mode() & 0o7777, 0o666);
        let m = std::fs::symlink_metadata(t.join("dev/loop9")).unwrap();
        assert!(m.file_type().is_block_device());
        assert_eq!(m.rdev(), libc::makedev(7, 9));
        assert!(std::fs::symlink_metadata(t.join("run/fifo")).unwrap().file_type().is_fifo());
        assert_eq!(info.entries, 4, "3 nodes and a file (implicit parents are not entries)");
    } else {
        assert_eq!(info.entries, 1, "nodes are skipped when not root");
        assert!(!t.join("dev/null").exists());
        assert!(!t.join("dev/loop9").exists());
        assert!(!t.join("run/fifo").exists());
    }
}

#[test]
fn later_entries_replace_earlier_ones() {
    let env = Env::new();
    let tar = Ar::new()
        .file("f", 0o644, b"one")
        .file("f", 0o600, b"two")
        .file("s", 0o644, b"file")
        .symlink("s", "target")
        .dir("d/", 0o755)
        .file("d", 0o644, b"was an empty dir")
        .symlink("l", "x")
        .dir("l/", 0o755)
        .file("l/in", 0o644, b"in")
        .finish();
    env.import(&tar, "r").unwrap();
    let t = env.tree("r");
    assert_eq!(std::fs::read(t.join("f")).unwrap(), b"two");
    assert_eq!(std::fs::metadata(t.join("f")).unwrap().mode() & 0o777, 0o600);
    assert_eq!(std::fs::read_link(t.join("s")).unwrap(), Path::new("target"));
    assert_eq!(std::fs::read(t.join("d")).unwrap(), b"was an empty dir");
    assert!(std::fs::symlink_metadata(t.join("l")).unwrap().is_dir());
    assert_eq!(std::fs::read(t.join("l/in")).unwrap(), b"in");

    let tar = Ar::new().file("d/child", 0o644, b"").file("d", 0o644, b"").finish();
    let e = err_of(env.import(&tar, "nonempty"));
    assert!(e.starts_with("cannot extract entry 2 (d): an earlier entry made it a non-empty directory"), "{e}");
    env.assert_clean_failure("nonempty");
}

// ---------------------------------------------------------------- hostile archives

#[test]
fn dotdot_escapes_are_refused() {
    let env = Env::new();
    for (i, p) in ["../escape", "a/../../escape", "./../sentinel/victim", "/../../x"].iter().enumerate() {
        let tar = Ar::new()
            .file("ok", 0o644, b"")
            .entry(p.as_bytes(), EntryType::Regular, b"", 0o644, b"pwned", |_| {})
            .finish();
        let name = format!("dotdot{i}");
        let e = err_of(env.import(&tar, &name));
        assert_eq!(e, format!("refusing archive: entry 2 ({p}) has a '..' component that leads outside the tree"));
        env.assert_clean_failure(&name);
    }
    // `..` that stays inside is applied lexically.
    let tar = Ar::new().file("a/../b", 0o644, b"b").finish();
    env.import(&tar, "inside").unwrap();
    assert_eq!(std::fs::read(env.tree("inside").join("b")).unwrap(), b"b");
    assert!(!env.tree("inside").join("a").exists());
}

#[test]
fn absolute_paths_are_rerooted() {
    let env = Env::new();
    let victim = format!("{}/victim", env.sentinel_str());
    let newfile = format!("{}/new", env.sentinel_str());
    let tar = Ar::new().file(&victim, 0o644, b"pwned").file(&newfile, 0o644, b"new").finish();
    env.import(&tar, "abs").unwrap();
    let rel = victim.trim_start_matches('/');
    assert_eq!(std::fs::read(env.tree("abs").join(rel)).unwrap(), b"pwned");
    env.remove_settled("abs").unwrap();
    env.assert_clean_failure("abs");
}

#[test]
fn symlinks_are_never_followed_while_extracting() {
    let env = Env::new();
    let s = env.sentinel_str().to_string();
    let depth = s.matches('/').count();
    let up = "../".repeat(depth + 3);
    let cases: Vec<(Vec<u8>, String)> = vec![
        // absolute symlink to the sentinel dir, then a write through it
        (Ar::new().symlink("a", &s).file("a/victim", 0o644, b"pwned").finish(), "a".into()),
        // a symlink to / and the sentinel path below it
        (Ar::new().symlink("root", "/").file(&format!("root{s}/victim"), 0o644, b"pwned").finish(), "root".into()),
        // relative symlink climbing out
        (Ar::new().symlink("up", &format!("{up}{}", &s[1..])).file("up/new", 0o644, b"pwned").finish(), "up".into()),
        // a directory created through the symlink
        (Ar::new().symlink("a", &s).dir("a/newdir/", 0o755).finish(), "a".into()),
        // a symlink created through the symlink
        (Ar::new().symlink("a", &s).symlink("a/victim", "/etc/passwd").finish(), "a".into()),
        // nested: symlink inside a real directory
        (Ar::new().dir("x/", 0o755).symlink("x/y", &s).file("x/y/victim", 0o644, b"pwned").finish(), "x/y".into()),
    ];
    for (i, (tar, via)) in cases.into_iter().enumerate() {
        let name = format!("sym{i}");
        let e = err_of(env.import(&tar, &name));
        assert!(e.starts_with("refusing archive: entry 2 (") || e.starts_with("refusing archive: entry 3 ("), "{e}");
        assert!(e.ends_with(&format!("goes through '{via}', which is a symlink; refusing to write through it")), "{e}");
        env.assert_clean_failure(&name);
    }
}

#[test]
fn a_later_file_replaces_a_symlink_instead_of_writing_through_it() {
    let env = Env::new();
    let victim = format!("{}/victim", env.sentinel_str());
    let tar = Ar::new().symlink("f", &victim).file("f", 0o644, b"new").finish();
    env.import(&tar, "rep").unwrap();
    let t = env.tree("rep");
    assert!(std::fs::symlink_metadata(t.join("f")).unwrap().is_file());
    assert_eq!(std::fs::read(t.join("f")).unwrap(), b"new");
    env.remove_settled("rep").unwrap();
    env.assert_clean_failure("rep");
}

#[test]
fn hard_links_must_stay_inside_the_tree() {
    let env = Env::new();
    let victim = format!("{}/victim", env.sentinel_str());
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            Ar::new().hardlink("shadow", "/etc/shadow").finish(),
            "is a hard link to '/etc/shadow', which is not in the archive",
        ),
        (Ar::new().hardlink("v", &victim).finish(), "which is not in the archive"),
        (
            Ar::new().hardlink("v", "../../../../../../../../etc/passwd").finish(),
            "has a '..' component that leads outside the tree",
        ),
        (
            Ar::new().symlink("s", env.sentinel_str()).hardlink("v", "s/victim").finish(),
            "is a hard link through 's', which is a symlink",
        ),
        (Ar::new().dir("d/", 0o755).hardlink("v", "d").finish(), "is a hard link to the directory 'd'"),
    ];
    for (i, (tar, want)) in cases.into_iter().enumerate() {
        let name = format!("hl{i}");
        let e = err_of(env.import(&tar, &name));
        assert!(e.starts_with("refusing archive: entry "), "{e}");
        assert!(e.contains(want), "{e}");
        env.assert_clean_failure(&name);
    }
    // A hard link to a symlink links the symlink itself, not its (outside) target.
    let tar = Ar::new().symlink("evil", &victim).hardlink("h", "evil").finish();
    env.import(&tar, "hlsym").unwrap();
    let m = std::fs::symlink_metadata(env.tree("hlsym").join("h")).unwrap();
    assert!(m.file_type().is_symlink());
    assert_eq!(m.nlink(), 2);
    env.remove_settled("hlsym").unwrap();
    env.assert_clean_failure("hlsym");
}

#[test]
fn nul_bytes_in_names() {
    let env = Env::new();
    let tar = Ar::new().entry(b"a\0b/../../../x", EntryType::Regular, b"", 0o644, b"", |_| {}).finish();
    // The header name ends at the NUL: "a" is written.
    env.import(&tar, "nul").unwrap();
    assert!(env.tree("nul").join("a").is_file());
    let tar = Ar::new().pax(&[("path", b"x\0/../../y")]).file("z", 0o644, b"").finish();
    let e = err_of(env.import(&tar, "nul2"));
    assert!(e.starts_with("refusing archive: entry 1"), "{e}");
    env.assert_clean_failure("nul2");
}

// ---------------------------------------------------------------- atomicity, errors

fn big_tar() -> Vec<u8> {
    let mut ar = Ar::new();
    for i in 0..200 {
        let data: Vec<u8> = (0..20_000u32).map(|x| (x.wrapping_mul(2_654_435_761) >> (i % 24)) as u8).collect();
        ar.file(&format!("d{}/f{i}", i % 10), 0o644, &data);
    }
    ar.finish()
}

#[test]
fn truncated_or_corrupt_input_leaves_nothing() {
    let env = Env::new();
    let tar = big_tar();
    let g = gz(&tar);
    let e = err_of(env.import(&g[..g.len() / 2], "trunc"));
    assert!(e.starts_with("corrupt archive: "), "{e}");
    assert!(e.contains(" at entry "), "{e}");
    env.assert_clean_failure("trunc");

    // Missing gzip trailer only: every tar byte is there, the CRC is not.
    let e = err_of(env.import(&g[..g.len() - 4], "trailer"));
    assert!(e.starts_with("corrupt archive: "), "{e}");
    env.assert_clean_failure("trailer");

    let mut bad = g.clone();
    let mid = bad.len() / 3;
    bad[mid] ^= 0x55;
    bad[mid + 1] ^= 0x55;
    let e = err_of(env.import(&bad, "flipped"));
    assert!(e.starts_with("corrupt archive: "), "{e}");
    env.assert_clean_failure("flipped");

    let z = zst(&tar);
    let e = err_of(env.import(&z[..z.len() / 2], "ztrunc"));
    assert!(e.starts_with("corrupt archive: "), "{e}");
    env.assert_clean_failure("ztrunc");

    // Plain tar cut inside the data of entry 3.
    let cut = 3 * (512 + 20_480) - 10_000;
    let e = err_of(env.import(&tar[..cut], "ptrunc"));
    assert_eq!(e, "corrupt archive: unexpected end of archive (truncated?) at entry 3 (d2/f2)");
    env.assert_clean_failure("ptrunc");

    // A damaged header.
    let mut bad = tar.clone();
    bad[512 + 20_480 + 5] ^= 1;
    let e = err_of(env.import(&bad, "hdr"));
    assert!(e.starts_with("corrupt archive: header checksum mismatch"), "{e}");
    assert!(e.ends_with("at entry 2 (after d0/f0)"), "{e}");
    env.assert_clean_failure("hdr");

    // The full archive imports fine afterwards.
    let info = env.import(&g, "trunc").unwrap();
    assert_eq!(info.entries, 200, "implicit parent directories are not entries");
    assert_eq!(info.size_bytes, 200 * 20_000);
}

#[test]
fn sparse_files_keep_their_holes() {
    let env = Env::new();
    let real: u64 = 8 << 30;
    let map = format!("2\n0\n4\n{}\n3\n", real - 3);
    let mut data = map.into_bytes();
    data.resize(512, 0);
    data.extend_from_slice(b"headend");
    let tar = Ar::new()
        .pax(&[
            ("GNU.sparse.major", b"1"),
            ("GNU.sparse.minor", b"0"),
            ("GNU.sparse.name", b"var/sparse.img"),
            ("GNU.sparse.realsize", real.to_string().as_bytes()),
        ])
        .entry(b"GNUSparseFile.0/sparse.img", EntryType::Regular, b"", 0o600, &data, |_| {})
        .finish();
    let info = env.import(&gz(&tar), "sparse").unwrap();
    let p = env.tree("sparse").join("var/sparse.img");
    let m = std::fs::metadata(&p).unwrap();
    assert_eq!(m.len(), real);
    assert!(m.blocks() * 512 < (1 << 20), "holes must stay holes: {} blocks", m.blocks());
    assert_eq!(info.size_bytes, 7);
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(&p).unwrap();
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, 0).unwrap();
    assert_eq!(&b, b"head");
    let mut b = [9u8; 3];
    f.read_exact_at(&mut b, real - 3).unwrap();
    assert_eq!(&b, b"end");
    f.read_exact_at(&mut b, 1 << 30).unwrap();
    assert_eq!(b, [0, 0, 0]);
}

/// A plain tar of one file of `size` zero bytes, generated as it is read.
struct LazyTar {
    head: Vec<u8>,
    pos: u64,
    total: u64,
}

impl LazyTar {
    fn new(size: u64) -> LazyTar {
        let mut h = Header::new_gnu();
        h.set_path("big").unwrap();
        h.set_size(size);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(MTIME);
        h.set_cksum();
        LazyTar { head: h.as_bytes().to_vec(), pos: 0, total: 512 + size.next_multiple_of(512) + 1024 }
    }
}

impl std::io::Read for LazyTar {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.total - self.pos) as usize;
        for (i, b) in buf[..n].iter_mut().enumerate() {
            let p = self.pos + i as u64;
            *b = if p < 512 { self.head[p as usize] } else { 0 };
        }
        self.pos += n as u64;
        Ok(n)
    }
}

#[test]
fn large_files_are_streamed_not_buffered() {
    // Peak RSS is per process: measure in a process of its own, not next to other tests.
    isolated("large_files_are_streamed_not_buffered", false, |dir| {
        let store = Store::new(&Home::new(dir.join("home")));
        let size: u64 = 128 << 20;
        let before = maxrss_kib();
        let info = store.import(&mut LazyTar::new(size), "big", &mut |_| {}).unwrap();
        let grew = maxrss_kib().saturating_sub(before);
        assert_eq!(info.size_bytes, size);
        assert_eq!(std::fs::metadata(store.dir().join("big/tree/big")).unwrap().len(), size);
        assert!(grew < 48 << 10, "peak RSS grew by {grew} KiB while importing a 128 MiB file");
    });
}

fn maxrss_kib() -> u64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::uninit();
    unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    unsafe { ru.assume_init() }.ru_maxrss as u64
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: mounts a small tmpfs")]
fn disk_full_is_reported_and_cleaned_up() {
    if !is_root() {
        return skip("needs root: mounts a small tmpfs");
    }
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let c = CString::new(mnt.as_os_str().as_bytes()).unwrap();
    let r = unsafe { libc::mount(c"tmpfs".as_ptr(), c.as_ptr(), c"tmpfs".as_ptr(), 0, c"size=2m".as_ptr().cast()) };
    if r != 0 {
        return skip(format!("cannot mount tmpfs: {}", std::io::Error::last_os_error()));
    }
    struct Umount(CString);
    impl Drop for Umount {
        fn drop(&mut self) {
            unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
        }
    }
    let _guard = Umount(c);
    let store = Store::new(&Home::new(&mnt));
    let tar = Ar::new().file("small", 0o644, b"x").file("big", 0o644, &vec![1u8; 4 << 20]).finish();
    let e = format!("{:#}", store.import(&mut &gz(&tar)[..], "full", &mut |_| {}).unwrap_err());
    let want_prefix = "no space left on device while importing 'full' (wrote ";
    assert!(e.starts_with(want_prefix), "{e}");
    assert!(e.ends_with(&format!(" bytes): free space under {}", store.dir().display())), "{e}");
    let names: Vec<_> = std::fs::read_dir(store.dir()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(names.is_empty(), "left behind: {names:?}");
}

// ---------------------------------------------------------------- leases, remove, gc

#[test]
fn a_lease_blocks_remove() {
    let env = Env::new();
    env.import(&simple_tar(), "base").unwrap();
    let lease = env.store.lease("base").unwrap();
    assert_eq!(lease.path(), env.tree("base"));
    assert_eq!(lease.info().name, "base");
    assert!(lease.path().join("etc/hostname").is_file());
    let second = env.store.lease("base").unwrap();
    assert_eq!(format!("{:#}", env.store.remove("base").unwrap_err()), "rootfs 'base' is in use by a running sandbox");
    drop(lease);
    assert_eq!(format!("{:#}", env.store.remove("base").unwrap_err()), "rootfs 'base' is in use by a running sandbox");
    drop(second);
    env.remove_settled("base").unwrap();
    assert!(env.store.list().unwrap().is_empty());
    assert_eq!(env.leftovers(), Vec::<String>::new());
    assert_eq!(
        format!("{:#}", env.store.lease("base").unwrap_err()),
        "unknown rootfs 'base': see `azp-sandbox rootfs list`"
    );
    assert_eq!(
        format!("{:#}", env.store.remove("base").unwrap_err()),
        "unknown rootfs 'base': see `azp-sandbox rootfs list`"
    );
}

#[test]
fn gc_removes_dead_imports_only() {
    let env = Env::new();
    env.import(&simple_tar(), "kept").unwrap();
    let dir = env.store.dir();
    // An import killed with SIGKILL: its temp dir, no lock holder.
    let dead = dir.join(".tmp-dead-999999-0123456789abcdef");
    std::fs::create_dir_all(dead.join("tree/usr/locked")).unwrap();
    std::fs::write(dead.join("tree/usr/locked/f"), b"x").unwrap();
    std::fs::set_permissions(dead.join("tree/usr/locked"), std::fs::Permissions::from_mode(0o000)).unwrap();
    // A removal killed half-way.
    let dead_rm = dir.join(".rm-old-999999-0123456789abcdef");
    std::fs::create_dir_all(dead_rm.join("tree")).unwrap();
    // A live import: its lock is held.
    let live = dir.join(".tmp-live-1-0123456789abcdef");
    std::fs::create_dir_all(live.join("tree")).unwrap();
    let live_fd = std::fs::File::open(&live).unwrap();
    assert_eq!(unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&live_fd), libc::LOCK_EX | libc::LOCK_NB) }, 0);

    let mut removed = env.store.gc().unwrap();
    removed.sort();
    assert_eq!(removed, vec![dead_rm.clone(), dead.clone()]);
    assert!(!dead.exists() && !dead_rm.exists());
    assert!(live.exists(), "a locked temp dir belongs to a live import");
    assert!(env.tree("kept").join("etc/hostname").exists());
    drop(live_fd);
    // Retried for a moment: a process another test thread forks meanwhile holds a copy of
    // the lock's fd until it execs (see `remove_settled`).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut removed = env.store.gc().unwrap();
    while removed.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        removed = env.store.gc().unwrap();
    }
    assert_eq!(removed, vec![live.clone()]);
    assert_eq!(env.store.gc().unwrap(), Vec::<PathBuf>::new());
    assert_eq!(env.store.list().unwrap().len(), 1);
}

// ---------------------------------------------------------------- layers (OCI)

fn layer_opts() -> UnpackOptions {
    UnpackOptions { oci_whiteouts: true, follow_symlinks_in_root: true, ..UnpackOptions::default() }
}

#[test]
fn layers_with_whiteouts() {
    let env = Env::new();
    let root = env.sentinel.parent().unwrap().join("layers");
    std::fs::create_dir(&root).unwrap();
    let l1 = Ar::new()
        .dir("usr/lib/", 0o755)
        .symlink("lib", "/usr/lib")
        .file("a/x", 0o644, b"x")
        .file("a/y", 0o644, b"y")
        .file("b/z", 0o644, b"z")
        .file("keep", 0o644, b"k")
        .finish();
    unpack(&l1[..], &root, &layer_opts()).unwrap();
    let l2 = Ar::new()
        .file("a/new", 0o644, b"n")
        .file("a/.wh..wh..opq", 0o644, b"")
        .file(".wh.b", 0o644, b"")
        .file("lib/libfoo.so", 0o644, b"so")
        .file(".wh.does-not-exist", 0o644, b"")
        .finish();
    let st = unpack(&l2[..], &root, &layer_opts()).unwrap();
    assert_eq!(st.whiteouts, 3);
    let mut a: Vec<_> = std::fs::read_dir(root.join("a")).unwrap().map(|e| e.unwrap().file_name()).collect();
    a.sort();
    assert_eq!(a, vec![std::ffi::OsString::from("new")], "opaque dir keeps only this layer's entries");
    assert!(!root.join("b").exists());
    assert!(root.join("keep").exists());
    assert_eq!(
        std::fs::read(root.join("usr/lib/libfoo.so")).unwrap(),
        b"so",
        "written through lib -> /usr/lib inside the tree"
    );
    assert!(std::fs::symlink_metadata(root.join("lib")).unwrap().file_type().is_symlink());

    // Whiteouts and writes never reach outside, even following symlinks in root.
    let s = env.sentinel_str();
    let l3 = Ar::new()
        .symlink("out", s)
        .file("out/.wh.victim", 0o644, b"")
        .symlink("top", "/")
        .file(&format!("top{s}/victim"), 0o644, b"inside")
        .finish();
    unpack(&l3[..], &root, &layer_opts()).unwrap();
    assert_eq!(std::fs::read(root.join(&s[1..]).join("victim")).unwrap(), b"inside");
    env.assert_clean_failure("none");
    let bad = Ar::new().file("../.wh.victim", 0o644, b"").finish();
    assert!(matches!(unpack(&bad[..], &root, &layer_opts()), Err(UnpackError::Hostile { .. })));
    // Without RESOLVE_IN_ROOT following, a whiteout through a symlink is refused.
    let strict = UnpackOptions { oci_whiteouts: true, ..UnpackOptions::default() };
    let l4 = Ar::new().symlink("out2", s).file("out2/.wh.victim", 0o644, b"").finish();
    let e = unpack(&l4[..], &root, &strict).unwrap_err().to_string();
    assert!(e.ends_with("goes through 'out2', which is a symlink; refusing to write through it"), "{e}");
    // A directory replaced by a symlink: cached directory fds must not be reused.
    let l5 = Ar::new().file("e/f", 0o644, b"").symlink("e", s).file("e/victim", 0o644, b"pwned").finish();
    let e = unpack(&l5[..], &root, &strict).unwrap_err().to_string();
    assert!(e.contains("(e/victim) goes through 'e', which is a symlink"), "{e}");
    env.assert_clean_failure("none");
}

#[test]
fn cancel_flag_stops_the_unpack() {
    static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);
    let tmp = tempfile::tempdir().unwrap();
    let opts = UnpackOptions { cancel: Some(&STOP), ..UnpackOptions::default() };
    let r = unpack(&simple_tar()[..], tmp.path(), &opts);
    assert!(matches!(r, Err(UnpackError::Interrupted)), "{r:?}");
}

// ---------------------------------------------------------------- real rootfs

#[test]
fn busybox_rootfs() {
    let bb = Path::new("/bin/busybox");
    if !bb.exists() {
        return skip("/bin/busybox not installed (apt-get install busybox-static)");
    }
    let env = Env::new();
    let body = std::fs::read(bb).unwrap();
    let mut ar = Ar::new();
    ar.dir("./", 0o755).dir("bin/", 0o755).file("bin/busybox", 0o755, &body);
    for applet in ["sh", "true", "echo", "ls", "cat"] {
        ar.symlink(&format!("bin/{applet}"), "busybox");
    }
    ar.dir("usr/local/cuda-12.4/", 0o755)
        .file("usr/local/cuda-12.4/version.json", 0o644, br#"{"cuda": {"name": "CUDA SDK", "version": "12.4.1"}}"#)
        .symlink("usr/local/cuda", "/usr/local/cuda-12.4")
        .dir("tmp/", 0o1777);
    let tar = ar.finish();
    let info = env.import(&zst(&tar), "bb").unwrap();
    let t = env.tree("bb");
    assert_eq!(std::fs::read_link(t.join("bin/sh")).unwrap(), Path::new("busybox"));
    assert_eq!(std::fs::read(t.join("bin/busybox")).unwrap(), body);
    let want_arch = match std::env::consts::ARCH {
        "x86" => "i386",
        "powerpc64" => "ppc64le",
        a => a,
    };
    assert_eq!(info.arch.as_deref(), Some(want_arch));
    assert_eq!(info.cuda_version.as_deref(), Some("12.4.1"));
    // The binary runs (mode and content intact); the applet comes from the symlink name.
    let out = std::process::Command::new(t.join("bin/echo")).arg("hello").output().unwrap();
    assert_eq!(out.stdout, b"hello\n");
    let listed = env.store.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].arch, info.arch);
    assert_eq!(listed[0].sha256, info.sha256);
    assert_eq!(listed[0].path, t);
}

// ---------------------------------------------------------------- as an ordinary user

/// Runs `body` in a process of its own (this test binary, re-run for just `test`), with a
/// fresh directory; with `nobody`, as uid/gid 65534 when running as root (so `body` sees
/// euid != 0; when not root it already is an ordinary user).
fn isolated(test: &str, nobody: bool, body: impl FnOnce(&Path)) {
    use std::os::unix::process::CommandExt;
    const DIR_ENV: &str = "AZP_ROOTFS_TEST_DIR";
    const TEST_ENV: &str = "AZP_ROOTFS_TEST";
    if std::env::var_os(TEST_ENV).is_some_and(|t| t == test) {
        let dir = std::env::var_os(DIR_ENV).expect("dir for the isolated test");
        body(Path::new(&dir));
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"]).env(TEST_ENV, test).env(DIR_ENV, tmp.path());
    if nobody && is_root() {
        std::os::unix::fs::chown(tmp.path(), Some(65534), Some(65534)).unwrap();
        cmd.uid(65534).gid(65534);
    }
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "isolated run of {test} failed:\n{text}");
    assert!(text.contains("1 passed"), "the child ran the test:\n{text}");
}

#[test]
fn unprivileged_import() {
    isolated("unprivileged_import", true, |dir| {
        assert_ne!(unsafe { libc::geteuid() }, 0);
        let store = Store::new(&Home::new(dir.join("home")));
        let tar = Ar::new()
            .dir("locked/", 0o000)
            .file("locked/inner", 0o600, b"x")
            .dir("locked/ro/", 0o555)
            .file("locked/ro/f", 0o444, b"y")
            .entry(b"owned", EntryType::Regular, b"", 0o4755, b"s", |h| h.set_uid(1234))
            .entry(b"dev/null", EntryType::Char, b"", 0o666, b"", |h| {
                h.set_device_major(1).unwrap();
                h.set_device_minor(3).unwrap();
            })
            .entry(b"fifo", EntryType::Fifo, b"", 0o600, b"", |_| {})
            .pax(&[("SCHILY.xattr.security.capability", b"\x01\x00\x00\x02")])
            .file("capped", 0o755, b"")
            .finish();
        let info = store.import(&mut &tar[..], "user", &mut |_| {}).unwrap();
        assert_eq!(info.entries, 6, "devices and fifos skipped, the rest written");
        let t = store.dir().join("user/tree");
        let md = |p: &str| std::fs::symlink_metadata(t.join(p)).unwrap();
        assert_eq!(md("locked").mode() & 0o7777, 0o000);
        assert_eq!(md("locked").mtime(), MTIME as i64);
        let me = unsafe { libc::geteuid() };
        assert_eq!(md("owned").uid(), me, "ownership is our own");
        assert_eq!(md("owned").mode() & 0o7777, 0o4755);
        assert!(!t.join("dev/null").exists() && !t.join("fifo").exists());
        assert!(t.join("capped").exists());
        // Contents of the mode-000 directory are there.
        std::fs::set_permissions(t.join("locked"), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(std::fs::read(t.join("locked/inner")).unwrap(), b"x");
        assert_eq!(md("locked/ro").mode() & 0o7777, 0o555);
        std::fs::set_permissions(t.join("locked"), std::fs::Permissions::from_mode(0o000)).unwrap();
        // Removal copes with the mode-000 and read-only directories.
        store.remove("user").unwrap();
        assert!(std::fs::read_dir(store.dir()).unwrap().next().is_none());
        // So does gc of a dead import holding the same tree.
        store.import(&mut &tar[..], "again", &mut |_| {}).unwrap();
        let dead = store.dir().join(".tmp-again-999999-0000000000000000");
        std::fs::rename(store.dir().join("again"), &dead).unwrap();
        assert_eq!(store.gc().unwrap(), vec![dead.clone()]);
        assert!(!dead.exists());
    });
}

//! Exhausting the disk on btrfs (issues 20, 25): where the home's filesystem is btrfs
//! with quotas enabled, each job's layer dir is a subvolume with a qgroup limit (see
//! `sys::btrfs`). The tests make a btrfs filesystem in a file (`mkfs.btrfs`, Debian's
//! btrfs-progs), loop-mount it, enable quotas and put a test home on it: a job writing
//! past `--disk` gets EDQUOT while the host writes on the same filesystem, two jobs keep
//! their own limits, and the subvolume and its qgroup are gone after the job, also after
//! `kill -9` of `exec` and a `gc`. Skipped visibly where the kernel has no btrfs or the
//! tools are missing. Rootless, no quota can be set (qgroup limits need CAP_SYS_ADMIN in
//! the initial user namespace): e07 checks that warning.

use super::*;

/// A btrfs filesystem in a file on a loop device, mounted (unmounted, the loop device
/// detached and the file removed on drop, also when a test fails).
pub(super) struct BtrfsFs {
    dir: PathBuf,
    pub(super) mnt: PathBuf,
    loop_dev: Option<String>,
}

impl BtrfsFs {
    /// `size_mb` of btrfs, with quotas enabled when `quota`. `commit=1`: the kernel
    /// drops deleted subvolumes (and then their qgroups) within seconds.
    pub(super) fn mount(size_mb: u64, quota: bool) -> Result<BtrfsFs, String> {
        let kernel = fs::read_to_string("/proc/filesystems").unwrap_or_default();
        if !kernel.lines().any(|l| l.split_whitespace().last() == Some("btrfs")) {
            return Err("this kernel has no btrfs (CONFIG_BTRFS_FS)".into());
        }
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique("disk-btrfs"));
        let (img, mnt) = (dir.join("fs.img"), dir.join("mnt"));
        fs::create_dir_all(&mnt).unwrap();
        let mut b = BtrfsFs { dir, mnt: mnt.clone(), loop_dev: None };
        fs::File::create(&img).unwrap().set_len(size_mb << 20).unwrap();
        match Command::new("mkfs.btrfs").arg("-q").arg(&img).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => return Err(format!("mkfs.btrfs failed: {}", String::from_utf8_lossy(&o.stderr).trim())),
            Err(e) => return Err(format!("no mkfs.btrfs ({e}): install btrfs-progs (scripts/setup.sh)")),
        }
        let o = Command::new("losetup").args(["--find", "--show"]).arg(&img).output().unwrap();
        if !o.status.success() {
            return Err(format!("no loop device: {}", String::from_utf8_lossy(&o.stderr).trim()));
        }
        let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
        b.loop_dev = Some(dev.clone());
        let o = Command::new("mount").args(["-t", "btrfs", "-o", "commit=1", &dev]).arg(&mnt).output().unwrap();
        if !o.status.success() {
            return Err(format!("mount -t btrfs {dev}: {}", String::from_utf8_lossy(&o.stderr).trim()));
        }
        if quota {
            b.btrfs(&["quota", "enable"]);
        }
        Ok(b)
    }

    /// `btrfs ARGS... MOUNTPOINT`, asserting success; its stdout.
    pub(super) fn btrfs(&self, args: &[&str]) -> String {
        let o = Command::new("btrfs").args(args).arg(&self.mnt).output().unwrap();
        assert!(o.status.success(), "btrfs {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The subvolumes that exist (not the deleted ones the kernel still drops).
    pub(super) fn subvolumes(&self) -> Vec<String> {
        self.btrfs(&["subvolume", "list"]).lines().map(str::to_string).collect()
    }

    /// The level-0 qgroups other than the top level's (0/5), from sysfs.
    pub(super) fn qgroups(&self) -> Vec<String> {
        let dev = self.loop_dev.as_deref().unwrap_or("").trim_start_matches("/dev/").to_string();
        let sysfs = fs::read_dir("/sys/fs/btrfs").unwrap().flatten().map(|e| e.path());
        let ours = sysfs.into_iter().find(|p| p.join("devices").join(&dev).exists()).expect("our fs in sysfs");
        let mut q: Vec<String> = fs::read_dir(ours.join("qgroups"))
            .map(|r| r.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        q.retain(|n| n.starts_with("0_") && n != "0_5");
        q.sort();
        q
    }

    /// Waits until the kernel has dropped every deleted subvolume (and, on kernels >=
    /// 6.10, their qgroups with them). `subvolume sync` returns once the subvolumes are
    /// dropped; their qgroups go in a transaction after that (`commit=1`, later on a busy
    /// machine), so the qgroups of subvolumes that no longer exist get up to 10 s more.
    /// What stays after that is left for the caller's assertion to show.
    pub(super) fn sync_deleted(&self) {
        self.btrfs(&["subvolume", "sync"]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            let live: Vec<String> = self
                .subvolumes()
                .iter()
                .filter_map(|l| l.split_whitespace().nth(1).map(|id| format!("0_{id}")))
                .collect();
            if self.qgroups().iter().all(|q| live.contains(q)) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for BtrfsFs {
    fn drop(&mut self) {
        let mounted =
            |m: &Path| fs::read_to_string("/proc/self/mountinfo").unwrap_or_default().contains(m.to_str().unwrap());
        let _ = Command::new("umount").arg(&self.mnt).output();
        if mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).output();
        }
        if let Some(dev) = &self.loop_dev {
            let _ = Command::new("losetup").args(["-d", dev]).output();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A test home on a fresh btrfs with quotas, with the escape rootfs.
fn btrfs_home(fs: &BtrfsFs) -> TestHome {
    let h = TestHome { dir: fs.mnt.join("home") };
    fs::create_dir_all(&h.dir).unwrap();
    h.import(&escape_tar(), "esc");
    h
}

/// Fills `/fill` (or `path`) with 200 MiB; prints the error dd stopped with and the MiB
/// written.
fn fill(path: &str) -> String {
    format!(
        "dd if=/dev/zero of={path} bs=1M count=200 2>&1 | grep -oE 'Disk quota exceeded|No space left on device' \
         | head -1; sync; echo wrote=$(( $(wc -c < {path}) >> 20 ))M"
    )
}

/// The MiB a [`fill`] wrote, and the error it stopped with.
fn written(out: &str) -> (u64, String) {
    let mb = out.lines().find_map(|l| l.strip_prefix("wrote=")?.strip_suffix('M')?.parse().ok()).unwrap_or(u64::MAX);
    (mb, out.lines().next().unwrap_or("").to_string())
}

fn assert_stopped_at(what: &str, out: &str, limit_mb: u64) {
    let (mb, err) = written(out);
    assert!(err == "Disk quota exceeded" || err == "No space left on device", "{what}: stopped by its quota: {out}");
    // At most the limit; well past half of it (a qgroup counts data and some metadata).
    assert!(mb <= limit_mb && mb >= limit_mb / 2, "{what}: wrote {mb} MiB with a {limit_mb} MiB limit: {out}");
    eprintln!("{what}: the job wrote {mb} MiB of its {limit_mb} MiB quota, then \"{err}\"");
}

/// Runs `exec` in the background, its output captured.
fn spawn_exec(h: &TestHome, opts: &[&str], script: &str) -> std::process::Child {
    h.command()
        .args(["-v", "exec", "--rootfs", "esc"])
        .args(opts)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn skip_rootless() -> bool {
    if rootless() {
        skip_part("rootless: no disk quota can be set (e07 checks the warning)");
    }
    rootless()
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn d01_btrfs_a_job_past_its_qgroup_gets_edquot_while_the_host_writes_on() {
    require_root!();
    if skip_rootless() {
        return;
    }
    let bfs = or_skip!(BtrfsFs::mount(1024, true));
    let h = btrfs_home(&bfs);
    let name = unique("dsk-fill");
    // The host writes 64 MiB on the same filesystem while the job fills its quota.
    let host_file = bfs.mnt.join(format!("host-{name}"));
    let writer = {
        let host_file = host_file.clone();
        std::thread::spawn(move || fs::write(&host_file, vec![7u8; 64 << 20]))
    };
    let o = spawn_exec(&h, &["--name", &name, "--disk", "64M"], &fill("/fill")).wait_with_output().unwrap();
    writer.join().unwrap().expect("the host's own write on the same filesystem");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}\n{err}");
    assert_stopped_at("--disk 64M", &out, 64);
    assert_eq!(fs::metadata(&host_file).unwrap().len(), 64 << 20, "the host wrote all of it");
    // The job's log line: its limit's mechanism and what it used.
    let line = err.lines().find(|l| l.contains(&format!("job {name}"))).unwrap_or_else(|| panic!("no job line: {err}"));
    assert!(line.contains("disk 64.0M (btrfs qgroup)"), "{line}");
    assert!(line.contains("disk quota REACHED") || line.contains("disk used "), "{line}");
    eprintln!("log line: {}", line.trim());
    // Gone with the job: the subvolume at once, its qgroup once the kernel dropped it.
    h.assert_no_residue(&[&name]);
    assert_eq!(bfs.subvolumes(), Vec::<String>::new(), "the job's subvolume is deleted");
    bfs.sync_deleted();
    assert_eq!(bfs.qgroups(), Vec::<String>::new(), "the job's qgroup is gone (kernel >= 6.10 drops it)");
    std::mem::forget(h); // its dir is on the image: the guard unmounts it
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn d02_btrfs_two_jobs_at_once_each_keep_their_own_limit() {
    require_root!();
    if skip_rootless() {
        return;
    }
    let bfs = or_skip!(BtrfsFs::mount(1024, true));
    let h = btrfs_home(&bfs);
    let (a, b) = (unique("dsk-a"), unique("dsk-b"));
    // Both write while the other does: each waits for the other's subvolume first.
    let both = |me: &str| format!("sleep 1; {}", fill(&format!("/fill-{me}")));
    let ja = spawn_exec(&h, &["--name", &a, "--disk", "32M"], &both("a"));
    let jb = spawn_exec(&h, &["--name", &b, "--disk", "96M"], &both("b"));
    let (oa, ob) = (ja.wait_with_output().unwrap(), jb.wait_with_output().unwrap());
    assert!(oa.status.success() && ob.status.success(), "{oa:?} {ob:?}");
    assert_stopped_at("job A, --disk 32M", &String::from_utf8_lossy(&oa.stdout), 32);
    assert_stopped_at("job B, --disk 96M", &String::from_utf8_lossy(&ob.stdout), 96);
    let (wa, _) = written(&String::from_utf8_lossy(&oa.stdout));
    let (wb, _) = written(&String::from_utf8_lossy(&ob.stdout));
    assert!(wb > wa + 32, "B's limit is its own, not A's: A {wa} MiB, B {wb} MiB");
    h.assert_no_residue(&[&a, &b]);
    bfs.sync_deleted();
    assert_eq!((bfs.subvolumes(), bfs.qgroups()), (vec![], vec![]));
    std::mem::forget(h);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn d03_btrfs_kill_9_of_exec_then_gc_leaves_no_subvolume_or_qgroup() {
    require_root!();
    if skip_rootless() {
        return;
    }
    let bfs = or_skip!(BtrfsFs::mount(1024, true));
    let h = btrfs_home(&bfs);
    let name = unique("dsk-kill");
    let mut job =
        spawn_exec(&h, &["--name", &name, "--disk", "64M"], "dd if=/dev/zero of=/f bs=1M count=16; sleep 600");
    let until = Instant::now() + Duration::from_secs(60);
    while bfs.subvolumes().is_empty() {
        assert!(Instant::now() < until, "no subvolume for the job after 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(bfs.qgroups().len(), 1, "the running job has its qgroup: {:?}", bfs.qgroups());
    job.kill().unwrap(); // SIGKILL
    let _ = job.wait();
    let o = h.command().arg("gc").output().unwrap();
    assert!(o.status.success(), "gc: {}", String::from_utf8_lossy(&o.stderr));
    h.assert_no_residue(&[&name]);
    assert_eq!(bfs.subvolumes(), Vec::<String>::new(), "gc deleted the subvolume");
    bfs.sync_deleted();
    assert_eq!(bfs.qgroups(), Vec::<String>::new(), "and its qgroup went with it");
    std::mem::forget(h);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn d04_btrfs_without_quotas_says_the_fix_in_one_line() {
    require_root!();
    if skip_rootless() {
        return;
    }
    let bfs = or_skip!(BtrfsFs::mount(256, false));
    let h = btrfs_home(&bfs);
    let o = exec(&h, &["--disk", "32M"], "true");
    assert_eq!(o.code, 0, "{}", o.err);
    let line = o.err.lines().find(|l| l.contains("cannot be enforced")).unwrap_or_else(|| panic!("{}", o.err));
    assert!(line.contains("btrfs quota enable"), "{line}");
    assert_eq!(bfs.subvolumes(), Vec::<String>::new(), "no subvolume without quotas: a plain dir");
    std::mem::forget(h);
}

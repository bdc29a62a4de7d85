//! Leases of the reserved range's blocks (root and setuid modes): a sandbox holds one
//! from its creation until its clean-up is done, so no two live jobs ever share host ids
//! (the slot's next sandbox, prepared while the current job runs, holds its own).
//!
//! One file per block in a root-only dir of the runtime tmpfs, locked (`flock`) by the
//! holder, and naming the holder's job record. The kernel drops the lock when the holder
//! dies, but its job may outlive it until `gc` kills it and removes the record: a block
//! whose file names a record that still exists stays taken until then. Homes share the
//! dir (the range is the host's), so two `run`s never hand out one block twice.

use anyhow::{bail, Context, Result};
use nix::fcntl::Flock;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Where the lease files live (root: the runtime tmpfs, see [`crate::sys::runtime_tmpfs`]).
pub const DIR: &str = "/run/azp-sandbox/id-blocks";

/// Block `index`, held until dropped.
#[derive(Debug)]
pub struct BlockLease {
    pub index: u32,
    file: Flock<File>,
}

impl std::os::fd::AsRawFd for BlockLease {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }
}

impl Drop for BlockLease {
    fn drop(&mut self) {
        // Free for the next job: no holder named (the lock goes with the file).
        let _ = self.file.set_len(0);
    }
}

/// The first free block of `blocks`, for the job whose record is `holder`.
pub fn lease(dir: &Path, blocks: u32, holder: &Path) -> Result<BlockLease> {
    if let Err(e) = std::fs::DirBuilder::new().mode(0o700).create(dir) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(e).with_context(|| format!("cannot create {}", dir.display()));
        }
    }
    for index in 0..blocks {
        if let Some(lease) = try_lease(dir, index, holder)? {
            return Ok(lease);
        }
    }
    bail!(
        "all {blocks} blocks of host ids of the azp-sandbox range are taken (by running jobs, or by jobs `azp-sandbox gc` \
         has not cleaned up yet): enlarge the azp-sandbox entry of /etc/subuid and /etc/subgid"
    )
}

fn try_lease(dir: &Path, index: u32, holder: &Path) -> Result<Option<BlockLease>> {
    let path = dir.join(index.to_string());
    let Some(mut file) = crate::lock_file::try_lock(&path)? else { return Ok(None) };
    let mut previous = String::new();
    file.read_to_string(&mut previous).with_context(|| format!("cannot read {}", path.display()))?;
    if !previous.is_empty() && Path::new(&previous).exists() {
        // Its holder died, but its job's record (and maybe processes) are still there.
        return Ok(None);
    }
    file.set_len(0).and_then(|()| file.rewind()).with_context(|| format!("cannot reset {}", path.display()))?;
    file.write_all(holder.as_os_str().as_encoded_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(Some(BlockLease { index, file }))
}

/// For `gc`, once it removed the record `holder`: block `index` is free again when its
/// file still names that record and nobody holds it.
pub fn forget(dir: &Path, index: u32, holder: &Path) {
    let Some(lease) = try_lease(dir, index, holder).ok().flatten() else { return };
    drop(lease);
}

/// The record a block's file names (tests, `status`).
pub fn holder(dir: &Path, index: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(dir.join(index.to_string())).ok()?;
    (!text.is_empty()).then(|| PathBuf::from(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_leases_get_different_blocks_and_dropped_ones_come_back() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("blocks");
        let rec = |n: &str| t.path().join(n);
        let a = lease(&dir, 3, &rec("a")).unwrap();
        let b = lease(&dir, 3, &rec("b")).unwrap();
        assert_eq!((a.index, b.index), (0, 1));
        assert_eq!(holder(&dir, 0), Some(rec("a")));
        drop(a);
        assert_eq!(holder(&dir, 0), None, "freed");
        let c = lease(&dir, 3, &rec("c")).unwrap();
        assert_eq!(c.index, 0);
        let _d = lease(&dir, 3, &rec("d")).unwrap();
        let e = lease(&dir, 3, &rec("e")).unwrap_err().to_string();
        assert!(e.contains("all 3 blocks") && e.contains("enlarge"), "{e}");
        drop(b);
    }

    #[test]
    fn a_block_whose_dead_holder_left_its_record_stays_taken_until_gc() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("blocks");
        let record = t.path().join("jobs/x");
        std::fs::create_dir_all(&record).unwrap();
        // A holder that died: the file names its record, nobody holds the lock.
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("0"), record.as_os_str().as_encoded_bytes()).unwrap();
        let next = lease(&dir, 2, &t.path().join("jobs/y")).unwrap();
        assert_eq!(next.index, 1, "block 0 may still have the dead job's processes");
        forget(&dir, 0, &record);
        assert_eq!(holder(&dir, 0), Some(record.clone()), "gc forgets a block only once the record is gone");
        std::fs::remove_dir(&record).unwrap();
        assert_eq!(lease(&dir, 2, &t.path().join("jobs/z")).unwrap().index, 0);
    }
}

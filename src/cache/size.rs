//! The disk space a cache tree takes (for `max_size`, `cache ls` and what gc frees).

use anyhow::Result;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Bytes of the files of a tree, each inode once (snapshots share files by link).
pub fn tree_size(dir: &Path) -> Result<u64> {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d)? {
            let e = e?;
            let m = e.metadata()?;
            if m.is_dir() {
                stack.push(e.path());
            } else if seen.insert(m.ino()) {
                total += m.blocks() * 512;
            }
        }
    }
    Ok(total)
}

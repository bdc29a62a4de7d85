//! What a rootfs tree holds, as the store records it (`entries`, `size_bytes`), the same
//! whichever way the tree was made (imported, pulled, built from a recipe).

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Entries below `dir` (not `dir` itself) and bytes of regular files, a file with several
/// hard links counted once (it takes its space once), symlinks not followed.
pub fn tree_size(dir: &Path) -> (u64, u64) {
    let (mut entries, mut bytes) = (0u64, 0u64);
    let mut seen = HashSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            entries += 1;
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                if let Ok(m) = e.metadata() {
                    if m.nlink() <= 1 || seen.insert((m.dev(), m.ino())) {
                        bytes += m.len();
                    }
                }
            }
        }
    }
    (entries, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hard_links_count_once_and_symlinks_are_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path();
        std::fs::create_dir_all(t.join("usr/bin")).unwrap();
        std::fs::write(t.join("usr/bin/perl"), vec![1u8; 1000]).unwrap();
        std::fs::hard_link(t.join("usr/bin/perl"), t.join("usr/bin/perl5.36.0")).unwrap();
        std::fs::hard_link(t.join("usr/bin/perl"), t.join("perl-again")).unwrap();
        std::fs::write(t.join("usr/bin/other"), vec![2u8; 10]).unwrap();
        std::os::unix::fs::symlink("/usr/bin", t.join("bin")).unwrap();
        std::os::unix::fs::symlink(t.join("usr"), t.join("loop")).unwrap();
        // usr, usr/bin, perl, perl5.36.0, perl-again, other, bin, loop
        assert_eq!(tree_size(t), (8, 1010));
        assert_eq!(tree_size(&t.join("nonexistent")), (0, 0));
    }
}

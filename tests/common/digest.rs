//! SHA-256 and hex for tests and benches, written apart from the library's own
//! (`azp_sandbox::digest`) so that a test checks the library's digests against an
//! independent spelling of them.
#![allow(dead_code)]

use sha2::{Digest, Sha256};
use std::path::Path;

/// Lower-case hex of `bytes`.
pub fn hex(bytes: impl AsRef<[u8]>) -> String {
    bytes.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    hex(Sha256::digest(bytes))
}

/// Lower-case hex SHA-256 of the file at `p`.
pub fn sha256_file(p: &Path) -> String {
    let mut h = Sha256::new();
    let mut f = std::fs::File::open(p).unwrap_or_else(|e| panic!("cannot open {}: {e}", p.display()));
    std::io::copy(&mut f, &mut h).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
    hex(h.finalize())
}

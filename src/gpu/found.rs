//! What driver discovery finds on the host: libraries, binaries, firmware and sockets,
//! each with where it was found. Its own file so that discovery (driver.rs) and the
//! graphics files' discovery (graphics.rs), which reads the libraries found, both depend
//! on it rather than on each other.

use serde::Serialize;
use std::fmt;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum LibGroup {
    Utility,
    Compute,
    Video,
    Graphics,
}

impl fmt::Display for LibGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LibGroup::Utility => "utility",
            LibGroup::Compute => "compute",
            LibGroup::Video => "video",
            LibGroup::Graphics => "graphics",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Library {
    pub group: LibGroup,
    /// Base name: `libcuda`.
    pub name: String,
    /// Real file name: `libcuda.so.535.309.01`.
    pub file_name: String,
    /// DT_SONAME: `libcuda.so.1` (equal to `file_name` for e.g. libnvidia-pkcs11-openssl3).
    pub soname: String,
    /// Host path of the real file (symlinks resolved inside the driver root).
    pub host_path: PathBuf,
    /// How it was found: `ld.so.cache (libcuda.so.1 => /usr/lib/x86_64-linux-gnu/libcuda.so.1)`.
    pub found_via: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Binary {
    pub group: LibGroup,
    pub name: String,
    /// Host path of the real file.
    pub host_path: PathBuf,
    /// Path inside the driver root where it was found (`/usr/bin/nvidia-smi`).
    pub found_at: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FirmwareFile {
    pub host_path: PathBuf,
    pub container_path: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Socket {
    pub name: String,
    pub host_path: PathBuf,
    pub container_path: PathBuf,
}

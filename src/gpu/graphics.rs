//! The `graphics` and `display` capabilities beyond libraries: the loaders' vendor/ICD
//! JSON files (glvnd EGL vendors, EGL external platforms, Vulkan ICD and layers), the
//! OptiX data file and, for `display`, the Xorg driver module, the GLX server extension
//! and the Xorg configuration snippets. The list follows what nvidia-container-toolkit
//! mounts for these capabilities (`internal/discover/graphics.go`).
//!
//! A loader JSON file names its library (`"library_path": "libEGL_nvidia.so.0"`). Missing
//! EGL/Vulkan files are the top graphics complaint against Apptainer and the toolkit
//! (apptainer#2210, nvidia-docker#1011), and a file naming a library the sandbox does not
//! have is as bad: loaders then fail or fall back to software rendering. So a file is
//! only kept when every library it names is one of the discovered driver libraries, and
//! the name must then resolve inside the sandbox: a bare SONAME through the sandbox's
//! linker cache (the driver libraries are in it), an absolute path by binding the library
//! at that path as well.

use super::found::Library;
use super::paths::{host_path, resolve_in_root};
use super::{split_so_name, Missing};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Which capability brings a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum FileCap {
    /// `graphics` (and `display`, which needs the graphics stack too).
    Graphics,
    /// `display` only: what an X server inside the sandbox needs.
    Display,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum FileKind {
    /// A loader's vendor/ICD/layer JSON file.
    LoaderJson,
    /// Data read by a driver library (`nvoptix.bin`).
    Data,
    /// An Xorg module (`nvidia_drv.so`, `libglxserver_nvidia.so`).
    XorgModule,
    /// An `xorg.conf.d` snippet.
    XorgConf,
}

impl FileKind {
    pub fn describe(&self) -> &'static str {
        match self {
            FileKind::LoaderJson => "loader JSON file",
            FileKind::Data => "data file",
            FileKind::XorgModule => "Xorg module",
            FileKind::XorgConf => "Xorg configuration",
        }
    }
}

/// A library named by a loader JSON file, and the driver library it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LibraryRef {
    /// `library_path` as written in the file.
    pub written: String,
    /// Base name of the driver library it resolves to (`libEGL_nvidia`).
    pub library: String,
    /// Container path where the library must also be bound, when `written` is a path
    /// (the sandbox has the driver libraries in [`super::inject::LIB_DIR`] only).
    pub bind_at: Option<PathBuf>,
}

/// One non-library file of the graphics/display capabilities.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DriverFile {
    pub cap: FileCap,
    pub kind: FileKind,
    /// Host path of the real file.
    pub host_path: PathBuf,
    /// Where the sandbox gets it: where it was found inside the driver root.
    pub container_path: PathBuf,
    /// For loader JSON files: the libraries they name (all resolved).
    pub libraries: Vec<LibraryRef>,
}

/// Where the loaders look for their JSON files (and the toolkit for configuration).
pub const CONFIG_DIRS: &[&str] = &["/etc", "/usr/share", "/usr/local/share"];

/// Graphics files, relative to a [`CONFIG_DIRS`] entry. `{arch}` is the machine name
/// (RPM packages install `nvidia_icd.x86_64.json`).
const GRAPHICS_FILES: &[(&str, FileKind)] = &[
    ("glvnd/egl_vendor.d/10_nvidia.json", FileKind::LoaderJson),
    ("egl/egl_external_platform.d/10_nvidia_wayland.json", FileKind::LoaderJson),
    ("egl/egl_external_platform.d/15_nvidia_gbm.json", FileKind::LoaderJson),
    ("egl/egl_external_platform.d/20_nvidia_xcb.json", FileKind::LoaderJson),
    ("egl/egl_external_platform.d/20_nvidia_xlib.json", FileKind::LoaderJson),
    ("vulkan/icd.d/nvidia_icd.json", FileKind::LoaderJson),
    ("vulkan/icd.d/nvidia_icd.{arch}.json", FileKind::LoaderJson),
    ("vulkan/icd.d/nvidia_layers.json", FileKind::LoaderJson),
    ("vulkan/implicit_layer.d/nvidia_layers.json", FileKind::LoaderJson),
    ("nvidia/nvoptix.bin", FileKind::Data),
];

const DISPLAY_CONFS: &[&str] = &["X11/xorg.conf.d/10-nvidia.conf", "X11/xorg.conf.d/nvidia-drm-outputclass.conf"];

/// Xorg module dirs, inside the driver root (Debian/Ubuntu, then RHEL/SUSE layouts).
const XORG_MODULE_DIRS: &[&str] = &[
    "/usr/lib/xorg/modules",
    "/usr/lib64/xorg/modules",
    "/usr/lib/xorg/modules/updates",
    "/usr/lib64/xorg/modules/updates",
];

/// The graphics/display files of the driver at `root` (`version`: the driver version;
/// `libraries`: the discovered driver libraries). Absent files are not errors: most
/// compute nodes have none of them; they are listed in the returned [`Missing`] (as
/// optional) so `gpu list` shows why `graphics` gives no EGL/Vulkan.
pub fn discover(root: &Path, version: Option<&str>, libraries: &[Library]) -> (Vec<DriverFile>, Vec<Missing>) {
    let mut files = Vec::new();
    let mut missing = Vec::new();
    let arch = std::env::consts::ARCH;
    for (rel, kind) in GRAPHICS_FILES {
        let rel = rel.replace("{arch}", arch);
        let Some((found_at, host)) = find_config(root, &rel) else {
            if !rel.contains(arch) && !rel.starts_with("egl/egl_external_platform.d/2") {
                missing.push(Missing {
                    item: format!("{rel} (graphics, optional)"),
                    why: format!("not in {} under {}", CONFIG_DIRS.join(", "), root.display()),
                });
            }
            continue;
        };
        let libs = if *kind == FileKind::LoaderJson {
            match loader_libraries(root, &found_at, &host, libraries) {
                Ok(l) => l,
                Err(why) => {
                    missing.push(Missing { item: format!("{} (graphics)", found_at.display()), why });
                    continue;
                }
            }
        } else {
            Vec::new()
        };
        files.push(DriverFile {
            cap: FileCap::Graphics,
            kind: *kind,
            host_path: host,
            container_path: found_at,
            libraries: libs,
        });
    }
    for rel in DISPLAY_CONFS {
        if let Some((found_at, host)) = find_config(root, rel) {
            files.push(DriverFile {
                cap: FileCap::Display,
                kind: FileKind::XorgConf,
                host_path: host,
                container_path: found_at,
                libraries: Vec::new(),
            });
        }
    }
    for (sub, name) in [("drivers", "nvidia_drv.so"), ("extensions", "libglxserver_nvidia.so")] {
        let found = XORG_MODULE_DIRS.iter().find_map(|d| {
            let at = Path::new(d).join(sub).join(name);
            let real = resolve_in_root(root, &at).ok()?;
            let host = host_path(root, &real);
            host.is_file().then_some((at, real, host))
        });
        match found {
            // The GLX extension must be the running driver's (it talks to its libraries).
            Some((at, real, _)) if name.starts_with("libglxserver") && !of_version(&real, version) => {
                missing.push(Missing {
                    item: format!("{} (display)", at.display()),
                    why: format!("resolves to {}, not of the driver version", real.display()),
                })
            }
            Some((at, _, host)) => files.push(DriverFile {
                cap: FileCap::Display,
                kind: FileKind::XorgModule,
                host_path: host,
                container_path: at,
                libraries: Vec::new(),
            }),
            None => missing.push(Missing {
                item: format!("{name} (display, optional)"),
                why: format!("not in {} under {}", XORG_MODULE_DIRS.join(", "), root.display()),
            }),
        }
    }
    (files, missing)
}

/// `rel` under the first config dir that has it: (in-root path, host path of the real file).
fn find_config(root: &Path, rel: &str) -> Option<(PathBuf, PathBuf)> {
    CONFIG_DIRS.iter().find_map(|d| {
        let at = Path::new(d).join(rel);
        let real = resolve_in_root(root, &at).ok()?;
        let host = host_path(root, &real);
        host.is_file().then_some((at, host))
    })
}

fn of_version(real: &Path, version: Option<&str>) -> bool {
    let file = real.file_name().and_then(|f| f.to_str()).unwrap_or_default();
    match (split_so_name(file), version) {
        (Some((_, v)), Some(want)) => v == want,
        _ => false,
    }
}

/// The libraries a loader JSON file at `found_at` names, each resolved to a driver library;
/// `Err(why)` when the file is unreadable or names something else.
fn loader_libraries(
    root: &Path,
    found_at: &Path,
    host: &Path,
    libraries: &[Library],
) -> Result<Vec<LibraryRef>, String> {
    let text = std::fs::read(host).map_err(|e| format!("cannot read {}: {e}", host.display()))?;
    let written = library_paths(&text).map_err(|e| format!("not a loader JSON file ({e}): not injected"))?;
    if written.is_empty() {
        return Err("names no library_path: not injected".into());
    }
    let mut out = Vec::new();
    for w in written {
        let r = resolve_library(root, found_at, &w, libraries).ok_or_else(|| {
            format!("names {w}, which is not one of the driver libraries found (of this driver version): not injected")
        })?;
        out.push(r);
    }
    Ok(out)
}

/// Every `library_path` string in a loader JSON file (EGL vendor/platform: `ICD`, Vulkan:
/// `ICD`, `layer`, `layers[]`).
pub fn library_paths(json: &[u8]) -> Result<Vec<String>, serde_json::Error> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("library_path", serde_json::Value::String(s)) => out.push(s.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let v: serde_json::Value = serde_json::from_slice(json)?;
    let mut out = Vec::new();
    walk(&v, &mut out);
    Ok(out)
}

/// A `library_path` as the loaders read it: a bare name goes through the linker (it must
/// be a driver library's SONAME or file name), a path is absolute or relative to the JSON
/// file's dir (Vulkan loader rules) and must lead to a driver library's file.
pub fn resolve_library(root: &Path, json_at: &Path, written: &str, libraries: &[Library]) -> Option<LibraryRef> {
    if !written.contains('/') {
        let lib = libraries.iter().find(|l| l.soname == written || l.file_name == written)?;
        return Some(LibraryRef { written: written.into(), library: lib.name.clone(), bind_at: None });
    }
    let path = match Path::new(written) {
        p if p.is_absolute() => p.to_path_buf(),
        p => json_at.parent().unwrap_or(Path::new("/")).join(p),
    };
    let real = resolve_in_root(root, &path).ok()?;
    let host = host_path(root, &real);
    let lib = libraries.iter().find(|l| l.host_path == host)?;
    // The sandbox path as the loader will open it, `..` folded the way the kernel would
    // after the bind (the dirs on the way exist in the sandbox's tree or are created).
    let bind_at = normalize(&path);
    Some(LibraryRef { written: written.into(), library: lib.name.clone(), bind_at: Some(bind_at) })
}

fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::LibGroup;

    fn lib(root: &Path, name: &str, soname: &str, dir: &str) -> Library {
        let file_name = format!("{name}.so.550.54.15");
        Library {
            group: LibGroup::Graphics,
            name: name.into(),
            file_name: file_name.clone(),
            soname: soname.into(),
            host_path: root.join(dir.trim_start_matches('/')).join(file_name),
            found_via: "test".into(),
        }
    }

    #[test]
    fn library_paths_of_egl_and_vulkan_files() {
        let egl = br#"{"file_format_version":"1.0.0","ICD":{"library_path":"libEGL_nvidia.so.0"}}"#;
        assert_eq!(library_paths(egl).unwrap(), vec!["libEGL_nvidia.so.0"]);
        let layers = br#"{"file_format_version":"1.1.2","layers":[{"name":"a","library_path":"libGLX_nvidia.so.0"},
            {"name":"b","library_path":"/usr/lib/x/libb.so"}]}"#;
        assert_eq!(library_paths(layers).unwrap(), vec!["libGLX_nvidia.so.0", "/usr/lib/x/libb.so"]);
        assert!(library_paths(b"{").is_err());
        assert!(library_paths(br#"{"ICD":{"api_version":"1.3"}}"#).unwrap().is_empty());
    }

    #[test]
    fn files_are_kept_only_when_their_library_is_a_driver_library() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        let dir = "usr/lib/x86_64-linux-gnu";
        std::fs::create_dir_all(r.join(dir)).unwrap();
        let egl = lib(r, "libEGL_nvidia", "libEGL_nvidia.so.0", dir);
        let glx = lib(r, "libGLX_nvidia", "libGLX_nvidia.so.0", dir);
        std::fs::write(&glx.host_path, b"elf").unwrap();
        let write = |rel: &str, body: &str| {
            let p = r.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        };
        // Bare SONAME: found through the linker cache inside.
        write("usr/share/glvnd/egl_vendor.d/10_nvidia.json", r#"{"ICD":{"library_path":"libEGL_nvidia.so.0"}}"#);
        // Absolute path: bound there as well.
        write(
            "etc/vulkan/icd.d/nvidia_icd.json",
            r#"{"ICD":{"library_path":"/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.550.54.15"}}"#,
        );
        // A library that is not the driver's: left out, and said why.
        write(
            "usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
            r#"{"ICD":{"library_path":"libnvidia-egl-wayland.so.1"}}"#,
        );
        // Not JSON: left out.
        write("usr/share/vulkan/implicit_layer.d/nvidia_layers.json", "garbage");
        write("usr/share/nvidia/nvoptix.bin", "data");
        let (files, missing) = discover(r, Some("550.54.15"), &[egl.clone(), glx.clone()]);
        type Refs = Vec<(String, String, Option<PathBuf>)>;
        let got: Vec<(String, FileKind, Refs)> = files
            .iter()
            .map(|f| {
                (
                    f.container_path.display().to_string(),
                    f.kind,
                    f.libraries.iter().map(|l| (l.written.clone(), l.library.clone(), l.bind_at.clone())).collect(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json".to_string(),
                    FileKind::LoaderJson,
                    vec![("libEGL_nvidia.so.0".to_string(), "libEGL_nvidia".to_string(), None)]
                ),
                (
                    "/etc/vulkan/icd.d/nvidia_icd.json".to_string(),
                    FileKind::LoaderJson,
                    vec![(
                        "/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.550.54.15".to_string(),
                        "libGLX_nvidia".to_string(),
                        Some(PathBuf::from("/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.550.54.15"))
                    )]
                ),
                ("/usr/share/nvidia/nvoptix.bin".to_string(), FileKind::Data, vec![]),
            ]
        );
        let why = |item: &str| missing.iter().find(|m| m.item == item).map(|m| m.why.clone()).unwrap_or_default();
        assert!(
            why("/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json (graphics)")
                .contains("names libnvidia-egl-wayland.so.1, which is not one of the driver libraries"),
            "{missing:?}"
        );
        assert!(why("/usr/share/vulkan/implicit_layer.d/nvidia_layers.json (graphics)").contains("not a loader JSON"));
        assert!(why("nvidia_drv.so (display, optional)").starts_with("not in /usr/lib/xorg/modules"), "{missing:?}");
        assert!(files.iter().all(|f| f.cap == FileCap::Graphics));
    }

    #[test]
    fn relative_paths_resolve_from_the_json_dir() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        let glx = lib(r, "libGLX_nvidia", "libGLX_nvidia.so.0", "usr/lib64");
        std::fs::create_dir_all(glx.host_path.parent().unwrap()).unwrap();
        std::fs::write(&glx.host_path, b"elf").unwrap();
        let json_at = Path::new("/usr/share/vulkan/icd.d/nvidia_icd.json");
        // The loader opens the path through the file's dir, which exists (it holds the file).
        std::fs::create_dir_all(r.join("usr/share/vulkan/icd.d")).unwrap();
        let r1 = resolve_library(r, json_at, "../../../lib64/libGLX_nvidia.so.550.54.15", std::slice::from_ref(&glx))
            .unwrap();
        assert_eq!(r1.bind_at, Some(PathBuf::from("/usr/lib64/libGLX_nvidia.so.550.54.15")));
        assert!(resolve_library(r, json_at, "../nope.so", std::slice::from_ref(&glx)).is_none());
        assert_eq!(resolve_library(r, json_at, "libGLX_nvidia.so.0", &[glx]).unwrap().bind_at, None);
    }
}

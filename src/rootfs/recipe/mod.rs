//! `azp-sandbox rootfs build RECIPE`: root filesystems from small declarative recipes
//! (`rootfs-recipes/*.toml`, format in `rootfs-recipes/README.md`), built with
//! debootstrap + apt, without Docker.
//!
//! A build, as root:
//! 1. `debootstrap --variant=minbase SUITE` into the store's temp import dir (same
//!    filesystem as the store: the finished tree is renamed into place by
//!    [`crate::rootfs::Store::import_with`], so a name is either complete or absent);
//! 2. in a chroot, `apt-get update`, `apt-get install --no-install-recommends PACKAGES`,
//!    removal of the distro's own NVIDIA driver libraries (the host's must win), the
//!    unprivileged user, `post_install`, clean-up;
//! 3. checks (arch, CUDA version of the installed packages against the recipe's), then
//!    the store records `cuda_version`, `arch` and `source = "recipe NAME (sha256:…)"`.
//!
//! Every step is a child process in its own process group and its own PRIVATE mount
//! namespace (`unshare(CLONE_NEWNS)` + `MS_REC|MS_PRIVATE` in the forked child, before
//! `exec`): `/proc`, `/sys`, `/dev` and the .deb cache are mounted there only, so they
//! vanish with the step's processes, even after SIGKILL, and are never visible on the
//! host. `.deb` files are kept in a cache dir between builds (bind-mounted over
//! `/var/cache/apt/archives`, and debootstrap's `--cache-dir`). Tool output goes to a
//! log file; a failing step prints its last 20 lines.
//!
//! By concept: [`schema`] (the format and its validation), [`lookup`] (where a recipe
//! is found), [`build`] (one build), `step` (the step runner; its isolation is
//! [`crate::sys::isolate`]), `scripts` (the chroot steps' shell), `ui` (progress).

pub mod build;
pub mod lookup;
pub mod schema;
mod scripts;
mod step;
mod ui;

pub use build::{build, build_command, BuildOptions, BuildReport};
pub use lookup::{available, builtin, find, list, search_dirs};
pub use schema::{deb_arch, Recipe, User};

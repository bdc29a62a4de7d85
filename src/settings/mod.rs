//! Where each verb's settings come from, merged in one place and validated into typed
//! values: command-line flags > AZP_* environment > the config file
//! (`/etc/azp-sandbox/config.toml`, or `--config FILE`). Errors are one line naming the
//! setting and what to do.
//!
//! The CLI (`src/cli/<verb>.rs`) only turns its flags into the `*Flags` values here; the
//! library takes the settings (`manager::run`, `slurm::run`, setuid's policy check).
//!
//! - [`file`] holds the config file's keys;
//! - [`env`] the environment ([`Env`]): AZP_URL, AZP_POOL, ... and AZP_TOKEN;
//! - [`global`] the global options' defaults (`--home`);
//! - [`run`] `run`'s settings (`agents prune` and `slurm` use their pool part);
//! - [`slurm`] the settings of `slurm`;
//! - [`token`] the PAT;
//! - [`keys`] how keys are read (`1` or `"1"`) and their mistakes reported.

pub mod env;
pub mod file;
pub mod global;
pub mod keys;
pub mod run;
pub mod slurm;
pub mod token;

pub use env::Env;
pub use file::{parse_file, read_file, FileSettings, DEFAULT_CONFIG};
pub use global::home;
pub use run::{env_settings, for_run, hostname, merge, parse_logs_max, parse_per_agent, FlagSettings, RunSettings};
pub use slurm::{for_slurm, SlurmFlags, SlurmSettings};
pub use token::read_token;

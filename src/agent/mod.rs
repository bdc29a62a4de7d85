//! The Azure Pipelines agent: package cache, configure/run phases.

pub mod package;
pub mod preflight;

pub use package::{AgentPackage, PackageCache};

//! OCI images into the rootfs store, without Docker.
//!
//! * `azp-sandbox rootfs pull REF` ([`pull()`]): the distribution API ([`registry`]) with
//!   the token flow and credentials from a Docker `config.json` ([`auth`]); an index
//!   resolves to the host's platform; blobs are verified by SHA-256 while they stream
//!   into the cache ([`blobs`]) and applied in order with OCI whiteouts ([`apply`]).
//! * `azp-sandbox rootfs import PATH[:REF]` of an OCI image layout (directory or tar)
//!   or a `docker save` archive ([`layout`]).
//!
//! The rootfs gets the image's architecture and CUDA version (`CUDA_VERSION` in the
//! config's environment, as NVIDIA's images set it) and the manifest digest.

pub mod apply;
pub mod auth;
pub mod blobs;
pub mod image;
pub mod layout;
pub mod pull;
pub mod reference;
pub mod registry;

pub use layout::{detect as detect_local, import as import_local, LocalImage, LocalOptions};
pub use pull::{pull, PullOptions, PullReport};
pub use reference::Reference;

//! The two NVML calls nvml-wrapper has no safe wrapper for: a MIG device's GPU instance
//! and compute instance ids. They name its capability files
//! (`/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/ci<C>/access`), which say
//! which `/dev/nvidia-caps` nodes a job given that MIG device needs.

use nvml_wrapper::{Device, Nvml};
use std::fmt;

/// Which call failed, and NVML's return code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigIdError {
    /// The loaded libnvidia-ml lacks the symbol (a driver before R450).
    Missing(&'static str),
    Failed {
        call: &'static str,
        code: u32,
    },
}

impl fmt::Display for MigIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MigIdError::Missing(call) => write!(f, "{call} is not in this libnvidia-ml (driver older than R450)"),
            MigIdError::Failed { call, code } => write!(f, "{call} failed (NVML return code {code})"),
        }
    }
}

impl std::error::Error for MigIdError {}

/// (GPU instance id, compute instance id) of `mig`, a MIG device handle of `nvml`.
pub fn instance_ids(nvml: &Nvml, mig: &Device) -> Result<(u32, u32), MigIdError> {
    let lib = nvml.lib();
    let gi_call =
        lib.nvmlDeviceGetGpuInstanceId.as_ref().map_err(|_| MigIdError::Missing("nvmlDeviceGetGpuInstanceId"))?;
    let ci_call = lib
        .nvmlDeviceGetComputeInstanceId
        .as_ref()
        .map_err(|_| MigIdError::Missing("nvmlDeviceGetComputeInstanceId"))?;
    let (mut gi, mut ci) = (0u32, 0u32);
    // SAFETY: `handle()` is the raw handle `mig` wraps; it stays valid while `mig` is
    // borrowed here (a Device cannot outlive the Nvml it came from, and `nvml` is the
    // library it was obtained from). The callee writes one c_uint through the pointer,
    // which points at a live local u32.
    let rc = unsafe { gi_call(mig.handle(), &mut gi) };
    if rc != 0 {
        return Err(MigIdError::Failed { call: "nvmlDeviceGetGpuInstanceId", code: rc });
    }
    // SAFETY: as above, for the compute instance id.
    let rc = unsafe { ci_call(mig.handle(), &mut ci) };
    if rc != 0 {
        return Err(MigIdError::Failed { call: "nvmlDeviceGetComputeInstanceId", code: rc });
    }
    Ok((gi, ci))
}

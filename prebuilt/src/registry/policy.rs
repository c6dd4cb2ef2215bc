//! The load policy, resolved once when a registry opens: what may compile, download or load
//! PTX, each permission held as the setting that withdraws it, so a refusal can name it.

use super::*;

/// How a [`Registry`] loads, resolved from [`RegistryOptions`] and the environment at open.
///
/// | field | `None` / `true` | otherwise |
/// | --- | --- | --- |
/// | [`jit_forbidden_by`](Policy::jit_forbidden_by) | the JIT fallback compiles what nothing fits | no fit is [`LoadError::NoFit`], naming the setting |
/// | [`downloads_allowed`](Policy::downloads_allowed) | a variant only the store has is fetched | it is refused ([`RefusalReason::NotDownloaded`]) |
/// | [`ptx_forbidden_by`](Policy::ptx_forbidden_by) | PTX variants may load | they are refused ([`RefusalReason::PtxJitForbidden`]) |
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// What forbids the JIT fallback: `AF3_KERNELS_JIT_FALLBACK=0`, or the loader's policy;
    /// `None` where it may compile.
    pub jit_forbidden_by: Option<String>,
    /// Whether a variant that only the bundle's store has may be downloaded.
    pub downloads_allowed: bool,
    /// The variable that forbids downloading (`AF3_KERNELS_NO_DOWNLOAD`), which a refused or
    /// failed download names.
    pub no_download: String,
    /// What forbids the driver's PTX JIT: `AF3_KERNELS_PTX_JIT=0`; `None` where PTX may load.
    pub ptx_forbidden_by: Option<String>,
}

impl Policy {
    /// The policy `options` set for `package`, the environment read where they say so.
    pub fn resolve(options: &RegistryOptions, package: &str) -> Policy {
        let variable = fallback_variable(package);
        let jit_forbidden_by =
            (!options.jit.allows_compiling(package)).then(|| match options.jit {
                JitPolicy::FromEnvironment => format!(
                    "{variable}={}",
                    std::env::var(&variable).unwrap_or_default()
                ),
                _ => format!("the loader's JIT policy (as {variable}=0 would)"),
            });
        Policy {
            jit_forbidden_by,
            downloads_allowed: options.downloads.allows_download(package),
            no_download: no_download_variable(package),
            ptx_forbidden_by: options.ptx_jit.forbidden_by(package),
        }
    }

    /// Whether `variant`, located at `location`, can be had: a store-only variant is refused
    /// where downloads are forbidden (from `store`).
    pub(super) fn obtainable(
        &self,
        location: ArtifactLocation,
        store: Option<&str>,
    ) -> Result<(), RefusalReason> {
        if self.downloads_allowed || location != ArtifactLocation::Store {
            return Ok(());
        }
        Err(RefusalReason::NotDownloaded {
            store: store.unwrap_or_default().to_owned(),
            variable: self.no_download.clone(),
        })
    }
}

/// `device sm_90 (compute 9.0), CUDA build cu130, driver 13.0[, torch 2.13.0]`: the device as
/// every load error and the Python module's dry run name it.
pub fn describe_device(query: &DeviceQuery) -> String {
    let (major, minor) = query.capability;
    let mut text = format!(
        "device sm_{major}{minor} (compute {major}.{minor}), CUDA build {}, driver {}",
        query.cuda, query.driver
    );
    if let Some(torch) = &query.torch {
        text.push_str(&format!(", torch {torch}"));
    }
    text
}

/// `device 1 (sm_90, compute 9.0), CUDA build cu130, driver 13.0[, torch 2.13.0]`: a real
/// device, by its ordinal, as the registry's load errors name it (a host may mix GPUs).
pub fn describe_device_on(ordinal: u32, query: &DeviceQuery) -> String {
    let (major, minor) = query.capability;
    let mut text = format!(
        "device {ordinal} (sm_{major}{minor}, compute {major}.{minor}), CUDA build {}, driver {}",
        query.cuda, query.driver
    );
    if let Some(torch) = &query.torch {
        text.push_str(&format!(", torch {torch}"));
    }
    text
}

/// `KWHEEL_CUDA_BUILD`, when set.
pub(super) fn build_from_env() -> Result<Option<CudaBuild>, LoadError> {
    let Some(value) = std::env::var_os(CUDA_BUILD_ENV) else {
        return Ok(None);
    };
    let value = value.to_string_lossy().into_owned();
    if value.trim().is_empty() {
        return Ok(None);
    }
    value
        .trim()
        .parse()
        .map(Some)
        .map_err(|error: crate::ParseTargetError| LoadError::Setting {
            variable: CUDA_BUILD_ENV,
            value,
            reason: error.to_string(),
        })
}

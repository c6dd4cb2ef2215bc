//! The one decision of a load: which cubin a kernel gets here and where its bytes come from,
//! or why it gets none. [`Registry::status`] renders it, [`Registry::load`] executes it.
//!
//! | plan | when | `load` then |
//! | --- | --- | --- |
//! | [`Plan::Loaded`] | loaded before | returns the same kernel |
//! | [`Plan::Prebuilt`] | a variant fits and its bytes can be had (wheel, cache, or the store where downloads are allowed) | reads, verifies and loads it |
//! | [`Plan::Pack`] | no variant of the bundle fits, a warm pack's entry does (`docs/warm-packs.md`) | reads and verifies it from the pack, loads it |
//! | [`Plan::Jit`] | nothing fits, the JIT is allowed, the kernel ships sources and a compiler is found | compiles (or takes the JIT cache's), loads |
//! | [`Plan::Refused`] | no GPU, unknown kernel, no fit with the JIT forbidden, or a JIT that cannot run | returns that error |

use super::*;

/// What [`Registry::load`] does for one kernel, decided once from the device, the bundle and
/// the [`Policy`].
#[derive(Debug)]
pub enum Plan {
    /// Loaded before: this kernel.
    Loaded(Kernel),
    /// A prebuilt variant fits.
    Prebuilt(PrebuiltPlan),
    /// No variant of the bundle fits; a warm pack's entry does, checked against the sources.
    Pack(Box<PackPlan>),
    /// No prebuilt variant fits; the JIT fallback compiles the shipped sources.
    Jit(Box<JitPlan>),
    /// It cannot load here: the error [`Registry::load`] returns.
    Refused(LoadError),
}

/// The prebuilt variant a kernel loads and where its bytes are.
#[derive(Clone, Debug, PartialEq)]
pub struct PrebuiltPlan {
    /// The variant that fits.
    pub variant: Variant,
    /// Why it fits (selection's sentence).
    pub reason: String,
    /// Where its bytes are: the wheel, the artifact cache, or only the store (fetched, and
    /// verified, by the load).
    pub location: ArtifactLocation,
}

/// The warm pack entry a kernel loads, and why it fits.
#[derive(Clone, Debug, PartialEq)]
pub struct PackPlan {
    /// The pack and its entry.
    pub entry: PackEntry,
    /// Why it fits (selection's sentence).
    pub reason: String,
}

/// How the JIT fallback builds a kernel that no prebuilt variant fits.
#[derive(Debug)]
pub struct JitPlan {
    /// The compiler it runs.
    pub compiler: JitCompiler,
    /// The key its result is cached under: the bundler's definition.
    pub key: KernelKey,
    /// The device's architecture, compiled for.
    pub arch: Arch,
    /// The runtime's CUDA build.
    pub cuda: CudaBuild,
    /// Whether the JIT cache held the key when planned (the load looks again).
    pub cached: bool,
    /// Why each shipped variant does not fit.
    pub refusals: NoFit,
    /// The kernel's record with its key inputs, which the compile reads.
    pub(super) record: KernelRecord,
}

impl JitPlan {
    /// The target as a label: `cu130/sm_90a`.
    pub fn target(&self) -> String {
        format!("{}/{}", self.cuda, self.arch)
    }

    /// Why the kernel is compiled; `how` says what the compile does or did (`compiled`,
    /// `cached`, `compiles on first load`).
    pub(super) fn reason(&self, how: &str) -> String {
        format!(
            "no prebuilt cubin fits ({}); {how} from the shipped sources with {}",
            shipped(&self.refusals),
            self.compiler
        )
    }
}

impl Plan {
    /// The plan as [`Registry::status`] reports it.
    pub fn status(&self) -> Status {
        match self {
            Plan::Loaded(kernel) => Status::Available {
                variant: kernel.inner.variant.clone(),
                reason: kernel.inner.reason.clone(),
                provenance: kernel.provenance().kind(),
                location: kernel.inner.location,
            },
            Plan::Prebuilt(plan) => {
                let mut reason = plan.reason.clone();
                if plan.location == ArtifactLocation::Store {
                    reason.push_str("; only in the store: fetched and verified on first load");
                }
                Status::Available {
                    variant: plan.variant.label(),
                    reason,
                    provenance: ProvenanceKind::Prebuilt,
                    location: Some(plan.location),
                }
            }
            Plan::Pack(plan) => Status::Available {
                variant: plan.entry.variant.label(),
                reason: plan.reason.clone(),
                provenance: ProvenanceKind::Pack,
                location: None,
            },
            Plan::Jit(plan) => Status::Available {
                variant: plan.target(),
                reason: plan.reason(if plan.cached {
                    "compiled before, cached"
                } else {
                    "compiles on first load"
                }),
                provenance: if plan.cached {
                    ProvenanceKind::JitCache
                } else {
                    ProvenanceKind::JitCompiled
                },
                location: None,
            },
            Plan::Refused(error) => Status::Unavailable {
                reason: error_chain(error),
            },
        }
    }
}

impl Registry {
    /// The plan of a kernel not loaded yet on device `ordinal`, whose record is `record`.
    pub(super) fn decide(&self, name: &str, record: &KernelRecord, ordinal: u32) -> Plan {
        let query = match self.gpu(ordinal) {
            Ok(query) => query,
            Err(error) => return Plan::Refused(error),
        };
        let store = self.meta().store.as_deref();
        // Each variant that passes selection's other checks is located once (a `stat`), and
        // selection hands back the chosen one's location with the choice.
        let available = |variant: &Variant| {
            let location = self.locate(variant);
            self.policy.obtainable(location, store).map(|()| location)
        };
        let ptx_forbidden_by = self.policy.ptx_forbidden_by.as_deref();
        let no_fit = match select_available(name, record, &query, ptx_forbidden_by, &available) {
            Ok((choice, location)) => {
                let path = &choice.variant.artifact.path;
                if let Err(source) = self.parts.root_for(self.catalog.root(), path) {
                    return Plan::Refused(LoadError::Part {
                        kernel: name.to_owned(),
                        variant: choice.variant.label(),
                        source: Box::new(source),
                    });
                }
                return Plan::Prebuilt(PrebuiltPlan {
                    location,
                    variant: choice.variant.clone(),
                    reason: choice.reason,
                });
            }
            Err(no_fit) => no_fit,
        };
        // A warm pack's entry loads as a prebuilt variant, also where the JIT is forbidden.
        if let Some(plan) = self.plan_pack(name, record, &query) {
            return plan;
        }
        if let Some(disabled_by) = &self.policy.jit_forbidden_by {
            return Plan::Refused(LoadError::NoFit {
                kernel: name.to_owned(),
                disabled_by: disabled_by.clone(),
                device: describe_device_on(ordinal, &query),
                refusals: Box::new(no_fit),
            });
        }
        self.plan_jit(name, record, &query, ordinal, no_fit)
    }

    /// The JIT plan for `name`, or why the JIT cannot build it.
    fn plan_jit(
        &self,
        name: &str,
        record: &KernelRecord,
        query: &DeviceQuery,
        ordinal: u32,
        no_fit: NoFit,
    ) -> Plan {
        // The JIT's key needs the kernel's key inputs, which the loader's record leaves out.
        let record = match self.catalog.inputs(name) {
            Ok(inputs) => KernelRecord {
                inputs: inputs.unwrap_or_default(),
                ..record.clone()
            },
            Err(error) => return Plan::Refused(error.into()),
        };
        if record.recipe.is_none() {
            let source = Arc::new(JitError::NoSources {
                kernel: name.to_owned(),
            });
            return Plan::Refused(self.jit_failed(name, query, ordinal, no_fit, source));
        }
        // Flags off the JIT's allowlist: refused before any compiler is looked for.
        if let Err(error) = jit::check_inputs(name, &record) {
            return Plan::Refused(self.jit_failed(name, query, ordinal, no_fit, Arc::new(error)));
        }
        let compiler = match self.compiler(query) {
            Ok(compiler) => compiler,
            Err(source) => {
                return Plan::Refused(self.jit_failed(name, query, ordinal, no_fit, source))
            }
        };
        let arch = device_arch(query.capability);
        let key = self
            .jit_request(name, &record, query)
            .key(&compiler.record());
        Plan::Jit(Box::new(JitPlan {
            cached: jit::is_cached(&self.options.jit_cache, &key),
            compiler,
            key,
            arch,
            cuda: query.cuda,
            refusals: no_fit,
            record,
        }))
    }

    /// The plan of the warm pack entry that fits, if one does; a pack that cannot be trusted
    /// is the refusal.
    fn plan_pack(&self, name: &str, record: &KernelRecord, query: &DeviceQuery) -> Option<Plan> {
        let package = &self.meta().package;
        let dirs = pack::pack_dirs(self.catalog.root(), &self.options.jit_cache, package);
        if dirs.is_empty() {
            return None;
        }
        let inputs = self.catalog.inputs(name).ok()??;
        let entries = pack::pack_entries(&dirs, package, name, &inputs, &self.meta().torch);
        let entries = match entries {
            Ok(entries) => entries,
            Err(error) => return Some(Plan::Refused(LoadError::Pack(Box::new(error)))),
        };
        let candidates = KernelRecord {
            variants: entries.iter().map(|entry| entry.variant.clone()).collect(),
            skipped: Vec::new(),
            ..record.clone()
        };
        let forbidden = self.policy.ptx_forbidden_by.as_deref();
        let (choice, ()) =
            select_available(name, &candidates, query, forbidden, &|_| Ok(())).ok()?;
        let entry = entries
            .into_iter()
            .find(|entry| entry.variant == *choice.variant)?;
        let reason = format!(
            "{}; from the warm pack {}",
            choice.reason,
            entry.pack.display()
        );
        Some(Plan::Pack(Box::new(PackPlan { entry, reason })))
    }

    pub(super) fn jit_request<'r>(
        &'r self,
        name: &'r str,
        record: &'r KernelRecord,
        query: &DeviceQuery,
    ) -> JitRequest<'r> {
        JitRequest {
            bundle_root: self.catalog.root(),
            kernel: name,
            record,
            torch: &self.meta().torch,
            arch: device_arch(query.capability),
            cuda: query.cuda,
        }
    }

    /// No prebuilt cubin fits and the JIT fallback could not build one.
    pub(super) fn jit_failed(
        &self,
        name: &str,
        query: &DeviceQuery,
        ordinal: u32,
        refusals: NoFit,
        source: Arc<JitError>,
    ) -> LoadError {
        LoadError::Jit {
            kernel: name.to_owned(),
            device: describe_device_on(ordinal, query),
            refusals: Box::new(refusals),
            source,
        }
    }
}

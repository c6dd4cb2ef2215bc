//! Carrying out a [`Plan`]: read (or fetch, or compile) the cubin, verified, and load it into
//! the device's primary context. Nothing here decides anything [`Registry::status`] would not
//! have said.

use std::path::Path;

use super::*;

/// What a load tells about its cubin besides the bytes, for the [`Kernel`] to report.
struct Origin {
    variant: String,
    reason: String,
    provenance: Provenance,
    location: Option<ArtifactLocation>,
}

impl Origin {
    /// A prebuilt `variant` (labelled `label`), chosen for `reason`, read from `location`.
    fn prebuilt(
        variant: &Variant,
        label: String,
        reason: String,
        location: ArtifactLocation,
    ) -> Origin {
        Origin {
            provenance: Provenance::Prebuilt {
                variant: label.clone(),
                key: variant.key.clone(),
            },
            variant: label,
            reason,
            location: Some(location),
        }
    }
}

impl Registry {
    /// Loads `name` (record `record`) on device `ordinal` as `plan`, made for that device,
    /// says.
    pub(super) fn execute(
        &self,
        name: &str,
        record: &KernelRecord,
        plan: Plan,
        ordinal: u32,
    ) -> Result<Kernel, LoadError> {
        match plan {
            Plan::Loaded(kernel) => Ok(kernel),
            Plan::Refused(error) => Err(error),
            Plan::Prebuilt(plan) => self.load_prebuilt(name, record, plan, ordinal),
            Plan::Pack(plan) => self.load_pack(name, record, *plan, ordinal),
            Plan::Jit(plan) => self.load_jit(name, *plan, ordinal),
        }
    }

    fn load_prebuilt(
        &self,
        name: &str,
        record: &KernelRecord,
        plan: PrebuiltPlan,
        ordinal: u32,
    ) -> Result<Kernel, LoadError> {
        let PrebuiltPlan {
            variant,
            reason,
            location,
        } = plan;
        let label = variant.label();
        let (cubin, location) = match location {
            ArtifactLocation::Cache | ArtifactLocation::Store => {
                // The cache and the store hand out nothing whose sha256 differs either.
                // A cache entry found damaged is fetched again only where downloads are allowed.
                let store = || {
                    if self.policy.downloads_allowed {
                        self.store_handle()
                    } else {
                        Err(FetchError::Forbidden {
                            what: fetch::describe(name, &variant),
                            variable: self.policy.no_download.clone(),
                        })
                    }
                };
                let (cubin, _) = obtain_remote(
                    self.catalog.root(),
                    self.meta().store.as_deref(),
                    name,
                    &variant,
                    &self.artifact_cache,
                    &store,
                )
                .map_err(|source| LoadError::Fetch {
                    kernel: name.to_owned(),
                    variant: label.clone(),
                    no_download: self.policy.no_download.clone(),
                    source: Box::new(source),
                })?;
                (cubin, ArtifactLocation::Cache)
            }
            ArtifactLocation::Bundle | ArtifactLocation::Missing => {
                // Nothing whose sha256 differs from the index's is handed out.
                let root = self
                    .parts
                    .root_for(self.catalog.root(), &variant.artifact.path)
                    .map_err(|source| LoadError::Part {
                        kernel: name.to_owned(),
                        variant: label.clone(),
                        source: Box::new(source),
                    })?;
                let stored = &variant.artifact;
                // A plain frame may be its family's reference, which a sibling's load may
                // have decoded already (see `prefix`).
                let plain = stored.dictionary.is_none();
                if let Some(bytes) = plain.then(|| self.held_prefix(&stored.digest)).flatten() {
                    // Verified here, as every cubin is before it loads.
                    verify_artifact(&bytes, &root, name, &variant)?;
                    let origin = Origin::prebuilt(&variant, label, reason, location);
                    let entries = &variant.functions;
                    return self.finish_load(
                        name,
                        &record.constants,
                        &bytes,
                        (entries, &variant.structs),
                        origin,
                        ordinal,
                    );
                }
                let cubin = read_artifact_with(
                    &root,
                    name,
                    &variant,
                    |digest, label| self.prefix(&root, digest, name, label),
                    |label| self.dictionary(name, label),
                )?;
                if plain && self.catalog.is_reference(&stored.digest) {
                    // Kept for the siblings whose frames reach back into it.
                    self.hold_prefix(&stored.digest, Arc::from(&cubin[..]));
                }
                (cubin, location)
            }
        };
        let origin = Origin::prebuilt(&variant, label, reason, location);
        let entries = (&variant.functions[..], &variant.structs);
        self.finish_load(name, &record.constants, &cubin, entries, origin, ordinal)
    }

    /// The family reference with raw-content sha256 `digest`, if a load decoded it.
    fn held_prefix(&self, digest: &str) -> Option<Arc<[u8]>> {
        let prefixes = self.prefixes.lock().unwrap_or_else(PoisonError::into_inner);
        prefixes.get(digest).cloned()
    }

    /// Keeps the decoded family reference `bytes` (raw-content sha256 `digest`) for the frames
    /// compressed against it.
    fn hold_prefix(&self, digest: &str, bytes: Arc<[u8]>) {
        let mut prefixes = self.prefixes.lock().unwrap_or_else(PoisonError::into_inner);
        prefixes.insert(digest.to_owned(), bytes);
    }

    /// Loads a warm pack's entry: read and verified from the pack (digest, identity, not a
    /// stub), so nothing the pack altered is loaded.
    fn load_pack(
        &self,
        name: &str,
        record: &KernelRecord,
        plan: PackPlan,
        ordinal: u32,
    ) -> Result<Kernel, LoadError> {
        let PackPlan { entry, reason } = plan;
        let cubin = pack::read_pack_cubin(&entry.pack, name, &entry.variant)
            .map_err(|error| LoadError::Pack(Box::new(error)))?;
        let label = entry.variant.label();
        let origin = Origin {
            provenance: Provenance::Pack {
                variant: label.clone(),
                key: entry.variant.key.clone(),
                pack: entry.pack.clone(),
            },
            variant: label,
            reason,
            location: None,
        };
        let entries = (&entry.variant.functions[..], &entry.variant.structs);
        self.finish_load(name, &record.constants, &cubin, entries, origin, ordinal)
    }

    /// The store client, made on first need.
    fn store_handle(&self) -> Result<StoreHandle, FetchError> {
        if let Some(handle) = self.store.get() {
            return Ok(handle.clone());
        }
        let url = self.meta().store.as_deref().unwrap_or_default();
        let handle = StoreHandle::connect(url, &self.options.store)?;
        Ok(self.store.get_or_init(|| handle).clone())
    }

    /// The family dictionary with raw-content sha256 `digest`, read once per registry and kept
    /// for the family's other kernels. Not hashed: see [`crate::bundle::read_prefix`].
    fn prefix(
        &self,
        root: &Path,
        digest: &str,
        kernel: &str,
        label: &str,
    ) -> Result<Arc<[u8]>, BundleError> {
        if let Some(bytes) = self.held_prefix(digest) {
            return Ok(bytes);
        }
        // Where the index says prefixes are shipped cubins, their artifacts are looked for first.
        let artifact_first = self.meta().format >= REFERENCE_INDEX_FORMAT;
        let bytes: Arc<[u8]> =
            read_prefix_from(root, digest, false, artifact_first, kernel, label)?.into();
        self.hold_prefix(digest, Arc::clone(&bytes));
        Ok(bytes)
    }

    /// The bundle's trained zstd dictionary, read and verified once per registry.
    fn dictionary(&self, kernel: &str, label: &str) -> Result<Option<&[u8]>, BundleError> {
        let Some(stored) = &self.meta().dictionary else {
            return Ok(None);
        };
        if let Some(bytes) = self.dictionary.get() {
            return Ok(bytes.as_deref());
        }
        let bytes = read_dictionary(self.catalog.root(), stored, kernel, label)?;
        Ok(self.dictionary.get_or_init(|| Some(bytes)).as_deref())
    }

    fn load_jit(&self, name: &str, plan: JitPlan, ordinal: u32) -> Result<Kernel, LoadError> {
        let query = self.gpu(ordinal)?;
        let request = self.jit_request(name, &plan.record, &query);
        let output = match compile_cached(&request, &plan.compiler, &self.options.jit_cache) {
            Ok(output) => output,
            Err(error) => {
                let error = Arc::new(error);
                return Err(self.jit_failed(name, &query, ordinal, plan.refusals, error));
            }
        };
        let key = output.key.0.clone();
        let (provenance, how) = if output.compiled {
            (Provenance::JitCompiled { key }, "compiled")
        } else {
            (Provenance::JitCache { key }, "cached")
        };
        let origin = Origin {
            variant: plan.target(),
            reason: plan.reason(how),
            provenance,
            location: None,
        };
        let constants = &plan.record.constants;
        let entries = (&output.functions[..], &output.structs);
        self.finish_load(name, constants, &output.cubin, entries, origin, ordinal)
    }

    /// Loads a verified cubin into device `ordinal`'s primary context and resolves every
    /// entry.
    fn finish_load(
        &self,
        name: &str,
        constants: &BTreeMap<String, Constant>,
        cubin: &[u8],
        (entries, structs): (&[EntryRecord], &BTreeMap<String, StructLayout>),
        origin: Origin,
        ordinal: u32,
    ) -> Result<Kernel, LoadError> {
        let device = describe_device_on(ordinal, &self.gpu(ordinal)?);
        let variant = origin.variant;
        let symbols: Vec<&str> = entries.iter().map(|entry| entry.symbol.as_str()).collect();
        let module =
            self.device
                .load(ordinal, cubin, &symbols)
                .map_err(|failure| match failure {
                    ModuleFailure::Context(error) => LoadError::NoGpu(error),
                    ModuleFailure::Load(error) => {
                        LoadError::driver(error, "load", name, &variant, &device)
                    }
                    ModuleFailure::Lookup(error) => {
                        LoadError::driver(error, "look up an entry of", name, &variant, &device)
                    }
                })?;
        let structs = Arc::new(structs.clone());
        let functions = entries
            .iter()
            .enumerate()
            .map(|(index, entry)| Function {
                structs: Arc::clone(&structs),
                kernel: name.to_owned(),
                variant: variant.clone(),
                device: device.clone(),
                entry: entry.clone(),
                module: Arc::clone(&module),
                index,
                launch: Arc::default(),
            })
            .collect();
        Ok(Kernel {
            inner: Arc::new(KernelInner {
                name: name.to_owned(),
                device: ordinal,
                variant,
                reason: origin.reason,
                provenance: origin.provenance,
                location: origin.location,
                constants: constants.clone(),
                structs,
                functions,
                module,
            }),
        })
    }
}

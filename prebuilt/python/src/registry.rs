//! `Bundle` (the index, and selection as a dry run) and `Registry` (the runtime).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use prebuilt::device::{default_build, parse_cuda_build, DeviceQuery, DriverVersion};
use prebuilt::lookup::Catalog;
use prebuilt::registry::describe_device;
use prebuilt::{JitPolicy, LoadError, RegistryOptions, Status};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::{load_error, no_fit, KwheelError};
use crate::kernel::{constants_dict, Kernel};

/// A bundle, read one kernel at a time (its loader index). Answers without a GPU: the
/// kernels, their constants, and which variant a device would load (`select`).
#[pyclass(frozen, module = "kwheel._kwheel")]
pub struct Bundle {
    inner: Catalog,
}

impl Bundle {
    /// The bundle's loader index.
    pub(crate) fn catalog(&self) -> &Catalog {
        &self.inner
    }

    /// A simulated device for `select` and `fetch`: the arguments as Python gives them, with
    /// the defaults those methods document.
    fn simulated(
        &self,
        device: &Bound<'_, PyAny>,
        cuda: Option<&str>,
        torch: Option<String>,
        driver: Option<&str>,
    ) -> PyResult<DeviceQuery> {
        let capability = parse_device(device)?;
        let driver = driver
            .map(|text| DriverVersion::parse(text).map_err(value_error))
            .transpose()?;
        let cuda = match cuda {
            Some(text) => parse_cuda_build(text).map_err(value_error)?,
            None => default_build(&self.inner.meta().builds, driver),
        };
        Ok(DeviceQuery::simulated(capability, cuda, driver, torch))
    }
}

#[pymethods]
impl Bundle {
    /// Reads the index of the bundle directory `path` (a wheel's `<package>/_prebuilt`).
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Bundle> {
        let inner = py
            .detach(|| Catalog::open(path))
            .map_err(|error| load_error(py, &LoadError::from(error)))?;
        Ok(Bundle { inner })
    }

    /// The bundle directory.
    #[getter]
    fn path(&self) -> PathBuf {
        self.inner.root().to_path_buf()
    }

    /// The kernel library's distribution name (`af3-kernels`).
    #[getter]
    fn package(&self) -> String {
        self.inner.meta().package.clone()
    }

    /// The torch pin the cubins were built against (`2.13.*`).
    #[getter]
    fn torch(&self) -> String {
        self.inner.meta().torch.clone()
    }

    /// Every kernel, by name, sorted.
    #[getter]
    fn kernels(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.inner
            .names()
            .map_err(|error| load_error(py, &LoadError::from(error)))
    }

    /// The CUDA builds any variant was built for (`["cu129", "cu130"]`), oldest first.
    #[getter]
    fn cuda_builds(&self) -> Vec<String> {
        self.inner
            .meta()
            .builds
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// The extension modules, by name, sorted.
    #[getter]
    fn modules(&self) -> Vec<String> {
        self.inner.meta().modules.keys().cloned().collect()
    }

    /// The shared library of extension module `name` for a process with torch `torch`
    /// (`torch.__version__`), torch's CUDA build `cuda` (`"13.0"`, `"cu130"`; `None` for a
    /// CPU torch) and CPU `cpu` (`"x86_64"`): `(bytes, variant, key, source)`, the bytes read
    /// once and verified against the sha256 the index records (`source` `"module"`), so what
    /// is loaded is what was verified. When no build fits and `torch_dir` (the running torch's
    /// package folder) is given, the JIT fallback builds it from the shipped sources into the
    /// JIT cache, or reads it from there (`source` `"jit"`; progress on stderr), unless
    /// `jit=False` or `<PACKAGE>_JIT_FALLBACK=0` forbid it. Raises `NoFitError` naming the
    /// torch and CUDA build, every variant's refusal and what to install when no build fits
    /// and none may be built; `KwheelError` when the build fails.
    #[pyo3(signature = (name, torch, cuda, cpu, torch_dir=None, jit=None))]
    #[allow(clippy::too_many_arguments)]
    fn read_module<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        torch: &str,
        cuda: Option<&str>,
        cpu: &str,
        torch_dir: Option<PathBuf>,
        jit: Option<bool>,
    ) -> PyResult<(Bound<'py, pyo3::types::PyBytes>, String, String, String)> {
        let record = self.inner.meta().modules.get(name).ok_or_else(|| {
            crate::errors::UnknownKernelError::new_err(format!(
                "no extension module `{name}` in the bundle at {}",
                self.inner.root().display()
            ))
        })?;
        let cuda = cuda
            .map(|text| parse_cuda_build(text).map_err(value_error))
            .transpose()?;
        let host = prebuilt::module::ModuleHost { torch, cuda, cpu };
        let no_fit_error = match prebuilt::module::select_module(name, record, &host) {
            Ok(variant) => {
                let bytes = py
                    .detach(|| prebuilt::module::read_module(self.inner.root(), name, variant))
                    .map_err(|error| load_error(py, &LoadError::from(error)))?;
                return Ok((
                    pyo3::types::PyBytes::new(py, &bytes),
                    variant.label(),
                    variant.key.clone(),
                    "module".to_owned(),
                ));
            }
            Err(error) => error,
        };
        let package = &self.inner.meta().package;
        let variable = prebuilt::env::fallback_variable(package);
        let policy = match jit {
            None => JitPolicy::FromEnvironment,
            Some(true) => JitPolicy::Allowed,
            Some(false) => JitPolicy::Disabled,
        };
        // What to install names the builds for this CPU: another CPU's torch would not help.
        let served: Vec<String> = record
            .variants
            .iter()
            .filter(|variant| variant.cpu == cpu)
            .map(|variant| format!("torch{} ({})", variant.torch, variant.label()))
            .collect();
        let install = match served.is_empty() {
            true => "a torch the module was built for".to_owned(),
            false => served.join(" or "),
        };
        let refuse = |why: String| no_fit(py, format!("{no_fit_error}; {why}"), Vec::new());
        let (Some(torch_dir), Some(build)) = (torch_dir, cuda) else {
            return Err(refuse(match cuda {
                None => format!(
                    "a CPU-only torch cannot build it (its CUDA units need a CUDA torch); \
                     install {install}"
                ),
                Some(_) => format!(
                    "the JIT fallback was not asked to build it (no torch folder given); \
                     install {install}"
                ),
            }));
        };
        if !policy.allows_compiling(package) {
            let forbidden_by = match jit {
                Some(false) => "jit=False".to_owned(),
                _ => format!("{variable}=0"),
            };
            return Err(refuse(format!(
                "{forbidden_by} forbids building it from its shipped sources (nothing was \
                 built): install {install}, or allow the JIT"
            )));
        }
        // `<torch/extension.h>` includes `Python.h`: a classic-ABI module compiles with the
        // running Python's headers, where it has them.
        let python_include: Option<PathBuf> = py
            .import("sysconfig")
            .and_then(|sysconfig| sysconfig.call_method0("get_paths"))
            .and_then(|paths| paths.get_item("include"))
            .and_then(|include| include.extract())
            .ok()
            .filter(|dir: &PathBuf| dir.join("Python.h").is_file());
        // The declared archs that run on the visible GPUs, read from NVML (no CUDA context).
        let archs = py.detach(|| prebuilt::jit::module::visible_jit_archs(record));
        let request = prebuilt::jit::module::ModuleJitRequest {
            bundle_root: self.inner.root(),
            name,
            record,
            torch_version: torch,
            torch_dir: &torch_dir,
            cuda: build,
            python_include: python_include.as_deref(),
            cpu,
            cache_dir: &prebuilt::jit::default_cache_dir(),
            archs: &archs,
        };
        let built = py
            .detach(|| {
                let search = prebuilt::jit::CompilerSearch::from_env();
                let compilers = prebuilt::jit::module::find_module_compilers(name, build, &search)?;
                // The binding is the runtime's front end: a build takes tens of seconds, and
                // the person waiting on the import sees why.
                let progress = |line: &str| eprintln!("kwheel: {package}: {line}");
                prebuilt::jit::module::build_module_cached(&request, &compilers, &progress)
            })
            .map_err(|error| {
                crate::errors::KwheelError::new_err(format!(
                    "{no_fit_error}; the JIT fallback could not build it: {}",
                    crate::errors::chain(&error)
                ))
            })?;
        let source = match built.compiled {
            true => "jit-compiled",
            false => "jit-cache",
        };
        Ok((
            pyo3::types::PyBytes::new(py, &built.bytes),
            built.label,
            built.key,
            source.to_owned(),
        ))
    }

    /// The manifest's exported constants of kernel `name` (`{"BLOCK_SIZE": 256}`).
    fn constants<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
        let record = self.record(py, name)?;
        constants_dict(py, &record.constants)
    }

    /// Why kernel `name` cannot run with `inputs` (its manifest's `inputs`, by keyword: ints,
    /// torch sizes, bools), or `None`: its first requirement those values break, in words with
    /// the values, read from the index alone (no GPU, nothing loaded). `device` (as for
    /// `select`) names the variant to answer for; every variant shares the kernel's constants
    /// (a manifest refuses a per-arch constant), so any device, and none (the strictest of
    /// all), gets the same answer, and `device` is only checked.
    #[pyo3(signature = (name, /, device=None, **inputs))]
    fn unsupported_shape_reason(
        &self,
        py: Python<'_>,
        name: &str,
        device: Option<&Bound<'_, PyAny>>,
        inputs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Option<String>> {
        if let Some(device) = device {
            parse_device(device)?;
        }
        let record = self.requirements(py, name)?;
        crate::requires::answer(name, &record, &record.constants, inputs)
    }

    /// Downloads, verifies and caches every variant that a device would load and that this
    /// bundle leaves in its store (a slim wheel), so the device can run offline. Arguments as
    /// for `select`. Returns the report as text; raises when anything could not be fetched.
    #[pyo3(signature = (device, cuda=None, torch=None, driver=None))]
    fn fetch(
        &self,
        py: Python<'_>,
        device: &Bound<'_, PyAny>,
        cuda: Option<&str>,
        torch: Option<String>,
        driver: Option<&str>,
    ) -> PyResult<String> {
        let query = self.simulated(device, cuda, torch, driver)?;
        let bundle = py
            .detach(|| prebuilt::lookup::open_bundle(self.inner.root()))
            .map_err(|error| load_error(py, &LoadError::from(error)))?;
        let report = py
            .detach(|| {
                prebuilt::fetch::prefetch(
                    &bundle,
                    &query,
                    &prebuilt::cache::ArtifactCache::default(),
                    &prebuilt::fetch::StoreOptions::default(),
                )
            })
            .map_err(|error| KwheelError::new_err(crate::errors::chain(&error)))?;
        if !report.complete() {
            return Err(KwheelError::new_err(report.to_string()));
        }
        Ok(report.to_string())
    }

    /// Which variant of kernel `name` a device would load, without a GPU: `device` as
    /// `"sm_90"`, `"9.0"` or `(9, 0)`; `cuda` as `"12.9"` or `"cu129"` (default: the newest
    /// build of the bundle the driver supports); `torch` a version (default: not checked);
    /// `driver` the CUDA version the driver supports (`"13.0"`) or its release (`"580.65"`)
    /// (default: just new enough for the CUDA build). Raises `NoFitError`, listing every
    /// variant and why it does not fit, when none does.
    #[pyo3(signature = (name, device, cuda=None, torch=None, driver=None))]
    fn select(
        &self,
        py: Python<'_>,
        name: &str,
        device: &Bound<'_, PyAny>,
        cuda: Option<&str>,
        torch: Option<String>,
        driver: Option<&str>,
    ) -> PyResult<Selection> {
        let record = self.record(py, name)?;
        let query = self.simulated(device, cuda, torch, driver)?;
        let device = describe_device(&query);
        // `kernel_coverage` runs `select_variant`'s rules and keeps every refusal, chosen or
        // not; `locate` says where the chosen cubin is: the wheel, the user's cache, the store.
        let mut coverage = prebuilt::coverage::kernel_coverage(&record, &query, None);
        let chosen = coverage
            .loads
            .as_ref()
            .and_then(|label| record.variants.iter().find(|v| &v.label() == label));
        coverage.location = chosen.map(|variant| {
            prebuilt::bundle::locate(
                self.inner.root(),
                self.inner.meta().store.as_deref(),
                variant,
                &prebuilt::cache::ArtifactCache::default(),
            )
        });
        let Some(variant) = chosen else {
            let mut message = format!("no prebuilt variant of `{name}` fits {device}:");
            if coverage.refusals.is_empty() {
                message.push_str(" the bundle has none");
            }
            for (variant, reason) in &coverage.refusals {
                message.push_str(&format!("\n  {variant}: {reason}"));
            }
            // What `load()` does instead: the JIT fallback, when the bundle can feed it.
            let sources = self
                .inner
                .root()
                .join(prebuilt::bundle::SOURCES_DIR)
                .is_dir();
            if record.recipe.is_some() && sources {
                message.push_str(&format!(
                    "\nload() would JIT-compile it from the shipped sources instead (unless {}=0)",
                    prebuilt::env::fallback_variable(&self.inner.meta().package)
                ));
            }
            return Err(no_fit(py, message, coverage.refusals));
        };
        let compiler = &variant.compiler;
        Ok(Selection {
            kernel: name.to_owned(),
            variant: variant.label(),
            arch: variant.arch.to_string(),
            cuda: variant.cuda.to_string(),
            torch: variant.torch.clone(),
            compiler: format!("{} {}", compiler.kind, compiler.version)
                .trim()
                .to_owned(),
            key: variant.key.clone(),
            reason: coverage.reason,
            entries: variant
                .functions
                .iter()
                .map(|function| function.name.clone())
                .collect(),
            device,
            location: coverage
                .location
                .map_or_else(|| "missing".to_owned(), |location| location.to_string()),
            refusals: coverage.refusals,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "Bundle({:?}, package={:?})",
            self.inner.root().display().to_string(),
            self.inner.meta().package,
        )
    }
}

impl Bundle {
    fn record(&self, py: Python<'_>, name: &str) -> PyResult<prebuilt::KernelRecord> {
        crate::requires::known_record(py, &self.inner, name, self.inner.record(name))
    }

    fn requirements(&self, py: Python<'_>, name: &str) -> PyResult<prebuilt::KernelRecord> {
        crate::requires::known_record(py, &self.inner, name, self.inner.requirements(name))
    }
}

/// What `select` chose for a simulated device. `str()` is the variant (`cu129/sm_90a`).
#[pyclass(frozen, module = "kwheel._kwheel")]
pub struct Selection {
    /// The kernel.
    #[pyo3(get)]
    kernel: String,
    /// The variant's label, `cu129/sm_90a`.
    #[pyo3(get)]
    variant: String,
    /// Its architecture, `sm_90a`.
    #[pyo3(get)]
    arch: String,
    /// Its CUDA build, `cu129`.
    #[pyo3(get)]
    cuda: String,
    /// Its torch pin, `2.13.*`.
    #[pyo3(get)]
    torch: String,
    /// The compiler that built it, `nvrtc 12.9.86`.
    #[pyo3(get)]
    compiler: String,
    /// Its key.
    #[pyo3(get)]
    key: String,
    /// Why it fits.
    #[pyo3(get)]
    reason: String,
    /// Its entries, as declared.
    #[pyo3(get)]
    entries: Vec<String>,
    /// The simulated device, CUDA build, driver and torch.
    #[pyo3(get)]
    device: String,
    /// Where its cubin is: `local (bundle)` (the wheel's `_prebuilt/`), `local (cache)`
    /// (fetched before), or `remote` (fetched from the store on first load).
    #[pyo3(get)]
    location: String,
    /// Every other variant and skipped target, and why it does not fit: `[(variant, reason)]`.
    #[pyo3(get)]
    refusals: Vec<(String, String)>,
}

#[pymethods]
impl Selection {
    fn __str__(&self) -> String {
        self.variant.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "Selection(kernel={:?}, variant={:?}, reason={:?})",
            self.kernel, self.variant, self.reason
        )
    }
}

/// The runtime: a bundle's kernels, loaded on demand in each device's primary context (the one
/// PyTorch uses), once per device that asks. Reads the index when created; touches the driver
/// on the first `status`, `is_available`, `unavailable_reason` or `load`. Every method that
/// touches the GPU takes `device=`, an ordinal; `None` is the registry's own device.
#[pyclass(frozen, module = "kwheel._kwheel")]
pub struct Registry {
    inner: Arc<prebuilt::Registry>,
}

#[pymethods]
impl Registry {
    /// Opens the bundle directory `path`. `cuda`: the runtime's CUDA build (`"12.9"`,
    /// `"cu129"`; default `KWHEEL_CUDA_BUILD`, else the newest build of the bundle the driver
    /// supports); `torch`: the runtime's torch version, checked against each variant's pin
    /// (default: not checked); `jit`: `True`/`False` allow or forbid compiling what no cubin
    /// fits (default: `<PACKAGE>_JIT_FALLBACK`); `site_packages`: more directories to look
    /// for NVIDIA's NVRTC wheels in, after those of the environment; `device`: the ordinal;
    /// `search_path`: where to look for the companion part packages of a registry-sized wheel
    /// set after the directory holding the bundle's package (`sys.path`).
    #[new]
    #[pyo3(signature = (path, *, cuda=None, torch=None, jit=None, site_packages=Vec::new(), device=0, search_path=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        cuda: Option<&str>,
        torch: Option<String>,
        jit: Option<bool>,
        site_packages: Vec<PathBuf>,
        device: u32,
        search_path: Vec<PathBuf>,
    ) -> PyResult<Registry> {
        // The defaults read the environment once (the compiler search lists the virtual
        // environment's site-packages); the arguments then override them.
        let mut options = RegistryOptions::default();
        let searched = &mut options.compilers.site_packages;
        for dir in site_packages {
            if !searched.contains(&dir) {
                searched.push(dir);
            }
        }
        options.cuda = cuda
            .map(parse_cuda_build)
            .transpose()
            .map_err(value_error)?;
        options.torch = torch;
        options.jit = match jit {
            None => JitPolicy::FromEnvironment,
            Some(true) => JitPolicy::Allowed,
            Some(false) => JitPolicy::Disabled,
        };
        options.device = device;
        options.part_search = search_path;
        let inner = py
            .detach(|| prebuilt::Registry::open_with(path, options))
            .map_err(|error| load_error(py, &error))?;
        Ok(Registry {
            inner: Arc::new(inner),
        })
    }

    /// The bundle directory.
    #[getter]
    fn path(&self) -> PathBuf {
        self.inner.catalog().root().to_path_buf()
    }

    /// The kernel library's distribution name (`af3-kernels`).
    #[getter]
    fn package(&self) -> String {
        self.inner.meta().package.clone()
    }

    /// Every kernel, by name, sorted.
    #[getter]
    fn kernels(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.inner
            .catalog()
            .names()
            .map_err(|error| load_error(py, &LoadError::from(error)))
    }

    /// The device ordinal that methods given no `device=` use.
    #[getter]
    fn device(&self) -> u32 {
        self.inner.options().device
    }

    /// Whether `<PACKAGE>_TRACE` asks for every op call to be marked in traces.
    #[getter]
    fn trace(&self) -> bool {
        prebuilt::env::trace_enabled(&self.inner.meta().package)
    }

    /// The runtime's CUDA build as given or set in `KWHEEL_CUDA_BUILD` (`cu129`); `None`
    /// until the first GPU call picks the newest build of the bundle the driver supports.
    #[getter]
    fn cuda(&self) -> Option<String> {
        self.inner.options().cuda.map(|build| build.to_string())
    }

    /// The torch version checked against each variant's pin; `None`: not checked.
    #[getter]
    fn torch(&self) -> Option<String> {
        self.inner.options().torch.clone()
    }

    /// Whether a kernel with no fitting cubin is compiled from the shipped sources.
    #[getter]
    fn jit_allowed(&self) -> bool {
        self.inner.jit_allowed()
    }

    /// What selection sees on the device: `{"device": "9.0", "driver": "13.0", "cuda":
    /// "cu130", "torch": "2.13.0+cu130" or None}`. Raises `NoGpuError` without a usable GPU.
    #[pyo3(signature = (device=None))]
    fn query<'py>(&self, py: Python<'py>, device: Option<u32>) -> PyResult<Bound<'py, PyDict>> {
        let registry = Arc::clone(&self.inner);
        let ordinal = self.ordinal(device);
        let query = py
            .detach(move || registry.device_query_on(ordinal))
            .map_err(|error| load_error(py, &error))?;
        let dict = PyDict::new(py);
        dict.set_item("device", query.device())?;
        dict.set_item("driver", query.driver.to_string())?;
        dict.set_item("cuda", query.cuda.to_string())?;
        dict.set_item("torch", query.torch)?;
        Ok(dict)
    }

    /// Every kernel and whether it can load on the device, as text: `available: prebuilt
    /// cu130/sm_90a: <why it fits>`, `available: jit-compiled …`, or `unavailable: <why>`.
    /// Never compiles, never creates a context.
    #[pyo3(signature = (device=None))]
    fn status(&self, py: Python<'_>, device: Option<u32>) -> BTreeMap<String, String> {
        let registry = Arc::clone(&self.inner);
        let ordinal = self.ordinal(device);
        py.detach(move || registry.status_on(ordinal))
            .into_iter()
            .map(|(name, status)| (name, status_text(&status)))
            .collect()
    }

    /// Whether kernel `name` can load on the device.
    #[pyo3(signature = (name, device=None))]
    fn is_available(&self, py: Python<'_>, name: &str, device: Option<u32>) -> bool {
        self.unavailable_reason(py, name, device).is_none()
    }

    /// Why kernel `name` cannot load on the device, or `None` when it can.
    #[pyo3(signature = (name, device=None))]
    fn unavailable_reason(
        &self,
        py: Python<'_>,
        name: &str,
        device: Option<u32>,
    ) -> Option<String> {
        let registry = Arc::clone(&self.inner);
        let ordinal = self.ordinal(device);
        match py.detach(move || registry.plan_on(name, ordinal).status()) {
            Status::Available { .. } => None,
            Status::Unavailable { reason } => Some(reason),
        }
    }

    /// Kernel `name`, loaded on the device (an ordinal; `None`: the registry's): the prebuilt
    /// cubin that fits that device (its sha256 checked first), else, when allowed, the JIT
    /// fallback's. Loaded once per device; later calls return the same kernel.
    #[pyo3(signature = (name, device=None))]
    fn load(&self, py: Python<'_>, name: &str, device: Option<u32>) -> PyResult<Kernel> {
        let registry = Arc::clone(&self.inner);
        let ordinal = self.ordinal(device);
        let kernel = py
            .detach(move || registry.load_on(name, ordinal))
            .map_err(|error| load_error(py, &error))?;
        Ok(Kernel::new(kernel, Arc::clone(&self.inner)))
    }

    /// Every kernel this registry has loaded, on every device.
    fn loaded(&self, py: Python<'_>) -> Vec<Kernel> {
        let registry = Arc::clone(&self.inner);
        py.detach(move || registry.loaded())
            .into_iter()
            .map(|kernel| Kernel::new(kernel, Arc::clone(&self.inner)))
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "Registry({:?}, package={:?}, device={})",
            self.inner.catalog().root().display().to_string(),
            self.inner.meta().package,
            self.inner.options().device
        )
    }
}

impl Registry {
    /// `device`, else the registry's own device.
    fn ordinal(&self, device: Option<u32>) -> u32 {
        device.unwrap_or(self.inner.options().device)
    }
}

/// `available: prebuilt cu130/sm_90a: <reason>` or `unavailable: <reason>`.
fn status_text(status: &Status) -> String {
    match status {
        Status::Available {
            variant,
            reason,
            provenance,
            ..
        } => format!("available: {provenance} {variant}: {reason}"),
        Status::Unavailable { reason } => format!("unavailable: {reason}"),
    }
}

/// `"sm_90"`, `"sm_90a"`, `"9.0"`, or `(9, 0)`.
fn parse_device(device: &Bound<'_, PyAny>) -> PyResult<(u32, u32)> {
    if let Ok(text) = device.extract::<String>() {
        return DeviceQuery::parse_device(&text).map_err(value_error);
    }
    if let Ok(tuple) = device.cast::<PyTuple>() {
        if let Ok((major, minor)) = tuple.extract::<(u32, u32)>() {
            return Ok((major, minor));
        }
    }
    Err(PyTypeError::new_err(format!(
        "device must be a string like \"sm_90\" or \"9.0\", or a tuple like (9, 0), not {}",
        device.repr()?
    )))
}

fn value_error(error: impl std::error::Error) -> PyErr {
    PyValueError::new_err(crate::errors::chain(&error))
}

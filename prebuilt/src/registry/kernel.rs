//! A loaded kernel: its module on one device, its entry functions, and launches whose
//! arguments are checked against the parameter sizes the index records. A kernel launches only
//! in the primary context of the device it was loaded on.
//!
//! A launch that asks for more than a plain one is checked against the device before the
//! driver sees it ([`LaunchRefusal`] says why not), from [`LaunchFacts`] asked once per entry:
//!
//! | asked | checked | then |
//! | --- | --- | --- |
//! | dynamic shared memory above the entry's current limit | at most the device's opt-in maximum less the entry's static shared memory | the limit is raised to it, never lowered |
//! | `cluster` | compute capability 9.0+, the device launches clusters, the grid a multiple of the cluster in each dimension, at most 8 blocks unless the entry allows non-portable sizes | `cuLaunchKernelEx` |
//! | `cooperative` | the device launches cooperatively, and the whole grid fits at once (occupancy × multiprocessors) | `cuLaunchKernelEx` |
//! | `programmatic` | compute capability 9.0+ | `cuLaunchKernelEx` |
//! | `priority` | | `cuLaunchKernelEx` |
//! | any attribute | the driver exports `cuLaunchKernelEx` | |
//!
//! A plain launch within the entry's current shared memory asks the driver nothing more than
//! `cuLaunchKernel`: one atomic load decides it. The entry's dynamic shared memory limit is
//! kept in an atomic (`LaunchState`); raising it happens under a lock, and only to a larger
//! value, so two threads asking for different sizes cannot lower what the other set, and a
//! launch that reads a limit at or above its own size knows the driver already has it.

use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use crate::driver::{Context, DeviceBuffer, LaunchAttributes, LaunchConfig};

/// A loaded kernel: its module, entries and constants. Cheap to clone.
#[derive(Clone)]
pub struct Kernel {
    pub(super) inner: Arc<KernelInner>,
}

#[derive(Clone)]
pub(super) struct KernelInner {
    pub(super) name: String,
    pub(super) device: u32,
    pub(super) variant: String,
    pub(super) reason: String,
    pub(super) provenance: Provenance,
    pub(super) location: Option<ArtifactLocation>,
    pub(super) constants: BTreeMap<String, Constant>,
    pub(super) structs: Arc<BTreeMap<String, StructLayout>>,
    pub(super) functions: Vec<Function>,
    pub(super) module: Arc<dyn LoadedModule>,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.inner.name)
            .field("device", &self.inner.device)
            .field("provenance", &self.inner.provenance)
            .finish_non_exhaustive()
    }
}

impl Kernel {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Where its cubin came from, with the key.
    pub fn provenance(&self) -> &Provenance {
        &self.inner.provenance
    }

    /// The ordinal of the device it is loaded on, and launches on.
    pub fn device(&self) -> u32 {
        self.inner.device
    }

    /// The variant it runs: the prebuilt variant's label (`cu130/sm_90a`), or for the JIT the
    /// build and architecture it was compiled for.
    pub fn variant(&self) -> &str {
        &self.inner.variant
    }

    /// The name of the profiler and NVTX range that marks its launches:
    /// `kwheel:<kernel> <variant> <source> <key, 12 hex digits> cuda:<device>`, as
    /// `kwheel:layernorm_bf16 cu130/sm_90a prebuilt 3f2a9c01b7d4 cuda:0` (see
    /// `docs/provenance.md`).
    pub fn trace_label(&self) -> String {
        trace_label(
            &self.inner.name,
            &self.inner.variant,
            &self.inner.provenance.kind().to_string(),
            self.inner.provenance.key(),
            self.inner.device,
        )
    }

    /// Why this cubin was chosen (or compiled).
    pub fn reason(&self) -> &str {
        &self.inner.reason
    }

    /// Where a prebuilt cubin was read from: the wheel, or the artifact cache (after a
    /// download, or from an earlier one). `None` for the JIT.
    pub fn location(&self) -> Option<ArtifactLocation> {
        self.inner.location
    }

    /// The manifest's exported constants (`BLOCK_SIZE`), so callers never hard-code them.
    pub fn constants(&self) -> &BTreeMap<String, Constant> {
        &self.inner.constants
    }

    /// The layout of each C struct the manifest names (`structs`), as the loaded variant's
    /// compile computed it; empty for a JIT compile.
    pub fn structs(&self) -> &BTreeMap<String, StructLayout> {
        &self.inner.structs
    }

    /// Every entry, in declaration order.
    pub fn functions(&self) -> &[Function] {
        &self.inner.functions
    }

    /// The entry declared as `entry` (`scale_rows<float>`), or with that symbol.
    pub fn function(&self, entry: &str) -> Result<Function, LoadError> {
        self.find_function(entry).cloned()
    }

    fn find_function(&self, entry: &str) -> Result<&Function, LoadError> {
        self.inner
            .functions
            .iter()
            .find(|function| function.entry.name == entry || function.entry.symbol == entry)
            .ok_or_else(|| LoadError::UnknownEntry {
                kernel: self.inner.name.clone(),
                entry: entry.to_owned(),
                entries: self
                    .inner
                    .functions
                    .iter()
                    .map(|function| function.entry.name.clone())
                    .collect(),
            })
    }

    /// The primary context the kernel is loaded in, to allocate [`DeviceBuffer`]s in; `None`
    /// on a device that is not CUDA's (a test's fake).
    pub fn context(&self) -> Option<&Arc<Context>> {
        self.inner.module.context()
    }

    /// Launches `entry` on the legacy default stream (0). The arguments are checked against
    /// the parameter sizes the index records before anything is launched.
    ///
    /// # Safety
    ///
    /// As [`Function::launch`]: every pointer argument must be a device address the kernel
    /// may access over the whole range it accesses, alive until the kernel finishes.
    pub unsafe fn launch(
        &self,
        entry: &str,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        args: &[KernelArg],
    ) -> Result<(), LoadError> {
        let config = LaunchConfig {
            grid,
            block,
            shared_mem_bytes,
            stream: 0,
        };
        // SAFETY: the caller upholds `Function::launch`'s contract for these arguments.
        unsafe { self.launch_with(entry, &config, args) }
    }

    /// Launches `entry` with `config`, on `config.stream` (PyTorch's current stream, say).
    ///
    /// # Safety
    ///
    /// As [`Function::launch`].
    pub unsafe fn launch_with(
        &self,
        entry: &str,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), LoadError> {
        // SAFETY: the caller upholds `Function::launch`'s contract for these arguments.
        unsafe { self.find_function(entry)?.launch(config, args) }
    }

    /// Launches `entry` with `config` and launch `attributes` (a cluster, a cooperative or
    /// programmatic launch, a priority), checked against the device first; see
    /// [`Function::launch_with_attributes`].
    ///
    /// # Safety
    ///
    /// As [`Function::launch`].
    pub unsafe fn launch_with_attributes(
        &self,
        entry: &str,
        config: &LaunchConfig,
        attributes: &LaunchAttributes,
        args: &[KernelArg],
    ) -> Result<(), LoadError> {
        // SAFETY: the caller upholds `Function::launch`'s contract for these arguments.
        unsafe {
            self.find_function(entry)?
                .launch_with_attributes(config, attributes, args)
        }
    }
}

/// How many hex digits of a key a trace label and `provenance()` show.
pub const SHORT_KEY_DIGITS: usize = 12;

/// The range name of [`Kernel::trace_label`]; `source` is a [`ProvenanceKind`]'s name, or
/// `fallback` for a torch op that ran its reference instead (with no key: `-`).
pub fn trace_label(
    kernel: &str,
    variant: &str,
    source: &str,
    key: &str,
    device: impl fmt::Display,
) -> String {
    let short = match key.get(..SHORT_KEY_DIGITS).unwrap_or(key) {
        "" => "-",
        short => short,
    };
    format!("kwheel:{kernel} {variant} {source} {short} cuda:{device}")
}

/// One kernel argument, by value: its bytes are what the kernel's parameter receives.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelArg {
    /// A device pointer (8 bytes), from [`DeviceBuffer::pointer`] or `tensor.data_ptr()`.
    Ptr(u64),
    /// An `int`.
    I32(i32),
    /// An `unsigned int`.
    U32(u32),
    /// A `long long` / `int64_t`.
    I64(i64),
    /// An `unsigned long long` / `uint64_t`.
    U64(u64),
    /// A `float`.
    F32(f32),
    /// A `double`.
    F64(f64),
    /// Any other parameter (a struct, a `char`), as its exact bytes.
    Bytes(Vec<u8>),
}

impl KernelArg {
    /// The argument's size in bytes.
    pub fn size(&self) -> usize {
        match self {
            KernelArg::I32(_) | KernelArg::U32(_) | KernelArg::F32(_) => 4,
            KernelArg::Ptr(_) | KernelArg::I64(_) | KernelArg::U64(_) | KernelArg::F64(_) => 8,
            KernelArg::Bytes(bytes) => bytes.len(),
        }
    }

    /// The argument's bytes, as the parameter receives them (native byte order).
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            KernelArg::Ptr(value) | KernelArg::U64(value) => value.to_ne_bytes().to_vec(),
            KernelArg::I32(value) => value.to_ne_bytes().to_vec(),
            KernelArg::U32(value) => value.to_ne_bytes().to_vec(),
            KernelArg::I64(value) => value.to_ne_bytes().to_vec(),
            KernelArg::F32(value) => value.to_ne_bytes().to_vec(),
            KernelArg::F64(value) => value.to_ne_bytes().to_vec(),
            KernelArg::Bytes(bytes) => bytes.clone(),
        }
    }
}

impl From<&DeviceBuffer> for KernelArg {
    fn from(buffer: &DeviceBuffer) -> Self {
        KernelArg::Ptr(buffer.pointer())
    }
}

/// One entry of a loaded kernel, ready to launch.
#[derive(Clone)]
pub struct Function {
    pub(super) kernel: String,
    pub(super) variant: String,
    pub(super) device: String,
    pub(super) entry: EntryRecord,
    /// The kernel's struct layouts on the loaded variant, shared by its entries.
    pub(super) structs: Arc<BTreeMap<String, StructLayout>>,
    pub(super) module: Arc<dyn LoadedModule>,
    pub(super) index: usize,
    /// Shared by every clone: one per entry function the driver loaded.
    pub(super) launch: Arc<LaunchState>,
}

/// What one loaded entry function's launches keep between calls.
#[derive(Debug, Default)]
pub(super) struct LaunchState {
    /// The dynamic shared memory the driver lets a launch ask for, in bytes, as last read or
    /// raised; 0 until first needed. Written only while `raising` is held.
    dynamic_shared_memory: AtomicU32,
    /// Held while the limit is read or raised, so that the driver sees only ever-larger
    /// values, in order.
    raising: Mutex<()>,
    /// The device's and the function's facts, asked once.
    facts: OnceLock<LaunchFacts>,
}

impl fmt::Debug for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Function")
            .field("kernel", &self.kernel)
            .field("entry", &self.entry)
            .finish_non_exhaustive()
    }
}

impl Function {
    /// The entry as declared (`scale_rows<float>`).
    pub fn name(&self) -> &str {
        &self.entry.name
    }

    /// The symbol in the cubin (mangled for a template).
    pub fn symbol(&self) -> &str {
        &self.entry.symbol
    }

    /// The constants the compiler computed for this entry on the loaded variant (`computed`).
    pub fn computed(&self) -> &BTreeMap<String, i64> {
        &self.entry.computed
    }

    /// The kernel's struct layouts on the loaded variant (`structs`), to check a struct
    /// argument field by field; empty for a JIT compile.
    pub fn structs(&self) -> &BTreeMap<String, StructLayout> {
        &self.structs
    }

    /// Each parameter's size in bytes, from the index.
    pub fn param_sizes(&self) -> &[u32] {
        &self.entry.param_sizes
    }

    /// Checks `args` against the parameter sizes: the count, then each size in order.
    pub fn check_arguments(&self, args: &[KernelArg]) -> Result<(), LoadError> {
        check_arguments(&self.kernel, &self.entry, args)
    }

    /// Launches the entry after checking the arguments against the recorded parameter sizes.
    /// Dynamic shared memory above the entry's current limit raises the limit first, up to
    /// what the device allows ([`Function::prepare`]).
    ///
    /// # Safety
    ///
    /// The sizes are checked, their meaning cannot be: every pointer argument must be a device
    /// address the kernel may access over the whole range it accesses, alive until the kernel
    /// finishes, and `config.stream` 0 or a live stream of the kernel's context. A kernel
    /// given wrong pointers can write anywhere the device reaches, host memory included on
    /// systems with unified memory.
    pub unsafe fn launch(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), LoadError> {
        // SAFETY: the caller upholds this function's contract.
        unsafe { self.launch_with_attributes(config, &LaunchAttributes::default(), args) }
    }

    /// Launches the entry with launch `attributes`, after checking the arguments against the
    /// recorded parameter sizes and the launch against the device ([`Function::prepare`]):
    /// through `cuLaunchKernelEx` when there are attributes, `cuLaunchKernel` otherwise. Either
    /// is captured into a CUDA graph when `config.stream` is capturing.
    ///
    /// # Safety
    ///
    /// As [`Function::launch`].
    pub unsafe fn launch_with_attributes(
        &self,
        config: &LaunchConfig,
        attributes: &LaunchAttributes,
        args: &[KernelArg],
    ) -> Result<(), LoadError> {
        self.check_arguments(args)?;
        self.prepare(config, attributes)?;
        let images: Vec<Vec<u8>> = args.iter().map(KernelArg::to_bytes).collect();
        let params: Vec<&[u8]> = images.iter().map(Vec::as_slice).collect();
        let launched = if attributes.is_empty() {
            // SAFETY: the count and sizes match the cubin's parameters (checked above), and the
            // launch fits the device; the caller vouches for the pointers and the stream.
            unsafe { self.module.launch(self.index, config, &params) }
        } else {
            // SAFETY: as above; the attributes were checked against the device too.
            unsafe {
                self.module
                    .launch_with_attributes(self.index, config, attributes, &params)
            }
        };
        launched.map_err(|error| self.driver_error(error))
    }

    /// Checks a launch of `config` with `attributes` against the device, and raises the
    /// entry's dynamic shared memory limit when `config` asks for more than it. A plain launch
    /// within the current limit asks the driver nothing.
    pub fn prepare(
        &self,
        config: &LaunchConfig,
        attributes: &LaunchAttributes,
    ) -> Result<(), LoadError> {
        let asked = config.shared_mem_bytes;
        let more_shared_memory = asked > self.launch.dynamic_shared_memory.load(Ordering::Acquire);
        if attributes.is_empty() && !more_shared_memory {
            return Ok(());
        }
        let facts = self.facts()?;
        check_launch(&facts, config, attributes).map_err(|refusal| self.refused(refusal))?;
        if more_shared_memory {
            self.raise_dynamic_shared_memory(&facts, asked)?;
        }
        if attributes.cooperative {
            // After the raise, so that the occupancy is asked of a size the function allows.
            let threads = block_threads(config);
            let per_multiprocessor = self
                .module
                .max_active_blocks_per_multiprocessor(self.index, threads, asked)
                .map_err(|error| self.driver_error(error))?;
            check_cooperative_grid(&facts, config, per_multiprocessor)
                .map_err(|refusal| self.refused(refusal))?;
        }
        Ok(())
    }

    /// The facts of the entry and its device, asked of the driver the first time.
    fn facts(&self) -> Result<LaunchFacts, LoadError> {
        if let Some(facts) = self.launch.facts.get() {
            return Ok(*facts);
        }
        let facts = self
            .module
            .launch_facts(self.index)
            .map_err(|error| self.driver_error(error))?;
        Ok(*self.launch.facts.get_or_init(|| facts))
    }

    /// Makes the driver allow `asked` bytes of dynamic shared memory (checked against the cap
    /// already): raised only when above what it allows, and only ever upwards.
    fn raise_dynamic_shared_memory(
        &self,
        facts: &LaunchFacts,
        asked: u32,
    ) -> Result<(), LoadError> {
        let state = &self.launch;
        let _raising = state.raising.lock().unwrap_or_else(PoisonError::into_inner);
        // What the driver allows now: the attribute as the function was loaded, or as a
        // launch before this one raised it.
        let allowed = state
            .dynamic_shared_memory
            .load(Ordering::Acquire)
            .max(facts.function.max_dynamic_shared_memory);
        if asked > allowed {
            self.module
                .set_max_dynamic_shared_memory(self.index, asked)
                .map_err(|error| self.driver_error(error))?;
        }
        // Published after the driver has it: a launch that reads this value needs no raise.
        state
            .dynamic_shared_memory
            .store(asked.max(allowed), Ordering::Release);
        Ok(())
    }

    fn refused(&self, refusal: LaunchRefusal) -> LoadError {
        LoadError::Launch(Box::new(LaunchRefused {
            kernel: self.kernel.clone(),
            entry: self.entry.name.clone(),
            variant: self.variant.clone(),
            device: self.device.clone(),
            refusal,
        }))
    }

    fn driver_error(&self, error: DriverError) -> LoadError {
        LoadError::driver(error, "launch", &self.kernel, &self.variant, &self.device)
    }
}

/// A launch refused before the driver saw it: the entry, its kernel and device, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot launch `{entry}` of `{kernel}` ({variant}) on {device}")]
pub struct LaunchRefused {
    /// The kernel.
    pub kernel: String,
    /// The entry, as declared.
    pub entry: String,
    /// The variant label, or the JIT target.
    pub variant: String,
    /// The device, CUDA build and driver.
    pub device: String,
    /// Why.
    #[source]
    pub refusal: LaunchRefusal,
}

/// Why a launch cannot run on its device as asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LaunchRefusal {
    /// More dynamic shared memory than the device allows the entry.
    #[error(
        "it asks for {asked} bytes of dynamic shared memory, but at most {limit} are possible: \
         the device allows {optin} bytes per block, and the entry has {static_shared_memory} \
         bytes of static shared memory"
    )]
    SharedMemory {
        /// The bytes asked for.
        asked: u32,
        /// The most it can ask for: `optin - static_shared_memory`.
        limit: u32,
        /// The device's opt-in maximum per block.
        optin: u32,
        /// The entry's static shared memory.
        static_shared_memory: u32,
    },
    /// Launch attributes, and a driver without `cuLaunchKernelEx`.
    #[error(
        "{} needs `cuLaunchKernelEx`, which this CUDA driver does not export; update the NVIDIA \
         driver (one for CUDA 12.0 or later has it)",
        describe_attributes(.attributes)
    )]
    NoLaunchAttributes {
        /// What was asked for.
        attributes: LaunchAttributes,
    },
    /// A cluster on a device before compute capability 9.0, or one that does not launch
    /// clusters.
    #[error(
        "a cluster of {} needs a device that launches thread block clusters (compute \
         capability 9.0 or later); this one is {}.{}",
        dims(.cluster), .capability.0, .capability.1
    )]
    ClusterDevice {
        /// The cluster asked for.
        cluster: [u32; 3],
        /// The device's compute capability.
        capability: (u32, u32),
    },
    /// A grid that is not a whole number of clusters.
    #[error(
        "the grid {} is not divisible by the cluster {}: each grid dimension must be a multiple \
         of the cluster's",
        dims(.grid), dims(.cluster)
    )]
    ClusterGrid {
        /// The grid.
        grid: [u32; 3],
        /// The cluster.
        cluster: [u32; 3],
    },
    /// A cluster of more blocks than a portable cluster, for an entry that does not allow it.
    #[error(
        "a cluster of {} holds {blocks} blocks, more than the {PORTABLE_CLUSTER_BLOCKS} of a \
         portable cluster, and the entry does not allow non-portable cluster sizes \
         (CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)",
        dims(.cluster)
    )]
    ClusterSize {
        /// The cluster.
        cluster: [u32; 3],
        /// Its blocks.
        blocks: u64,
    },
    /// A programmatic dependent launch before compute capability 9.0.
    #[error(
        "programmatic dependent launch needs compute capability 9.0 or later; this device is \
         {}.{}",
        .capability.0, .capability.1
    )]
    ProgrammaticDevice {
        /// The device's compute capability.
        capability: (u32, u32),
    },
    /// A cooperative launch on a device that has none.
    #[error(
        "the device does not launch cooperatively (CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH is 0)"
    )]
    CooperativeDevice,
    /// A cooperative grid larger than what the device holds at once.
    #[error(
        "a cooperative launch needs every block resident at once: the grid {} has {blocks} \
         blocks, but at most {resident} fit ({per_multiprocessor} per multiprocessor × \
         {multiprocessors} multiprocessors, at {block_threads} threads and {shared_memory} bytes \
         of dynamic shared memory per block)",
        dims(.grid)
    )]
    CooperativeGrid {
        /// The grid.
        grid: [u32; 3],
        /// Its blocks.
        blocks: u64,
        /// How many fit at once.
        resident: u64,
        /// Blocks of this size one multiprocessor holds.
        per_multiprocessor: u32,
        /// The device's multiprocessors.
        multiprocessors: u32,
        /// Threads per block.
        block_threads: u32,
        /// Dynamic shared memory per block.
        shared_memory: u32,
    },
}

/// The most blocks a cluster may hold on every device that launches clusters.
pub const PORTABLE_CLUSTER_BLOCKS: u64 = 8;

/// Threads per block (saturated: the driver refuses a block of more than 1024 anyway).
fn block_threads(config: &LaunchConfig) -> u32 {
    config
        .block
        .iter()
        .fold(1u32, |threads, &side| threads.saturating_mul(side))
}

/// `(2, 1, 1)`, as Python writes a tuple.
fn dims(dims: &[u32; 3]) -> String {
    format!("({}, {}, {})", dims[0], dims[1], dims[2])
}

/// `a launch with cluster (2, 1, 1) and priority -1`.
fn describe_attributes(attributes: &LaunchAttributes) -> String {
    let mut asked = Vec::new();
    if let Some(cluster) = &attributes.cluster {
        asked.push(format!("cluster {}", dims(cluster)));
    }
    if attributes.cooperative {
        asked.push("cooperative".to_owned());
    }
    if attributes.programmatic {
        asked.push("programmatic".to_owned());
    }
    if let Some(priority) = attributes.priority {
        asked.push(format!("priority {priority}"));
    }
    format!("a launch with {}", asked.join(" and "))
}

/// The checks of a launch that need no occupancy: see the module's table.
fn check_launch(
    facts: &LaunchFacts,
    config: &LaunchConfig,
    attributes: &LaunchAttributes,
) -> Result<(), LaunchRefusal> {
    let sm_90_or_later = facts.capability >= (9, 0);
    if let Some(cluster) = attributes.cluster {
        if !sm_90_or_later || !facts.device.cluster_launch {
            return Err(LaunchRefusal::ClusterDevice {
                cluster,
                capability: facts.capability,
            });
        }
        if config
            .grid
            .iter()
            .zip(&cluster)
            .any(|(grid, cluster)| grid % cluster != 0)
        {
            return Err(LaunchRefusal::ClusterGrid {
                grid: config.grid,
                cluster,
            });
        }
        let blocks = cluster.iter().map(|&side| u64::from(side)).product();
        if blocks > PORTABLE_CLUSTER_BLOCKS && !facts.function.non_portable_cluster_size_allowed {
            return Err(LaunchRefusal::ClusterSize { cluster, blocks });
        }
    }
    if attributes.programmatic && !sm_90_or_later {
        return Err(LaunchRefusal::ProgrammaticDevice {
            capability: facts.capability,
        });
    }
    if attributes.cooperative && !facts.device.cooperative_launch {
        return Err(LaunchRefusal::CooperativeDevice);
    }
    let optin = facts.device.shared_memory_per_block_optin;
    let static_shared_memory = facts.function.static_shared_memory;
    let limit = optin.saturating_sub(static_shared_memory);
    if config.shared_mem_bytes > limit {
        return Err(LaunchRefusal::SharedMemory {
            asked: config.shared_mem_bytes,
            limit,
            optin,
            static_shared_memory,
        });
    }
    if !attributes.is_empty() && !facts.launch_attributes {
        return Err(LaunchRefusal::NoLaunchAttributes {
            attributes: *attributes,
        });
    }
    Ok(())
}

/// A cooperative grid fits when all its blocks are resident at once: `per_multiprocessor`
/// blocks of its size on each of the device's multiprocessors.
fn check_cooperative_grid(
    facts: &LaunchFacts,
    config: &LaunchConfig,
    per_multiprocessor: u32,
) -> Result<(), LaunchRefusal> {
    let blocks: u64 = config.grid.iter().map(|&side| u64::from(side)).product();
    let multiprocessors = facts.device.multiprocessors;
    let resident = u64::from(per_multiprocessor) * u64::from(multiprocessors);
    if blocks > resident {
        return Err(LaunchRefusal::CooperativeGrid {
            grid: config.grid,
            blocks,
            resident,
            per_multiprocessor,
            multiprocessors,
            block_threads: block_threads(config),
            shared_memory: config.shared_mem_bytes,
        });
    }
    Ok(())
}

pub(super) fn check_arguments(
    kernel: &str,
    entry: &EntryRecord,
    args: &[KernelArg],
) -> Result<(), LoadError> {
    if args.len() != entry.param_sizes.len() {
        return Err(LoadError::ArgumentCount {
            kernel: kernel.to_owned(),
            entry: entry.name.clone(),
            expected: entry.param_sizes.clone(),
            given: args.iter().map(KernelArg::size).collect(),
        });
    }
    for (index, (arg, &expected)) in args.iter().zip(&entry.param_sizes).enumerate() {
        if arg.size() != expected as usize {
            return Err(LoadError::Argument {
                kernel: kernel.to_owned(),
                entry: entry.name.clone(),
                index,
                expected,
                given: arg.size(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::DriverError;

    fn entry() -> EntryRecord {
        EntryRecord {
            computed: Default::default(),
            name: "layernorm_bf16".into(),
            symbol: "layernorm_bf16".into(),
            param_sizes: vec![8, 8, 8, 8, 4, 4, 4],
        }
    }

    fn good_args() -> Vec<KernelArg> {
        vec![
            KernelArg::Ptr(1),
            KernelArg::Ptr(2),
            KernelArg::Ptr(3),
            KernelArg::Ptr(4),
            KernelArg::I32(37),
            KernelArg::I32(300),
            KernelArg::F32(1e-5),
        ]
    }

    #[test]
    fn loaded_things_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Registry>();
        send_sync::<Kernel>();
        send_sync::<Function>();
        send_sync::<LoadError>();
    }

    #[test]
    fn matching_arguments_pass() {
        check_arguments("layernorm_bf16", &entry(), &good_args()).unwrap();
    }

    #[test]
    fn a_wrong_size_names_the_parameter() {
        let mut args = good_args();
        args[5] = KernelArg::I64(300);
        let error = check_arguments("layernorm_bf16", &entry(), &args).unwrap_err();
        assert!(matches!(
            error,
            LoadError::Argument {
                index: 5,
                expected: 4,
                given: 8,
                ..
            }
        ));
        assert_eq!(
            error.to_string(),
            "argument 5 of `layernorm_bf16` (kernel `layernorm_bf16`) is 8 bytes, but parameter \
             5 is 4 bytes"
        );
    }

    #[test]
    fn a_wrong_count_lists_the_parameters() {
        let mut args = good_args();
        args.pop();
        let error = check_arguments("layernorm_bf16", &entry(), &args).unwrap_err();
        assert_eq!(
            error.to_string(),
            "`layernorm_bf16` (kernel `layernorm_bf16`) takes 7 arguments of 8, 8, 8, 8, 4, 4, 4 \
             bytes, but 6 were given"
        );
    }

    /// A device whose driver keeps one function's dynamic shared memory limit and refuses a
    /// launch above it, as the real one does; it records what it was asked.
    struct FakeGpu {
        facts: LaunchFacts,
        /// Blocks per multiprocessor, as the occupancy calculator answers.
        per_multiprocessor: u32,
        /// The function's `MAX_DYNAMIC_SHARED_SIZE_BYTES`, as the driver holds it.
        limit: Mutex<u32>,
        /// Every value it was set to, in order.
        raises: Mutex<Vec<u32>>,
        /// How often the facts were asked.
        asked: AtomicU32,
        /// Every launch that reached the driver.
        launches: Mutex<Vec<(LaunchConfig, LaunchAttributes)>>,
    }

    /// An H200 as the driver describes it, with a function of no static shared memory.
    fn h200() -> LaunchFacts {
        LaunchFacts {
            capability: (9, 0),
            device: crate::driver::DeviceLimits {
                multiprocessors: 132,
                shared_memory_per_block_optin: 232_448,
                cluster_launch: true,
                cooperative_launch: true,
            },
            function: crate::driver::FunctionAttributes {
                static_shared_memory: 0,
                max_dynamic_shared_memory: 49_152,
                non_portable_cluster_size_allowed: false,
            },
            launch_attributes: true,
        }
    }

    /// An A100: no clusters, no programmatic launch.
    fn a100() -> LaunchFacts {
        let mut facts = h200();
        facts.capability = (8, 0);
        facts.device.multiprocessors = 108;
        facts.device.shared_memory_per_block_optin = 166_912;
        facts.device.cluster_launch = false;
        facts
    }

    impl FakeGpu {
        fn new(facts: LaunchFacts) -> Arc<FakeGpu> {
            Arc::new(FakeGpu {
                facts,
                per_multiprocessor: 2,
                limit: Mutex::new(facts.function.max_dynamic_shared_memory),
                raises: Mutex::new(Vec::new()),
                asked: AtomicU32::new(0),
                launches: Mutex::new(Vec::new()),
            })
        }

        fn record(
            &self,
            config: &LaunchConfig,
            attributes: &LaunchAttributes,
        ) -> Result<(), DriverError> {
            if config.shared_mem_bytes > *self.limit.lock().unwrap() {
                return Err(DriverError::Call {
                    call: "cuLaunchKernel",
                    code: 1,
                    name: "CUDA_ERROR_INVALID_VALUE".to_owned(),
                    description: "invalid argument".to_owned(),
                });
            }
            self.launches.lock().unwrap().push((*config, *attributes));
            Ok(())
        }

        fn raises(&self) -> Vec<u32> {
            self.raises.lock().unwrap().clone()
        }

        fn launches(&self) -> Vec<(LaunchConfig, LaunchAttributes)> {
            self.launches.lock().unwrap().clone()
        }
    }

    impl LoadedModule for FakeGpu {
        fn context(&self) -> Option<&Arc<Context>> {
            None
        }

        unsafe fn launch(
            &self,
            _: usize,
            config: &LaunchConfig,
            _: &[&[u8]],
        ) -> Result<(), DriverError> {
            self.record(config, &LaunchAttributes::default())
        }

        fn launch_facts(&self, _: usize) -> Result<LaunchFacts, DriverError> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            Ok(self.facts)
        }

        fn set_max_dynamic_shared_memory(&self, _: usize, bytes: u32) -> Result<(), DriverError> {
            let mut limit = self.limit.lock().unwrap();
            // Slow, so that threads asking at once overlap.
            std::thread::sleep(std::time::Duration::from_micros(200));
            *limit = bytes;
            self.raises.lock().unwrap().push(bytes);
            Ok(())
        }

        fn max_active_blocks_per_multiprocessor(
            &self,
            _: usize,
            _: u32,
            _: u32,
        ) -> Result<u32, DriverError> {
            Ok(self.per_multiprocessor)
        }

        unsafe fn launch_with_attributes(
            &self,
            _: usize,
            config: &LaunchConfig,
            attributes: &LaunchAttributes,
            _: &[&[u8]],
        ) -> Result<(), DriverError> {
            self.record(config, attributes)
        }
    }

    fn function_on(gpu: &Arc<FakeGpu>) -> Function {
        Function {
            structs: Default::default(),
            kernel: "attention".into(),
            variant: "cu130/sm_90a".into(),
            device: "device 0 (sm_90, compute 9.0), CUDA build cu130, driver 13.0".into(),
            entry: EntryRecord {
                computed: Default::default(),
                name: "attention_fwd".into(),
                symbol: "attention_fwd".into(),
                param_sizes: vec![8],
            },
            module: Arc::clone(gpu) as Arc<dyn LoadedModule>,
            index: 0,
            launch: Arc::default(),
        }
    }

    fn config(grid: [u32; 3], block: [u32; 3], shared_mem_bytes: u32) -> LaunchConfig {
        LaunchConfig {
            grid,
            block,
            shared_mem_bytes,
            stream: 0,
        }
    }

    /// Launches `function` with `attributes`; the message of its error, if any.
    fn launch(
        function: &Function,
        config: &LaunchConfig,
        attributes: LaunchAttributes,
    ) -> Result<(), String> {
        // SAFETY: the fake device reads no pointer.
        unsafe { function.launch_with_attributes(config, &attributes, &[KernelArg::Ptr(0)]) }
            .map_err(|error| crate::error_chain(&error))
    }

    fn cluster(cluster: [u32; 3]) -> LaunchAttributes {
        LaunchAttributes {
            cluster: Some(cluster),
            ..LaunchAttributes::default()
        }
    }

    #[test]
    fn a_plain_launch_asks_the_driver_nothing_more() {
        let gpu = FakeGpu::new(h200());
        let function = function_on(&gpu);
        for _ in 0..3 {
            launch(
                &function,
                &config([4, 1, 1], [128, 1, 1], 0),
                Default::default(),
            )
            .unwrap();
        }
        assert_eq!(gpu.asked.load(Ordering::SeqCst), 0);
        // Within the function's default limit: the facts once, no raise.
        for _ in 0..3 {
            launch(
                &function,
                &config([4, 1, 1], [128, 1, 1], 16_384),
                Default::default(),
            )
            .unwrap();
        }
        assert_eq!(gpu.asked.load(Ordering::SeqCst), 1);
        assert_eq!(gpu.raises(), Vec::<u32>::new());
        assert_eq!(gpu.launches().len(), 6);
    }

    #[test]
    fn shared_memory_above_the_default_raises_the_limit_once_and_never_lowers_it() {
        let gpu = FakeGpu::new(h200());
        let function = function_on(&gpu);
        let plain = LaunchAttributes::default();
        launch(&function, &config([1, 1, 1], [256, 1, 1], 102_400), plain).unwrap();
        launch(&function, &config([1, 1, 1], [256, 1, 1], 102_400), plain).unwrap();
        launch(&function, &config([1, 1, 1], [256, 1, 1], 65_536), plain).unwrap();
        assert_eq!(gpu.raises(), [102_400]);
        // A clone shares the limit: it is the same function on the device.
        let clone = function.clone();
        launch(&clone, &config([1, 1, 1], [256, 1, 1], 232_448), plain).unwrap();
        launch(&function, &config([1, 1, 1], [256, 1, 1], 102_400), plain).unwrap();
        assert_eq!(gpu.raises(), [102_400, 232_448]);
        assert_eq!(gpu.asked.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn shared_memory_above_the_cap_is_refused_before_the_driver_sees_it() {
        let mut facts = h200();
        facts.function.static_shared_memory = 1_024;
        let gpu = FakeGpu::new(facts);
        let function = function_on(&gpu);
        let error = launch(
            &function,
            &config([1, 1, 1], [256, 1, 1], 232_448),
            LaunchAttributes::default(),
        )
        .unwrap_err();
        assert_eq!(
            error,
            "cannot launch `attention_fwd` of `attention` (cu130/sm_90a) on device 0 (sm_90, \
             compute 9.0), CUDA build cu130, driver 13.0: it asks for 232448 bytes of dynamic \
             shared memory, but at most 231424 are possible: the device allows 232448 bytes per \
             block, and the entry has 1024 bytes of static shared memory"
        );
        assert_eq!(gpu.raises(), Vec::<u32>::new());
        assert!(gpu.launches().is_empty());
        // Exactly the cap launches.
        launch(
            &function,
            &config([1, 1, 1], [256, 1, 1], 231_424),
            LaunchAttributes::default(),
        )
        .unwrap();
        assert_eq!(gpu.raises(), [231_424]);
    }

    #[test]
    fn two_threads_asking_different_sizes_never_lower_the_limit() {
        let gpu = FakeGpu::new(h200());
        let function = function_on(&gpu);
        let start = Arc::new(std::sync::Barrier::new(2));
        let sizes: [&[u32]; 2] = [
            &[60_000, 100_000, 140_000, 180_000, 220_000],
            &[220_000, 200_000, 120_000, 90_000, 52_000],
        ];
        let threads: Vec<_> = sizes
            .into_iter()
            .map(|sizes| {
                let function = function.clone();
                let start = Arc::clone(&start);
                std::thread::spawn(move || {
                    start.wait();
                    for _ in 0..20 {
                        for &size in sizes {
                            // The fake refuses a launch above the limit it holds: every launch
                            // passing means no raise undid another's.
                            launch(
                                &function,
                                &config([1, 1, 1], [128, 1, 1], size),
                                LaunchAttributes::default(),
                            )
                            .unwrap();
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let raises = gpu.raises();
        assert!(
            raises.windows(2).all(|pair| pair[0] < pair[1]),
            "{raises:?}"
        );
        assert_eq!(raises.last(), Some(&220_000));
        assert_eq!(*gpu.limit.lock().unwrap(), 220_000);
        assert_eq!(gpu.launches().len(), 200);
    }

    #[test]
    fn a_cluster_on_sm_80_is_refused() {
        let gpu = FakeGpu::new(a100());
        let function = function_on(&gpu);
        let error = launch(
            &function,
            &config([4, 1, 1], [128, 1, 1], 0),
            cluster([2, 1, 1]),
        )
        .unwrap_err();
        assert!(
            error.ends_with(
                ": a cluster of (2, 1, 1) needs a device that launches thread block clusters \
                 (compute capability 9.0 or later); this one is 8.0"
            ),
            "{error}"
        );
        assert!(gpu.launches().is_empty());
    }

    #[test]
    fn a_grid_not_divisible_by_the_cluster_is_refused() {
        let gpu = FakeGpu::new(h200());
        let function = function_on(&gpu);
        let error = launch(
            &function,
            &config([4, 3, 1], [128, 1, 1], 0),
            cluster([2, 2, 1]),
        )
        .unwrap_err();
        assert!(
            error.ends_with(
                ": the grid (4, 3, 1) is not divisible by the cluster (2, 2, 1): each grid \
                 dimension must be a multiple of the cluster's"
            ),
            "{error}"
        );
        assert!(gpu.launches().is_empty());
        launch(
            &function,
            &config([4, 2, 1], [128, 1, 1], 0),
            cluster([2, 2, 1]),
        )
        .unwrap();
        assert_eq!(gpu.launches()[0].1.cluster, Some([2, 2, 1]));
    }

    #[test]
    fn a_cluster_above_eight_blocks_needs_non_portable_sizes() {
        let gpu = FakeGpu::new(h200());
        let function = function_on(&gpu);
        let error = launch(
            &function,
            &config([16, 1, 1], [128, 1, 1], 0),
            cluster([16, 1, 1]),
        )
        .unwrap_err();
        assert!(
            error.ends_with(
                ": a cluster of (16, 1, 1) holds 16 blocks, more than the 8 of a portable \
                 cluster, and the entry does not allow non-portable cluster sizes \
                 (CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)"
            ),
            "{error}"
        );
        launch(
            &function,
            &config([16, 1, 1], [128, 1, 1], 0),
            cluster([8, 1, 1]),
        )
        .unwrap();
        let mut facts = h200();
        facts.function.non_portable_cluster_size_allowed = true;
        let gpu = FakeGpu::new(facts);
        let function = function_on(&gpu);
        launch(
            &function,
            &config([16, 1, 1], [128, 1, 1], 0),
            cluster([16, 1, 1]),
        )
        .unwrap();
    }

    #[test]
    fn a_cooperative_grid_must_fit_the_device_at_once() {
        let gpu = FakeGpu::new(h200());
        let function = function_on(&gpu);
        let cooperative = LaunchAttributes {
            cooperative: true,
            ..LaunchAttributes::default()
        };
        // 2 blocks per multiprocessor × 132.
        launch(&function, &config([264, 1, 1], [256, 1, 1], 0), cooperative).unwrap();
        let error =
            launch(&function, &config([265, 1, 1], [256, 1, 1], 0), cooperative).unwrap_err();
        assert!(
            error.ends_with(
                ": a cooperative launch needs every block resident at once: the grid (265, 1, 1) \
                 has 265 blocks, but at most 264 fit (2 per multiprocessor × 132 \
                 multiprocessors, at 256 threads and 0 bytes of dynamic shared memory per block)"
            ),
            "{error}"
        );
        assert_eq!(gpu.launches().len(), 1);
        assert!(gpu.launches()[0].1.cooperative);
        let mut facts = h200();
        facts.device.cooperative_launch = false;
        let gpu = FakeGpu::new(facts);
        let error = launch(
            &function_on(&gpu),
            &config([1, 1, 1], [32, 1, 1], 0),
            cooperative,
        )
        .unwrap_err();
        assert!(
            error.ends_with(
                ": the device does not launch cooperatively \
                 (CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH is 0)"
            ),
            "{error}"
        );
    }

    #[test]
    fn a_programmatic_launch_needs_sm_90() {
        let programmatic = LaunchAttributes {
            programmatic: true,
            ..LaunchAttributes::default()
        };
        let gpu = FakeGpu::new(a100());
        let error = launch(
            &function_on(&gpu),
            &config([1, 1, 1], [32, 1, 1], 0),
            programmatic,
        )
        .unwrap_err();
        assert!(
            error.ends_with(
                ": programmatic dependent launch needs compute capability 9.0 or later; this \
                 device is 8.0"
            ),
            "{error}"
        );
        let gpu = FakeGpu::new(h200());
        launch(
            &function_on(&gpu),
            &config([1, 1, 1], [32, 1, 1], 0),
            programmatic,
        )
        .unwrap();
        assert!(gpu.launches()[0].1.programmatic);
    }

    #[test]
    fn without_launch_kernel_ex_only_launches_with_attributes_are_refused() {
        let mut facts = h200();
        facts.launch_attributes = false;
        let gpu = FakeGpu::new(facts);
        let function = function_on(&gpu);
        // Plain launches, a shared memory raise included, go on.
        launch(
            &function,
            &config([2, 1, 1], [64, 1, 1], 0),
            Default::default(),
        )
        .unwrap();
        launch(
            &function,
            &config([2, 1, 1], [64, 1, 1], 100_000),
            Default::default(),
        )
        .unwrap();
        let with_priority = LaunchAttributes {
            priority: Some(-1),
            ..cluster([2, 1, 1])
        };
        let error =
            launch(&function, &config([2, 1, 1], [64, 1, 1], 0), with_priority).unwrap_err();
        assert!(
            error.ends_with(
                ": a launch with cluster (2, 1, 1) and priority -1 needs `cuLaunchKernelEx`, \
                 which this CUDA driver does not export; update the NVIDIA driver (one for CUDA \
                 12.0 or later has it)"
            ),
            "{error}"
        );
        assert_eq!(gpu.launches().len(), 2);
        assert!(gpu
            .launches()
            .iter()
            .all(|(_, attributes)| attributes.is_empty()));
    }

    #[test]
    fn a_refusal_is_a_launch_error_naming_entry_kernel_and_device() {
        let gpu = FakeGpu::new(a100());
        let function = function_on(&gpu);
        // SAFETY: the fake device reads no pointer.
        let error = unsafe {
            function.launch_with_attributes(
                &config([3, 1, 1], [32, 1, 1], 0),
                &cluster([2, 1, 1]),
                &[KernelArg::Ptr(0)],
            )
        }
        .unwrap_err();
        let LoadError::Launch(refused) = &error else {
            panic!("{error:?}");
        };
        assert_eq!(refused.entry, "attention_fwd");
        assert_eq!(refused.kernel, "attention");
        assert!(matches!(
            refused.refusal,
            LaunchRefusal::ClusterDevice {
                capability: (8, 0),
                ..
            }
        ));
        // The arguments are checked first.
        // SAFETY: as above.
        let error = unsafe {
            function.launch_with_attributes(
                &config([4, 1, 1], [32, 1, 1], 0),
                &cluster([2, 1, 1]),
                &[],
            )
        }
        .unwrap_err();
        assert!(matches!(error, LoadError::ArgumentCount { .. }), "{error}");
    }

    #[test]
    fn argument_bytes_are_native() {
        assert_eq!(KernelArg::I32(-2).to_bytes(), (-2i32).to_ne_bytes());
        assert_eq!(KernelArg::F64(1.5).to_bytes(), 1.5f64.to_ne_bytes());
        assert_eq!(KernelArg::Bytes(vec![1, 2, 3]).size(), 3);
        assert_eq!(KernelArg::Ptr(7).size(), 8);
    }
}

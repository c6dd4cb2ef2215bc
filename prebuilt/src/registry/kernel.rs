//! A loaded kernel: its module on one device, its entry functions, and launches whose
//! arguments are checked against the parameter sizes the index records. A kernel launches only
//! in the primary context of the device it was loaded on.

use super::*;
use crate::driver::{Context, DeviceBuffer, LaunchConfig};

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
    pub(super) module: Arc<dyn LoadedModule>,
    pub(super) index: usize,
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

    /// Each parameter's size in bytes, from the index.
    pub fn param_sizes(&self) -> &[u32] {
        &self.entry.param_sizes
    }

    /// Checks `args` against the parameter sizes: the count, then each size in order.
    pub fn check_arguments(&self, args: &[KernelArg]) -> Result<(), LoadError> {
        check_arguments(&self.kernel, &self.entry, args)
    }

    /// Launches the entry after checking the arguments against the recorded parameter sizes.
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
        self.check_arguments(args)?;
        let images: Vec<Vec<u8>> = args.iter().map(KernelArg::to_bytes).collect();
        let params: Vec<&[u8]> = images.iter().map(Vec::as_slice).collect();
        // SAFETY: the count and sizes match the cubin's parameters (checked above); the
        // caller vouches for the pointers and the stream.
        unsafe { self.module.launch(self.index, config, &params) }.map_err(|error| {
            LoadError::driver(error, "launch", &self.kernel, &self.variant, &self.device)
        })
    }
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

    fn entry() -> EntryRecord {
        EntryRecord {
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

    #[test]
    fn argument_bytes_are_native() {
        assert_eq!(KernelArg::I32(-2).to_bytes(), (-2i32).to_ne_bytes());
        assert_eq!(KernelArg::F64(1.5).to_bytes(), 1.5f64.to_ne_bytes());
        assert_eq!(KernelArg::Bytes(vec![1, 2, 3]).size(), 3);
        assert_eq!(KernelArg::Ptr(7).size(), 8);
    }
}

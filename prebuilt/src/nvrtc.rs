//! NVRTC, NVIDIA's runtime compiler, loaded from an explicit `libnvrtc.so.N` path.
//!
//! All of NVRTC's foreign calls live here (the driver's are in `driver`). It loads
//! the library with `libloading`, resolves the fifteen entry points kwheel uses, and offers
//! one safe operation on top of them: [`NvrtcLibrary::compile`], source in, cubin out.
//!
//! It is written by hand, unlike the driver binding, which is `cudarc`'s: `cudarc` finds NVRTC
//! by library name through the loader's search, and kwheel must load it from an explicit path,
//! the one libnvrtc of the CUDA build being compiled for (a pip wheel's, found by the JIT's
//! search), never whichever one the loader happens to find first.
//!
//! Two facts of the library shape it:
//!
//! - `libnvrtc` opens its `libnvrtc-builtins.so.X.Y` by soname when it compiles. A wheel's
//!   library directory is not on the loader path, so [`load`] first opens the builtins from the
//!   same directory with `RTLD_GLOBAL`; without that every compile fails with NVRTC error 7.
//! - One process can hold only one `libnvrtc`. A process-wide registry remembers the one that
//!   was loaded: asking again for the same file returns it, asking for another one is
//!   [`NvrtcError::AnotherLibraryLoaded`], never a crash. A build that needs two NVRTC versions
//!   compiles each in its own process.
//!
//! Programs are created and destroyed within one [`NvrtcLibrary::compile`] call, so distinct
//! threads may compile at once (NVRTC is thread-safe for distinct programs).

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// `nvrtcResult`: 0 is success.
type NvrtcResult = c_int;
/// `nvrtcProgram`: an opaque handle.
type ProgramHandle = *mut c_void;

const NVRTC_SUCCESS: NvrtcResult = 0;
const NVRTC_ERROR_COMPILATION: NvrtcResult = 6;

/// Something NVRTC could not do, or a library that is not a usable NVRTC.
#[derive(Debug, thiserror::Error)]
pub enum NvrtcError {
    /// The dynamic loader could not open the library (or its builtins).
    #[error("could not load NVRTC from {path}")]
    Load {
        /// The library that failed to load.
        path: PathBuf,
        /// What the dynamic loader said.
        #[source]
        source: libloading::Error,
    },
    /// The library loaded but lacks an entry point kwheel needs.
    #[error("{path} does not export `{symbol}`, so it is not a usable libnvrtc")]
    Symbol {
        /// The library.
        path: PathBuf,
        /// The missing function.
        symbol: &'static str,
        /// What the dynamic loader said.
        #[source]
        source: libloading::Error,
    },
    /// This process already holds a different libnvrtc.
    #[error(
        "cannot load NVRTC from {requested}: this process already loaded {loaded}, and one \
         process can hold only one libnvrtc; compile with the other one in a separate process"
    )]
    AnotherLibraryLoaded {
        /// The library asked for.
        requested: PathBuf,
        /// The library this process already holds.
        loaded: PathBuf,
    },
    /// An NVRTC call returned an error.
    #[error(
        "`{function}` failed in {path}: {message} (NVRTC error {code}){}",
        if .log.is_empty() { String::new() } else { format!(":\n{}", .log) }
    )]
    Call {
        /// The library.
        path: PathBuf,
        /// The NVRTC function that failed.
        function: &'static str,
        /// The `nvrtcResult` code.
        code: i32,
        /// NVRTC's name for the code.
        message: String,
        /// The program log, when the call was a compile that left one.
        log: String,
    },
    /// A string handed to NVRTC contains a NUL byte, which a C string cannot carry.
    #[error("{what} contains a NUL byte, which NVRTC cannot take: {text:?}")]
    NulByte {
        /// Which input: the source, an option, a name expression.
        what: &'static str,
        /// The offending text (for the source, its first line with a NUL).
        text: String,
    },
    /// The program does not compile; the log says why.
    #[error("NVRTC rejected the program:\n{log}")]
    Compilation {
        /// NVRTC's program log.
        log: String,
    },
}

/// What one successful compilation produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvrtcOutput {
    /// The cubin (an ELF file); for a virtual architecture (`compute_90`), which has no
    /// cubin, the PTX text without its final NUL.
    pub cubin: Vec<u8>,
    /// NVRTC's program log: warnings, or empty.
    pub log: String,
    /// Each name expression asked for, with the mangled symbol NVRTC lowered it to.
    pub lowered_names: BTreeMap<String, String>,
}

/// The entry points kwheel calls, resolved once when the library loads.
struct Api {
    get_error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult,
    get_num_supported_archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    get_supported_archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    create_program: unsafe extern "C" fn(
        *mut ProgramHandle,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    destroy_program: unsafe extern "C" fn(*mut ProgramHandle) -> NvrtcResult,
    add_name_expression: unsafe extern "C" fn(ProgramHandle, *const c_char) -> NvrtcResult,
    compile_program:
        unsafe extern "C" fn(ProgramHandle, c_int, *const *const c_char) -> NvrtcResult,
    get_program_log_size: unsafe extern "C" fn(ProgramHandle, *mut usize) -> NvrtcResult,
    get_program_log: unsafe extern "C" fn(ProgramHandle, *mut c_char) -> NvrtcResult,
    get_cubin_size: unsafe extern "C" fn(ProgramHandle, *mut usize) -> NvrtcResult,
    get_cubin: unsafe extern "C" fn(ProgramHandle, *mut c_char) -> NvrtcResult,
    get_ptx_size: unsafe extern "C" fn(ProgramHandle, *mut usize) -> NvrtcResult,
    get_ptx: unsafe extern "C" fn(ProgramHandle, *mut c_char) -> NvrtcResult,
    get_lowered_name:
        unsafe extern "C" fn(ProgramHandle, *const c_char, *mut *const c_char) -> NvrtcResult,
}

/// A loaded libnvrtc. Obtained from [`load`]; lives until the process exits.
pub struct NvrtcLibrary {
    path: PathBuf,
    version: (u32, u32),
    api: Api,
    // The function pointers in `api` point into these; they are never unloaded because every
    // `NvrtcLibrary` sits in the process-wide registry.
    _library: libloading::Library,
    _builtins: Option<libloading::os::unix::Library>,
}

impl std::fmt::Debug for NvrtcLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvrtcLibrary")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// The process's one libnvrtc, loaded on first use.
static REGISTRY: Mutex<Registry<NvrtcLibrary>> = Mutex::new(Registry { loaded: None });

/// Loads the libnvrtc at `path`, or returns the one this process already loaded from there.
///
/// Fails with [`NvrtcError::AnotherLibraryLoaded`] when this process already holds a libnvrtc
/// from a different file.
pub fn load(path: &Path) -> Result<Arc<NvrtcLibrary>, NvrtcError> {
    let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    registry.get_or_load(path, NvrtcLibrary::open)
}

/// The registry's logic, apart from the real library so that it can be tested on its own.
struct Registry<T> {
    loaded: Option<(PathBuf, Arc<T>)>,
}

impl<T> Registry<T> {
    fn get_or_load(
        &mut self,
        path: &Path,
        open: impl FnOnce(&Path) -> Result<T, NvrtcError>,
    ) -> Result<Arc<T>, NvrtcError> {
        // Compare files, not spellings: a symlink or `..` must not look like a second library.
        let identity = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if let Some((loaded, library)) = &self.loaded {
            return if *loaded == identity {
                Ok(Arc::clone(library))
            } else {
                Err(NvrtcError::AnotherLibraryLoaded {
                    requested: path.to_path_buf(),
                    loaded: loaded.clone(),
                })
            };
        }
        let library = Arc::new(open(path)?);
        self.loaded = Some((identity, Arc::clone(&library)));
        Ok(library)
    }
}

/// Resolves one entry point and copies the function pointer out of the library.
///
/// # Safety
///
/// `T` must be the function's true C signature, and the pointer must not be called after
/// `library` is unloaded.
unsafe fn symbol<T: Copy>(
    library: &libloading::Library,
    path: &Path,
    name: &'static str,
) -> Result<T, NvrtcError> {
    // SAFETY: the caller guarantees `T` is the symbol's signature and keeps `library` loaded.
    let symbol = unsafe { library.get::<T>(name) };
    symbol
        .map(|symbol| *symbol)
        .map_err(|source| NvrtcError::Symbol {
            path: path.to_path_buf(),
            symbol: name,
            source,
        })
}

/// The `libnvrtc-builtins.so.X.Y` next to `library`, if there is one.
///
/// A wheel ships `libnvrtc-builtins.so.12.9` and `libnvrtc-builtins.alt.so.12.9`; a toolkit
/// ships the soname and a fully versioned file. The shortest matching name is the soname.
fn builtins_next_to(library: &Path) -> Option<PathBuf> {
    let directory = library.parent()?;
    let major = library
        .file_name()
        .and_then(|name| name.to_str())
        .and_then(|name| name.strip_prefix("libnvrtc.so."))
        .and_then(|version| version.split('.').next())
        .filter(|major| !major.is_empty());
    let prefix = match major {
        Some(major) => format!("libnvrtc-builtins.so.{major}."),
        None => "libnvrtc-builtins.so.".to_owned(),
    };
    let mut candidates: Vec<String> = fs::read_dir(directory)
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(&prefix))
        .collect();
    candidates.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
    candidates.first().map(|name| directory.join(name))
}

impl NvrtcLibrary {
    fn open(path: &Path) -> Result<Self, NvrtcError> {
        // Canonical, so that a symlinked `libnvrtc.so.12` still finds its builtins.
        let real_path = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let builtins = match builtins_next_to(&real_path) {
            Some(builtins_path) => {
                use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
                // SAFETY: the builtins library has no initialisers with preconditions; loading
                // it globally is what lets libnvrtc find it by soname later.
                let builtins =
                    unsafe { Library::open(Some(&builtins_path), RTLD_NOW | RTLD_GLOBAL) };
                Some(builtins.map_err(|source| NvrtcError::Load {
                    path: builtins_path,
                    source,
                })?)
            }
            None => None,
        };
        // SAFETY: libnvrtc's initialisers have no preconditions on the calling process.
        let library =
            unsafe { libloading::Library::new(path) }.map_err(|source| NvrtcError::Load {
                path: path.to_path_buf(),
                source,
            })?;
        // SAFETY: each signature below is transcribed from `nvrtc.h` (CUDA 12 and 13 agree);
        // the pointers live in `api`, which is stored next to `library` and never outlives it.
        let api = unsafe {
            Api {
                get_error_string: symbol(&library, path, "nvrtcGetErrorString")?,
                version: symbol(&library, path, "nvrtcVersion")?,
                get_num_supported_archs: symbol(&library, path, "nvrtcGetNumSupportedArchs")?,
                get_supported_archs: symbol(&library, path, "nvrtcGetSupportedArchs")?,
                create_program: symbol(&library, path, "nvrtcCreateProgram")?,
                destroy_program: symbol(&library, path, "nvrtcDestroyProgram")?,
                add_name_expression: symbol(&library, path, "nvrtcAddNameExpression")?,
                compile_program: symbol(&library, path, "nvrtcCompileProgram")?,
                get_program_log_size: symbol(&library, path, "nvrtcGetProgramLogSize")?,
                get_program_log: symbol(&library, path, "nvrtcGetProgramLog")?,
                get_cubin_size: symbol(&library, path, "nvrtcGetCUBINSize")?,
                get_cubin: symbol(&library, path, "nvrtcGetCUBIN")?,
                get_ptx_size: symbol(&library, path, "nvrtcGetPTXSize")?,
                get_ptx: symbol(&library, path, "nvrtcGetPTX")?,
                get_lowered_name: symbol(&library, path, "nvrtcGetLoweredName")?,
            }
        };
        let mut library = NvrtcLibrary {
            path: path.to_path_buf(),
            version: (0, 0),
            api,
            _library: library,
            _builtins: builtins,
        };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: both out-pointers are valid for writes of one `int`.
        let result = unsafe { (library.api.version)(&mut major, &mut minor) };
        library.check("nvrtcVersion", result)?;
        library.version = (major as u32, minor as u32);
        Ok(library)
    }

    /// The file this library was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// NVRTC's `(major, minor)` version, from `nvrtcVersion`.
    pub fn version(&self) -> (u32, u32) {
        self.version
    }

    /// The SM numbers this NVRTC can compile for (`[75, 80, …, 90, 100, 120]`), ascending.
    pub fn supported_archs(&self) -> Result<Vec<u32>, NvrtcError> {
        let mut count: c_int = 0;
        // SAFETY: `count` is valid for writes of one `int`.
        let result = unsafe { (self.api.get_num_supported_archs)(&mut count) };
        self.check("nvrtcGetNumSupportedArchs", result)?;
        let mut archs: Vec<c_int> = vec![0; usize::try_from(count).unwrap_or(0)];
        if !archs.is_empty() {
            // SAFETY: `archs` has room for exactly the `count` entries NVRTC reported.
            let result = unsafe { (self.api.get_supported_archs)(archs.as_mut_ptr()) };
            self.check("nvrtcGetSupportedArchs", result)?;
        }
        let mut archs: Vec<u32> = archs.into_iter().map(|sm| sm as u32).collect();
        archs.sort_unstable();
        Ok(archs)
    }

    /// Compiles `source` to a cubin.
    ///
    /// `name` is the program's file name, which NVRTC uses in its log. `options` are NVRTC
    /// command-line options (`--gpu-architecture=sm_90a` selects a cubin). Each name expression
    /// (`"scale_rows<float>"`) is instantiated and comes back with its mangled symbol.
    /// A program that does not compile is [`NvrtcError::Compilation`] with the full log.
    pub fn compile(
        &self,
        source: &str,
        name: &str,
        options: &[String],
        name_expressions: &[String],
    ) -> Result<NvrtcOutput, NvrtcError> {
        let source_c = c_string("the source", source)?;
        let name_c = c_string("the program name", name)?;
        let options_c = options
            .iter()
            .map(|option| c_string("an option", option))
            .collect::<Result<Vec<_>, _>>()?;
        let expressions_c = name_expressions
            .iter()
            .map(|expression| c_string("a name expression", expression))
            .collect::<Result<Vec<_>, _>>()?;
        let option_pointers: Vec<*const c_char> =
            options_c.iter().map(|option| option.as_ptr()).collect();

        let program = self.create_program(&source_c, &name_c)?;
        for expression in &expressions_c {
            // SAFETY: `program.handle` is a live program and `expression` a NUL-terminated
            // string that NVRTC copies.
            let result =
                unsafe { (self.api.add_name_expression)(program.handle, expression.as_ptr()) };
            self.check("nvrtcAddNameExpression", result)?;
        }
        let count = c_int::try_from(option_pointers.len()).unwrap_or(c_int::MAX);
        // SAFETY: `option_pointers` holds `count` pointers to NUL-terminated strings owned by
        // `options_c`, which outlives the call.
        let compiled =
            unsafe { (self.api.compile_program)(program.handle, count, option_pointers.as_ptr()) };
        let log = self.program_log(&program)?;
        match compiled {
            NVRTC_SUCCESS => {}
            NVRTC_ERROR_COMPILATION => return Err(NvrtcError::Compilation { log }),
            code => {
                let mut error = self.call_error("nvrtcCompileProgram", code);
                if let NvrtcError::Call { log: call_log, .. } = &mut error {
                    *call_log = log.trim_end().to_owned();
                }
                return Err(error);
            }
        }

        let mut size = 0usize;
        // SAFETY: `program.handle` is a compiled program; `size` is valid for writes.
        let result = unsafe { (self.api.get_cubin_size)(program.handle, &mut size) };
        self.check("nvrtcGetCUBINSize", result)?;
        let mut cubin = vec![0u8; size];
        if size > 0 {
            // SAFETY: `cubin` has room for the `size` bytes NVRTC reported.
            let result = unsafe { (self.api.get_cubin)(program.handle, cubin.as_mut_ptr().cast()) };
            self.check("nvrtcGetCUBIN", result)?;
        } else {
            // A virtual architecture (`compute_90`) makes PTX and no cubin.
            // SAFETY: as above.
            let result = unsafe { (self.api.get_ptx_size)(program.handle, &mut size) };
            self.check("nvrtcGetPTXSize", result)?;
            cubin = vec![0u8; size];
            if size > 0 {
                // SAFETY: `cubin` has room for the `size` bytes (NUL included) NVRTC reported.
                let result =
                    unsafe { (self.api.get_ptx)(program.handle, cubin.as_mut_ptr().cast()) };
                self.check("nvrtcGetPTX", result)?;
            }
            while cubin.last() == Some(&0) {
                cubin.pop();
            }
        }

        let mut lowered_names = BTreeMap::new();
        for (expression, expression_c) in name_expressions.iter().zip(&expressions_c) {
            let mut lowered: *const c_char = std::ptr::null();
            // SAFETY: the expression was added before compiling; NVRTC writes a pointer to a
            // string owned by the program, which is copied below before the program is freed.
            let result = unsafe {
                (self.api.get_lowered_name)(program.handle, expression_c.as_ptr(), &mut lowered)
            };
            self.check("nvrtcGetLoweredName", result)?;
            let lowered = if lowered.is_null() {
                String::new()
            } else {
                // SAFETY: non-null, NUL-terminated, and alive while `program` is.
                unsafe { CStr::from_ptr(lowered) }
                    .to_string_lossy()
                    .into_owned()
            };
            lowered_names.insert(expression.clone(), lowered);
        }
        Ok(NvrtcOutput {
            cubin,
            log,
            lowered_names,
        })
    }

    fn create_program(&self, source: &CStr, name: &CStr) -> Result<Program<'_>, NvrtcError> {
        let mut handle: ProgramHandle = std::ptr::null_mut();
        // SAFETY: `handle` is valid for writes; `source` and `name` are NUL-terminated and
        // copied by NVRTC; zero headers means both header arrays may be null.
        let result = unsafe {
            (self.api.create_program)(
                &mut handle,
                source.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        self.check("nvrtcCreateProgram", result)?;
        Ok(Program {
            library: self,
            handle,
        })
    }

    fn program_log(&self, program: &Program<'_>) -> Result<String, NvrtcError> {
        let mut size = 0usize;
        // SAFETY: `program.handle` is live; `size` is valid for writes.
        let result = unsafe { (self.api.get_program_log_size)(program.handle, &mut size) };
        self.check("nvrtcGetProgramLogSize", result)?;
        if size == 0 {
            return Ok(String::new());
        }
        let mut log = vec![0u8; size];
        // SAFETY: `log` has room for the `size` bytes (terminating NUL included) NVRTC reported.
        let result = unsafe { (self.api.get_program_log)(program.handle, log.as_mut_ptr().cast()) };
        self.check("nvrtcGetProgramLog", result)?;
        if let Some(end) = log.iter().position(|&byte| byte == 0) {
            log.truncate(end);
        }
        Ok(String::from_utf8_lossy(&log).into_owned())
    }

    fn check(&self, function: &'static str, result: NvrtcResult) -> Result<(), NvrtcError> {
        if result == NVRTC_SUCCESS {
            Ok(())
        } else {
            Err(self.call_error(function, result))
        }
    }

    fn call_error(&self, function: &'static str, code: NvrtcResult) -> NvrtcError {
        // SAFETY: `nvrtcGetErrorString` takes any code and returns null or a static string.
        let message = unsafe { (self.api.get_error_string)(code) };
        let message = if message.is_null() {
            "unknown error".to_owned()
        } else {
            // SAFETY: non-null, NUL-terminated, static.
            unsafe { CStr::from_ptr(message) }
                .to_string_lossy()
                .into_owned()
        };
        NvrtcError::Call {
            path: self.path.clone(),
            function,
            code,
            message,
            log: String::new(),
        }
    }
}

/// An NVRTC program, destroyed when dropped.
struct Program<'a> {
    library: &'a NvrtcLibrary,
    handle: ProgramHandle,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: `handle` came from `nvrtcCreateProgram` and is destroyed exactly once; any
        // pointers NVRTC handed out for it were copied before this point.
        unsafe { (self.library.api.destroy_program)(&mut self.handle) };
    }
}

fn c_string(what: &'static str, text: &str) -> Result<CString, NvrtcError> {
    CString::new(text).map_err(|_| NvrtcError::NulByte {
        what,
        text: text
            .lines()
            .find(|line| line.contains('\0'))
            .unwrap_or(text)
            .replace('\0', "\\0"),
    })
}

/// The newest `libnvrtc.so.N` in `lib` (the soname, not the `.alt` variant or a fully versioned file).
pub fn find_libnvrtc(lib: &Path) -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir(lib)
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            let major = name.strip_prefix("libnvrtc.so.")?.parse().ok()?;
            Some((major, entry.path()))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, path)| path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_returns_the_same_library_for_the_same_file() {
        let directory = tempfile::tempdir().unwrap();
        let file = directory.path().join("libnvrtc.so.12");
        fs::write(&file, b"").unwrap();
        let link = directory.path().join("libnvrtc.so");
        std::os::unix::fs::symlink(&file, &link).unwrap();

        let mut registry = Registry { loaded: None };
        let first = registry.get_or_load(&file, |_| Ok(1)).unwrap();
        let again = registry
            .get_or_load(&link, |_| panic!("must not load twice"))
            .unwrap();
        assert!(Arc::ptr_eq(&first, &again));
    }

    #[test]
    fn registry_refuses_a_second_library() {
        let mut registry = Registry { loaded: None };
        registry
            .get_or_load(Path::new("/toolkits/cu129/libnvrtc.so.12"), |_| Ok(()))
            .unwrap();
        let error = registry
            .get_or_load(Path::new("/toolkits/cu130/libnvrtc.so.13"), |_| {
                panic!("must not load")
            })
            .unwrap_err();
        assert!(matches!(error, NvrtcError::AnotherLibraryLoaded { .. }));
        assert_eq!(
            error.to_string(),
            "cannot load NVRTC from /toolkits/cu130/libnvrtc.so.13: this process already loaded \
             /toolkits/cu129/libnvrtc.so.12, and one process can hold only one libnvrtc; compile \
             with the other one in a separate process"
        );
    }

    #[test]
    fn registry_stays_empty_when_loading_fails() {
        let mut registry: Registry<()> = Registry { loaded: None };
        let missing = Path::new("/nonexistent/libnvrtc.so.12");
        let error = registry
            .get_or_load(missing, NvrtcLibrary::open_as_unit)
            .unwrap_err();
        assert!(matches!(error, NvrtcError::Load { .. }), "{error}");
        registry
            .get_or_load(Path::new("/elsewhere/libnvrtc.so.13"), |_| Ok(()))
            .unwrap();
    }

    #[test]
    fn builtins_are_found_by_soname() {
        let directory = tempfile::tempdir().unwrap();
        for name in [
            "libnvrtc.so.12",
            "libnvrtc-builtins.alt.so.12.9",
            "libnvrtc-builtins.so.12.9.86",
            "libnvrtc-builtins.so.12.9",
            "libnvrtc-builtins.so.13.0",
        ] {
            fs::write(directory.path().join(name), b"").unwrap();
        }
        assert_eq!(
            builtins_next_to(&directory.path().join("libnvrtc.so.12")),
            Some(directory.path().join("libnvrtc-builtins.so.12.9"))
        );
    }

    #[test]
    fn nul_bytes_are_refused_by_name() {
        let error = c_string("an option", "-DX=\0").unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"an option contains a NUL byte, which NVRTC cannot take: "-DX=\\0""#
        );
    }

    impl NvrtcLibrary {
        fn open_as_unit(path: &Path) -> Result<(), NvrtcError> {
            Self::open(path).map(drop)
        }
    }
}

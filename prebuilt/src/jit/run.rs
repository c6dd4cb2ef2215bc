//! One JIT compile: the shipped sources checked against the index, then the bundler's executor
//! ([`crate::compile::compile`]) run with the compiler the search found.

use super::*;
use crate::compile::computed::{read_computed, ComputedPlan};
use crate::compile::{CompileFailure, CompileJob, CompilerTool, SourceTree};

/// What one JIT compile made: the cubin, its entries (with their computed constants) and the
/// layouts of the structs the kernel declares.
pub(super) type Compiled = (Vec<u8>, Vec<Function>, BTreeMap<String, StructLayout>);

/// Verifies the shipped sources and compiles them: the cubin, its entries and its structs.
pub(super) fn compile(
    request: &JitRequest<'_>,
    compiler: &JitCompiler,
) -> Result<Compiled, JitError> {
    let kernel = request.kernel;
    let recipe = request
        .record
        .recipe
        .as_ref()
        .ok_or_else(|| JitError::NoSources {
            kernel: kernel.to_owned(),
        })?;
    let sources = absolute(&request.bundle_root.join(SOURCES_DIR));
    verify_sources(kernel, &sources, &request.record.inputs.files)?;
    // What this arch compiles with: the same merge as the key and the bundler (`for_arch`).
    let inputs = &request.record.inputs.for_arch(request.arch);
    let record = compiler.record();
    let flags = inputs.flags_for(&record);
    let record = record.to_string();
    let name_expressions: Vec<String> = inputs
        .entries
        .iter()
        .filter(|entry| is_name_expression(entry))
        .cloned()
        .collect();
    let tool = match &compiler.nvrtc {
        Some(library) => CompilerTool::Nvrtc {
            library,
            include_dirs: &compiler.include_dirs,
        },
        None => CompilerTool::Nvcc {
            nvcc: &compiler.location,
        },
    };
    // The bundle's key: the bundler compiled under the same one, in the same work folder.
    let key = request.key(&compiler.record());
    let tree = SourceTree::shipped(&sources);
    let plan = ComputedPlan::new(&inputs.computed, &inputs.entries);
    let job = CompileJob {
        key: &key.0,
        tree: &tree,
        source: &recipe.source,
        include_dirs: &recipe.include_dirs,
        arch: request.arch,
        cxx_std: &inputs.cxx_std,
        defines: &inputs.defines,
        flags: &flags,
        name_expressions: &name_expressions,
        preamble: &inputs.preamble,
        computed: &plan.evaluations,
    };
    let compiled = crate::compile::compile(&tool, &job).map_err(|failure| match failure {
        CompileFailure::Rejected { log } => JitError::Compile {
            kernel: kernel.to_owned(),
            arch: request.arch,
            build: request.cuda,
            compiler: record.clone(),
            log,
        },
        failure => JitError::Compiler {
            kernel: kernel.to_owned(),
            arch: request.arch,
            build: request.cuda,
            compiler: record.clone(),
            source: Box::new(failure),
        },
    })?;
    let (cubin, lowered_names) = (compiled.cubin, compiled.lowered_names);
    let mut functions = resolve_entries(&cubin, request.arch, &inputs.entries, &lowered_names)
        .map_err(|error| match error.missing_entry() {
            Err(source) => JitError::InvalidCubin {
                kernel: kernel.to_owned(),
                arch: request.arch,
                build: request.cuda,
                compiler: record.clone(),
                source: Box::new(source),
            },
            Ok((entry, found)) => JitError::MissingEntry {
                kernel: kernel.to_owned(),
                arch: request.arch,
                compiler: record.clone(),
                entry,
                found,
            },
        })?;
    refuse_stubs(kernel, request.arch, &record, &cubin, &functions)?;
    let values =
        read_computed(&cubin, plan.evaluations.len()).map_err(|error| JitError::Compile {
            kernel: kernel.to_owned(),
            arch: request.arch,
            build: request.cuda,
            compiler: record.clone(),
            log: error.to_string(),
        })?;
    let structs = plan.assign(&values, &mut functions);
    Ok((cubin, functions, structs))
}

/// The bundler's rule ([`crate::cubin::stub_entries`]): a cubin whose every entry only
/// reports and aborts on this target is not a kernel for it, whichever side compiled it.
pub(super) fn refuse_stubs(
    kernel: &str,
    arch: Arch,
    compiler: &str,
    cubin: &[u8],
    functions: &[Function],
) -> Result<(), JitError> {
    let Ok(stubs) = crate::cubin::stub_entries(cubin) else {
        return Ok(());
    };
    let all_stubs = !functions.is_empty()
        && functions
            .iter()
            .all(|function| stubs.iter().any(|stub| stub.symbol == function.symbol));
    if !all_stubs {
        return Ok(());
    }
    Err(JitError::Stub {
        kernel: kernel.to_owned(),
        arch,
        compiler: compiler.to_owned(),
        stubs: stubs
            .iter()
            .map(|stub| format!("`{}`: {}", stub.symbol, stub.describe()))
            .collect(),
    })
}

/// A path that does not depend on the working directory, since nvcc runs in a temp dir.
pub(super) fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Why a candidate could not be used, on one line: for a library the loader could not open,
/// just the loader's words (they name the file); else the error and its causes.
pub(super) fn describe_failure(error: &JitError) -> String {
    if let JitError::LoadNvrtc { source, .. } = error {
        if let NvrtcError::Load { source, .. } = source.as_ref() {
            return source.to_string();
        }
    }
    error_chain(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/stub/");
        fs::read(format!("{path}{name}")).unwrap()
    }

    fn entries(names: &[&str]) -> Vec<Function> {
        names
            .iter()
            .map(|name| Function {
                computed: Default::default(),
                name: (*name).to_owned(),
                symbol: (*name).to_owned(),
                param_sizes: vec![8, 8, 4],
            })
            .collect()
    }

    /// A JIT compile for a target the source has no code for is refused as a stub, as the
    /// bundler skips it; one real entry among the stubs keeps the cubin.
    #[test]
    fn a_jit_cubin_that_is_only_stubs_is_refused() {
        let arch: Arch = "sm_90a".parse().unwrap();
        let cubin = fixture("nvcc130_sm_90a.cubin");
        let stubs = entries(&["only100_trap", "only100_deepgemm"]);
        let error = refuse_stubs("gemm", arch, "nvcc 13.0.88", &cubin, &stubs).unwrap_err();
        let message = error.to_string();
        assert!(
            message.starts_with("`gemm` has no real code for sm_90a"),
            "{message}"
        );
        assert!(message.contains("`only100_trap`"), "{message}");
        let mixed = entries(&["only100_trap", "checked"]);
        refuse_stubs("gemm", arch, "nvcc 13.0.88", &cubin, &mixed).unwrap();
        // The same source for sm_100a is real code for those kernels.
        let arch: Arch = "sm_100a".parse().unwrap();
        let cubin = fixture("nvcc130_sm_100a.cubin");
        refuse_stubs("gemm", arch, "nvcc 13.0.88", &cubin, &stubs).unwrap();
    }
}

//! One JIT compile: the shipped sources checked against the index, then the bundler's recipe
//! ([`crate::compile`]) run with the compiler the search found.

use super::*;

/// Verifies the shipped sources and compiles them: the cubin and its entries.
pub(super) fn compile(
    request: &JitRequest<'_>,
    compiler: &JitCompiler,
) -> Result<(Vec<u8>, Vec<Function>), JitError> {
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
    let source_path = sources.join(&recipe.source);
    let include_dirs: Vec<PathBuf> = recipe
        .include_dirs
        .iter()
        .map(|dir| {
            if dir == "." {
                sources.clone()
            } else {
                sources.join(dir)
            }
        })
        .collect();
    let inputs = &request.record.inputs;
    let flags = inputs.flags_for(&compiler.record().kind);
    let options = CompileOptions {
        arch: request.arch,
        cxx_std: &inputs.cxx_std,
        include_dirs: &include_dirs,
        defines: &inputs.defines,
        flags: &flags,
    };
    let record = compiler.record().to_string();
    let failed = |log: String| JitError::Compile {
        kernel: kernel.to_owned(),
        arch: request.arch,
        build: request.cuda,
        compiler: record.clone(),
        log,
    };
    let could_not = |source: Box<dyn std::error::Error + Send + Sync>| JitError::Compiler {
        kernel: kernel.to_owned(),
        arch: request.arch,
        build: request.cuda,
        compiler: record.clone(),
        source,
    };
    let name_expressions: Vec<String> = inputs
        .entries
        .iter()
        .filter(|entry| is_name_expression(entry))
        .cloned()
        .collect();
    let (cubin, lowered_names) = match &compiler.nvrtc {
        Some(library) => {
            let source =
                fs::read_to_string(&source_path).map_err(|source| JitError::SourceRead {
                    kernel: kernel.to_owned(),
                    stable: recipe.source.clone(),
                    path: source_path.clone(),
                    source,
                })?;
            let output = library
                .compile(
                    &source,
                    &source_path.display().to_string(),
                    &nvrtc_options(&options, &compiler.include_dirs),
                    &name_expressions,
                )
                .map_err(|error| match error {
                    NvrtcError::Compilation { log } => failed(log),
                    error => could_not(Box::new(error)),
                })?;
            (output.cubin, output.lowered_names)
        }
        None => {
            let work = tempfile::Builder::new()
                .prefix("kwheel-jit-")
                .tempdir()
                .map_err(|error| could_not(Box::new(error)))?;
            let output_path = work.path().join("kernel.cubin");
            let mut arguments = nvcc_arguments(&options, &source_path, &output_path);
            if !name_expressions.is_empty() {
                // The bundler's compile exactly: the probes' translation unit in place of the
                // source, with `-keep` leaving its PTX in the work dir.
                let probes = work.path().join(ENTRY_PROBES_SOURCE);
                fs::write(
                    &probes,
                    entry_probes_source(&source_path, &name_expressions),
                )
                .map_err(|error| could_not(Box::new(error)))?;
                *arguments.last_mut().expect("the source is last") = probes.into();
                arguments.insert(0, "-keep".into());
            }
            let output = nvcc_command(&compiler.location)
                .args(arguments)
                .current_dir(work.path())
                .env("TMPDIR", work.path())
                .output()
                .map_err(|error| could_not(Box::new(error)))?;
            if !output.status.success() {
                let mut log = String::from_utf8_lossy(&output.stdout).into_owned();
                log.push_str(&String::from_utf8_lossy(&output.stderr));
                if log.trim().is_empty() {
                    log = format!("nvcc {} and printed nothing", output.status);
                }
                return Err(failed(log));
            }
            let cubin = fs::read(&output_path).map_err(|error| could_not(Box::new(error)))?;
            let lowered_names = if name_expressions.is_empty() {
                BTreeMap::new()
            } else if request.arch.is_ptx() {
                // For a `compute_XY` target the output is that PTX itself.
                read_entry_probes(&String::from_utf8_lossy(&cubin), &name_expressions)
            } else {
                let ptx_path = work.path().join(ENTRY_PROBES_PTX);
                let ptx =
                    fs::read_to_string(&ptx_path).map_err(|error| could_not(Box::new(error)))?;
                read_entry_probes(&ptx, &name_expressions)
            };
            (cubin, lowered_names)
        }
    };
    let functions = resolve_entries(&cubin, request.arch, &inputs.entries, &lowered_names)
        .map_err(|error| match error {
            EntryError::Invalid(source) => JitError::InvalidCubin {
                kernel: kernel.to_owned(),
                arch: request.arch,
                build: request.cuda,
                compiler: record.clone(),
                source: Box::new(source),
            },
            EntryError::Missing { entry, found } => JitError::MissingEntry {
                kernel: kernel.to_owned(),
                arch: request.arch,
                compiler: record.clone(),
                entry,
                found,
            },
        })?;
    Ok((cubin, functions))
}

/// Checks every shipped file of the include graph against the digest the index records.
pub(super) fn verify_sources(
    kernel: &str,
    sources: &Path,
    files: &BTreeMap<String, String>,
) -> Result<(), JitError> {
    for (stable, expected) in files {
        let path = sources.join(stable);
        let bytes = fs::read(&path).map_err(|source| JitError::SourceRead {
            kernel: kernel.to_owned(),
            stable: stable.clone(),
            path: path.clone(),
            source,
        })?;
        let actual = sha256_hex(&bytes);
        if actual != *expected {
            return Err(JitError::SourceMismatch {
                kernel: kernel.to_owned(),
                stable: stable.clone(),
                path,
                expected: expected.clone(),
                actual,
            });
        }
    }
    Ok(())
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

//! Extension modules (`[extensions.<name>]`): a library's own C++/CUDA torch extension, host
//! launchers and op registration included, built into one shared library per CUDA build and
//! CPU arch and loaded with `torch.ops.load_library` when the package is imported.
//!
//! ```toml
//! [extensions._C]
//! sources = ["csrc/bindings.cpp", "csrc/activation.cu"]
//! abi = "stable"            # STABLE_TORCH_LIBRARY: one module serves every newer torch
//! include-dirs = ["csrc"]
//! nvcc-flags = ["--expt-relaxed-constexpr"]
//! cxx-flags = ["-O3"]
//! defines = { USE_FAST_MATH = "1" }
//! ```
//!
//! | module | owns |
//! | --- | --- |
//! | [`crate::manifest::ExtensionSpec`] | the manifest table and its checks |
//! | this one | what marks a kernel's source as host code that belongs in a module |
//! | [`build`] | the include graph of every translation unit, the key, nvcc + g++, the link |
//!
//! What is and is not supported, and why, is in `docs/extensions.md`.

pub mod build;
pub mod cpu;

/// What in a kernel's source marks it as host code for an extension module: a header or
/// macro whose code a cubin cannot hold, with what it is.
const HOST_CODE_MARKS: &[(&str, &str)] = &[
    ("torch/extension.h", "includes `<torch/extension.h>`"),
    (
        "torch/csrc/stable/library.h",
        "includes `<torch/csrc/stable/library.h>`",
    ),
    (
        "STABLE_TORCH_LIBRARY",
        "registers ops with `STABLE_TORCH_LIBRARY`",
    ),
    ("TORCH_LIBRARY", "registers ops with `TORCH_LIBRARY`"),
    (
        "PYBIND11_MODULE",
        "defines a Python module with `PYBIND11_MODULE`",
    ),
];

/// Why the kernel source `text` is host code that a kernel would silently drop (torch op
/// registration, a Python module), if it is: the first mark found, as
/// [`HOST_CODE_MARKS`] words it.
pub fn host_code_in(text: &str) -> Option<&'static str> {
    text.lines()
        .map(str::trim_start)
        .filter(|line| !line.starts_with("//"))
        .find_map(|line| {
            HOST_CODE_MARKS
                .iter()
                .find(|(mark, _)| {
                    if mark.contains('/') {
                        line.starts_with('#') && line.contains(mark)
                    } else {
                        line.starts_with(mark)
                            && line[mark.len()..].trim_start().starts_with(['(', '_'])
                    }
                })
                .map(|(_, what)| *what)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_code_is_found_by_its_header_or_registration_macro() {
        assert_eq!(
            host_code_in("#include <torch/extension.h>\n__global__ void k() {}"),
            Some("includes `<torch/extension.h>`")
        );
        assert_eq!(
            host_code_in("TORCH_LIBRARY(my_ops, m) {\n  m.def(\"f(Tensor x) -> Tensor\");\n}"),
            Some("registers ops with `TORCH_LIBRARY`")
        );
        assert_eq!(
            host_code_in("TORCH_LIBRARY_IMPL(my_ops, CUDA, m) {}"),
            Some("registers ops with `TORCH_LIBRARY`")
        );
        assert_eq!(
            host_code_in("STABLE_TORCH_LIBRARY(my_ops, m) {}"),
            Some("registers ops with `STABLE_TORCH_LIBRARY`")
        );
        // Comments and plain device code are not host code.
        assert_eq!(
            host_code_in("// TORCH_LIBRARY(x, m) would register\n__global__ void k() {}"),
            None
        );
        assert_eq!(host_code_in("#include <ATen/cuda/CUDAContext.h>\n"), None);
        assert_eq!(host_code_in("int TORCH_LIBRARY_COUNT = 2;"), None);
    }
}

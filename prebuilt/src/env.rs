//! Environment-variable names derived from a package name.
//!
//! Every per-package switch (`<PACKAGE>_JIT_FALLBACK`, `<PACKAGE>_PTX_JIT`,
//! `<PACKAGE>_NO_DOWNLOAD`, …) starts with the same prefix, spelled by one rule here.

/// The package name as an environment-variable prefix: `af3-kernels` → `AF3_KERNELS`.
pub fn package_prefix(package: &str) -> String {
    package.to_ascii_uppercase().replace(['-', '.'], "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separators_become_underscores_and_letters_upper_case() {
        assert_eq!(package_prefix("af3-kernels"), "AF3_KERNELS");
        assert_eq!(package_prefix("my.kernels_lib"), "MY_KERNELS_LIB");
    }
}

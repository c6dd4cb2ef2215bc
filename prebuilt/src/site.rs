//! The Python environment as seen from Rust: its site-packages directories, where installed
//! wheels (NVIDIA's toolchain wheels, kernel libraries and their bundles) live.
//!
//! The order is the search order: `$KWHEEL_SITE_PACKAGES` (a path list), the active virtual
//! environment or conda prefix, then what the `python3` on `PATH` (or `$PYTHON`) reports.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use crate::env::SITE_PACKAGES_ENV;

/// `<prefix>/lib/python3.*/site-packages`, newest Python first.
pub fn python_site_packages(prefix: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(prefix.join("lib")) else {
        return Vec::new();
    };
    let mut found: Vec<(u32, PathBuf)> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            let minor = name.strip_prefix("python3.")?.parse().ok()?;
            let site_packages = entry.path().join("site-packages");
            site_packages.is_dir().then_some((minor, site_packages))
        })
        .collect();
    found.sort_by(|a, b| b.cmp(a));
    found.into_iter().map(|(_, path)| path).collect()
}

/// PEP 503 normalization: lowercase, runs of `-`, `_`, `.` become one `-`.
pub fn normalize_package(name: &str) -> String {
    let mut out = String::new();
    let mut separator = false;
    for c in name.trim().chars() {
        if matches!(c, '-' | '_' | '.') {
            separator = true;
            continue;
        }
        if separator && !out.is_empty() {
            out.push('-');
        }
        separator = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// The site-packages the environment names, without running Python: `$KWHEEL_SITE_PACKAGES`,
/// then `$VIRTUAL_ENV`'s and `$CONDA_PREFIX`'s; `env` reads the environment (tests inject it).
pub fn environment_site_packages(env: impl Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let env = |name: &str| env(name).filter(|value| !value.is_empty());
    let mut site_packages = Vec::new();
    if let Some(list) = env(SITE_PACKAGES_ENV) {
        site_packages.extend(std::env::split_paths(&list));
    }
    for prefix in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(prefix) = env(prefix) {
            site_packages.extend(python_site_packages(Path::new(&prefix)));
        }
    }
    site_packages
}

/// Every site-packages directory: [`environment_site_packages`], then what the Python
/// interpreter reports; duplicates dropped, order kept.
pub fn site_packages() -> Vec<PathBuf> {
    let mut found = environment_site_packages(|name| std::env::var_os(name));
    let python = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    let script = "import site, sys\n\
                  paths = list(getattr(site, 'getsitepackages', lambda: [])())\n\
                  paths.append(site.getusersitepackages())\n\
                  paths.extend(p for p in sys.path if p.endswith('-packages'))\n\
                  print('\\n'.join(paths))";
    if let Ok(output) = std::process::Command::new(python)
        .args(["-c", script])
        .stderr(std::process::Stdio::null())
        .output()
    {
        if output.status.success() {
            for line in String::from_utf8_lossy(&output.stdout).lines() {
                let path = PathBuf::from(line.trim());
                if !line.trim().is_empty() && path.is_dir() {
                    found.push(path);
                }
            }
        }
    }
    let mut unique = Vec::new();
    for path in found {
        if !unique.contains(&path) {
            unique.push(path);
        }
    }
    unique
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_are_normalized() {
        assert_eq!(normalize_package("AF3_Kernels"), "af3-kernels");
        assert_eq!(normalize_package("af3.-kernels"), "af3-kernels");
    }
}

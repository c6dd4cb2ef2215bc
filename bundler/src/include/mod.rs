//! The include-graph scanner: every file a translation unit can include, each hashed and named
//! by a path that does not depend on where the tree lives on disk.
//!
//! The graph feeds the kernel key, so the scanner over-approximates rather than guess: a header
//! it takes that the compiler skips costs a rebuild now and then; a header it misses serves a
//! stale cubin. Headers are looked up the way nvcc's preprocessor does:
//!
//! | spelling | searched, in order | found nowhere |
//! | --- | --- | --- |
//! | `#include "x"` | the includer's directory, include dirs, external dirs | [`ScanError::MissingHeader`] |
//! | `#include <x>` | include dirs, external dirs | external (a system header) |
//! | `#include_next <x>` or `"x"` | include dirs after the one the includer was found through (all of them when it was not found through one), external dirs | external |
//!
//! - A header that resolves only under an external dir (the toolkit's) is *external*: listed by
//!   its spelled name, neither hashed nor scanned, since the toolkit version is already in the key.
//! - Every `#include` counts, whatever `#if` surrounds it, even `#if 0`. Includes inside
//!   comments, string and character literals and raw strings do not. Backslash line
//!   continuations are honoured, `# include` and `#\tinclude` are includes, `__has_include(…)`
//!   is not, and `#import` (not CUDA) is ignored.
//! - `#include MACRO` is refused with [`ScanError::ComputedInclude`] rather than guessed, with
//!   one exception that guesses nothing: when every `#define MACRO` in the scanned files (under
//!   any `#if`, like includes) is an angle-bracket header name that, arguments substituted, is
//!   found in no include dir, every expansion is external, and the toolkit version already keys
//!   those. That is how CUTLASS 4 spells its standard headers:
//!   `#define CUDA_STD_HEADER(header) <cuda/std/header>`, `#include CUDA_STD_HEADER(cstdint)`.
//! - Each file is scanned once, keyed by its canonical path, so include cycles end with or without
//!   `#pragma once`, and `a/../b.cuh` is `b.cuh`.
//! - A file's stable path is relative to the root when it lies under it (forward slashes, whichever
//!   directory found it), else `[n]/<path relative to include dir n>` for the include dir it was
//!   found through (or the first that holds it). A file under neither is refused with
//!   [`ScanError::OutsideRoots`]: it would have no name that is the same on every machine.
//!
//! Each file is read once, hashed with SHA-256 and lexed byte by byte (no regex, no per-line
//! allocation) on a few worker threads; includes are resolved on the calling thread in discovery
//! order, so the graph and the first error do not depend on timing. Lookups of the same
//! candidate path are cached.
//!
//! | module | owns |
//! | --- | --- |
//! | this one | [`scan_includes`], [`ScanRoots`], [`IncludeGraph`], [`ScanError`] |
//! | `lex` | finding `#include` and `#define` directives in a file's bytes |
//! | `resolve` | turning each directive into a file or an external header, in discovery order |

mod lex;
mod resolve;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use resolve::Scanner;

/// Where the scanner looks, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanRoots {
    /// The manifest's directory: files under it are named relative to it.
    pub root: PathBuf,
    /// Include directories (absolute), in `-I` order.
    pub include_dirs: Vec<PathBuf>,
    /// The toolkit's include directories: headers found only here are external.
    pub external_dirs: Vec<PathBuf>,
}

/// The files a set of translation units includes, transitively, with their content hashes.
#[derive(Clone, Debug)]
pub struct IncludeGraph {
    files: BTreeMap<String, String>,
    externals: BTreeSet<String>,
    absent: BTreeSet<(String, String)>,
    nodes: Vec<GraphNode>,
    sources: Vec<usize>,
    by_stable: HashMap<String, usize>,
}

#[derive(Clone, Debug)]
struct GraphNode {
    stable: String,
    absolute: PathBuf,
    /// What the file includes, in the order of its directives (includes through a macro
    /// last), without repeats.
    edges: Vec<Edge>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Edge {
    File(usize),
    External(String),
    /// A quoted include under a conditional that resolved nowhere.
    Absent(String),
}

impl IncludeGraph {
    /// Every file in the graph (sources included) → lowercase hex SHA-256 of its content, keyed by
    /// its stable path: relative to the root when under it (forward slashes), else
    /// `[<n>]/<path relative to include dir n>`.
    pub fn files(&self) -> &BTreeMap<String, String> {
        &self.files
    }

    /// Headers that resolved to no local file but exist under an external dir, and angle
    /// includes found nowhere (system headers), by spelled name.
    pub fn externals(&self) -> &BTreeSet<String> {
        &self.externals
    }

    /// Quoted includes under a conditional (`#ifdef __CUDACC_RTC__`) that resolved to no file
    /// anywhere, as (includer's stable path, header as spelled): the scanner evaluates no
    /// conditional, so these are taken as includes the compile does not read. One that
    /// appears later is found, and hashed, by the next scan.
    pub fn absent(&self) -> &BTreeSet<(String, String)> {
        &self.absent
    }

    /// The include dirs a compile of this graph needs, out of the `dirs` it was scanned with:
    /// the first `required` (the manifest's) always, then the rest (the host compiler's library
    /// dirs) up to the last one a file of the graph is named after (`[n]/…`), so that the
    /// compile, like the scan, finds those headers there and the JIT finds their shipped copies.
    pub fn needed_include_dirs(&self, dirs: &[PathBuf], required: usize) -> Vec<PathBuf> {
        let used = self
            .files
            .keys()
            .filter_map(|stable| {
                let (index, _) = stable.strip_prefix('[')?.split_once("]/")?;
                index.parse::<usize>().ok()
            })
            .max();
        let count = used.map_or(required, |last| (last + 1).max(required));
        dirs[..count.min(dirs.len())].to_vec()
    }

    /// The absolute (canonical) path of a graph file, by stable path.
    pub fn absolute_path(&self, stable: &str) -> Option<&Path> {
        self.by_stable
            .get(stable)
            .map(|&index| self.nodes[index].absolute.as_path())
    }

    /// An indented include tree from each source, marking a file already expanded above with
    /// `(already shown)` and an external header with `(external)`:
    ///
    /// ```text
    /// kernels/a.cu
    /// ├── include/af3/x.cuh
    /// │   ├── include/af3/common.cuh
    /// │   └── cuda_fp16.h (external)
    /// └── include/af3/common.cuh (already shown)
    /// ```
    pub fn render_tree(&self) -> String {
        const ALREADY_SHOWN: &str = " (already shown)\n";
        let mut out = String::new();
        let mut shown = vec![false; self.nodes.len()];
        for &source in &self.sources {
            out.push_str(&self.nodes[source].stable);
            if shown[source] {
                out.push_str(ALREADY_SHOWN);
                continue;
            }
            out.push('\n');
            shown[source] = true;
            // (node, next edge to print, prefix length to restore when done), iterative so that
            // deep include chains cannot overflow the stack.
            let mut stack = vec![(source, 0usize, 0usize)];
            let mut prefix = String::new();
            while let Some(top) = stack.last_mut() {
                let (node, next, restore) = *top;
                let edges = &self.nodes[node].edges;
                if next == edges.len() {
                    prefix.truncate(restore);
                    stack.pop();
                    continue;
                }
                top.1 += 1;
                let last = next + 1 == edges.len();
                out.push_str(&prefix);
                out.push_str(if last { "└── " } else { "├── " });
                match &edges[next] {
                    Edge::External(name) => {
                        out.push_str(name);
                        out.push_str(" (external)\n");
                    }
                    Edge::Absent(name) => {
                        out.push('"');
                        out.push_str(name);
                        out.push_str("\" (absent: under a conditional, found nowhere)\n");
                    }
                    &Edge::File(child) => {
                        out.push_str(&self.nodes[child].stable);
                        if shown[child] {
                            out.push_str(ALREADY_SHOWN);
                        } else {
                            out.push('\n');
                            shown[child] = true;
                            let restore = prefix.len();
                            prefix.push_str(if last { "    " } else { "│   " });
                            stack.push((child, 0, restore));
                        }
                    }
                }
            }
        }
        out
    }
}

/// Why an include graph could not be scanned.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// A source or header could not be read.
    #[error("failed to read `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A quoted include resolved to no file anywhere.
    #[error(
        "header \"{header}\" not found: {}; searched {}",
        describe_chain(chain, location, header),
        describe_dirs(searched)
    )]
    MissingHeader {
        /// The header as spelled between the quotes.
        header: String,
        /// `file:line` of the directive, the file by stable path.
        location: String,
        /// Stable paths from the translation unit down to the includer.
        chain: Vec<String>,
        /// The directories searched, in order.
        searched: Vec<PathBuf>,
    },
    /// `#include` followed by a macro that is not defined in the graph as a header name.
    #[error(
        "computed include `{text}` at {location} is not supported: include the header by name"
    )]
    ComputedInclude {
        /// `file:line` of the directive, the file by stable path.
        location: String,
        /// The directive's line.
        text: String,
    },
    /// `#include` with nothing after it, or a header name with no closing `"` or `>`.
    #[error("malformed include `{text}` at {location}: expected `\"header\"` or `<header>`")]
    MalformedInclude {
        /// `file:line` of the directive, the file by stable path.
        location: String,
        /// The directive's line.
        text: String,
    },
    /// A file in the graph lies neither under the root nor under any include dir.
    #[error(
        "`{}`{} is outside `{}` and every include dir, so it has no stable name for the key: \
         move it under the manifest directory or add its directory to the include dirs",
        path.display(),
        location.as_ref().map(|at| format!(" (included at {at})")).unwrap_or_default(),
        root.display()
    )]
    OutsideRoots {
        /// The file.
        path: PathBuf,
        /// `file:line` of the directive that included it; `None` for a translation unit.
        location: Option<String>,
        /// The root.
        root: PathBuf,
    },
    /// Two different files would get the same stable path (possible only through symlinks).
    #[error(
        "`{}` and `{}` would both be named `{stable}` in the key: replace the symlink with the files",
        first.display(),
        second.display()
    )]
    AmbiguousPath {
        /// The stable path both map to.
        stable: String,
        /// The file named first.
        first: PathBuf,
        /// The other file.
        second: PathBuf,
    },
}

/// `kernels/a.cu → include/x.cuh:3 → "missing.cuh"`.
fn describe_chain(chain: &[String], location: &str, header: &str) -> String {
    let mut out = String::new();
    for file in chain.iter().take(chain.len().saturating_sub(1)) {
        out.push_str(file);
        out.push_str(" → ");
    }
    out.push_str(location);
    out.push_str(" → \"");
    out.push_str(header);
    out.push('"');
    out
}

fn describe_dirs(dirs: &[PathBuf]) -> String {
    let dirs: Vec<String> = dirs.iter().map(|dir| dir.display().to_string()).collect();
    dirs.join(", ")
}

/// Scans the include graphs of `sources` (absolute paths of translation units).
pub fn scan_includes(sources: &[PathBuf], roots: &ScanRoots) -> Result<IncludeGraph, ScanError> {
    let mut scanner = Scanner::new(roots);
    let mut source_nodes = Vec::with_capacity(sources.len());
    for source in sources {
        let canonical = fs::canonicalize(source).map_err(|error| ScanError::Read {
            path: source.clone(),
            source: error,
        })?;
        let node = match scanner.visited.get(&canonical) {
            Some(&node) => node,
            None => scanner.add_node(canonical, source.clone(), None, None)?,
        };
        if !source_nodes.contains(&node) {
            source_nodes.push(node);
        }
    }
    scanner.run()?;
    Ok(scanner.finish(source_nodes))
}

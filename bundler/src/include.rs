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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs::{self, File};
use std::io::Read as _;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Component, Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;

use sha2::{Digest, Sha256};

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

/// A directory stable paths are relative to: the root, or include dir `n`.
struct NamingBase {
    index: Option<usize>,
    canonical: PathBuf,
    lexical: PathBuf,
}

impl NamingBase {
    fn new(index: Option<usize>, dir: &Path) -> Self {
        NamingBase {
            index,
            canonical: fs::canonicalize(dir).unwrap_or_else(|_| normalize_lexically(dir)),
            lexical: normalize_lexically(dir),
        }
    }

    fn name(&self, relative: &Path) -> String {
        let mut out = match self.index {
            Some(n) => format!("[{n}]"),
            None => String::new(),
        };
        for component in relative.components() {
            if !out.is_empty() {
                out.push('/');
            }
            out.push_str(&component.as_os_str().to_string_lossy());
        }
        out
    }
}

struct ScanNode {
    stable: String,
    canonical: PathBuf,
    /// The path it was opened by; quoted includes in it resolve against its directory.
    opened: PathBuf,
    /// The include dir it was found through, where `#include_next` continues.
    dir_index: Option<usize>,
    /// The includer and the line of the directive, for the include chain.
    parent: Option<(usize, u32)>,
    /// For a toolkit or system header: the library file (and line) whose include led to it.
    /// Such a header is followed but neither hashed nor listed; library files it reaches are.
    external_via: Option<(usize, u32)>,
    hash: String,
    edges: Vec<Edge>,
}

/// Threads reading, hashing and lexing files; past a few, the file system is the limit.
const MAX_WORKERS: usize = 8;

/// A file read, hashed and lexed.
struct FileScan {
    hash: String,
    directives: Directives,
}

type FileResult = Result<FileScan, FileFailure>;

enum FileFailure {
    Read(std::io::Error),
    Bad(BadInclude),
}

/// Reads `path` into `buffer` (reused between files), hashes and lexes it.
fn read_file(path: &Path, buffer: &mut Vec<u8>) -> FileResult {
    buffer.clear();
    File::open(path)
        .and_then(|mut file| file.read_to_end(buffer))
        .map_err(FileFailure::Read)?;
    let hash = hex::encode(Sha256::digest(&buffer));
    let mut directives = Directives::default();
    find_includes(buffer, &mut directives).map_err(FileFailure::Bad)?;
    Ok(FileScan { hash, directives })
}

/// A file a candidate path led to.
#[derive(Clone)]
struct Found {
    canonical: PathBuf,
    /// The path it opens by.
    path: PathBuf,
}

impl Found {
    fn at(path: &Path) -> Option<Found> {
        match fs::metadata(path) {
            Ok(metadata) if metadata.is_file() => Some(Found {
                canonical: fs::canonicalize(path).ok()?,
                path: path.to_owned(),
            }),
            _ => None,
        }
    }
}

/// Every definition seen of one macro.
#[derive(Debug, Default)]
struct MacroDefinitions {
    /// Definitions whose replacement is a header name, without repeats.
    headers: Vec<HeaderMacro>,
    /// Whether some definition is anything else.
    opaque: bool,
}

struct Scanner<'r> {
    roots: &'r ScanRoots,
    /// The root, then each include dir.
    bases: Vec<NamingBase>,
    /// Candidate path → the file it leads to, if any.
    probes: HashMap<PathBuf, Option<Found>>,
    /// The external dirs, canonical: a file under one is the toolkit's or the system's.
    external_canonical: Vec<PathBuf>,
    visited: HashMap<PathBuf, usize>,
    by_stable: HashMap<String, usize>,
    nodes: Vec<ScanNode>,
    queue: VecDeque<usize>,
    externals: BTreeSet<String>,
    macros: HashMap<String, MacroDefinitions>,
    /// Each `#include MACRO` with its includer, resolved once every file is scanned.
    macro_includes: Vec<(usize, MacroInclude)>,
}

impl<'r> Scanner<'r> {
    fn new(roots: &'r ScanRoots) -> Self {
        let mut bases = vec![NamingBase::new(None, &roots.root)];
        for (n, dir) in roots.include_dirs.iter().enumerate() {
            bases.push(NamingBase::new(Some(n), dir));
        }
        Scanner {
            roots,
            bases,
            external_canonical: roots
                .external_dirs
                .iter()
                .filter_map(|dir| fs::canonicalize(dir).ok())
                .collect(),
            probes: HashMap::new(),
            visited: HashMap::new(),
            by_stable: HashMap::new(),
            nodes: Vec::new(),
            queue: VecDeque::new(),
            externals: BTreeSet::new(),
            macros: HashMap::new(),
            macro_includes: Vec::new(),
        }
    }

    /// Breadth first, so a missing header's chain is a shortest one. `#include MACRO` waits
    /// until every file is scanned, because the macro may be defined in any of them.
    ///
    /// Worker threads read, hash and lex files as soon as they are discovered; this thread
    /// resolves their includes strictly in discovery order, so the result and the first error
    /// do not depend on timing.
    fn run(&mut self) -> Result<(), ScanError> {
        let workers = thread::available_parallelism().map_or(1, |n| n.get().min(MAX_WORKERS));
        thread::scope(|scope| {
            // Both channels end inside this closure, also when it unwinds, so the workers
            // always stop and the scope can join them.
            let (job_sender, jobs) = mpsc::channel::<(usize, PathBuf)>();
            let (done_sender, done) = mpsc::channel();
            let jobs = Arc::new(Mutex::new(jobs));
            for _ in 0..workers {
                let (jobs, done_sender) = (Arc::clone(&jobs), done_sender.clone());
                scope.spawn(move || {
                    let mut buffer = Vec::new();
                    loop {
                        let job = match jobs.lock() {
                            Ok(jobs) => jobs.recv(),
                            Err(_) => break,
                        };
                        let Ok((index, path)) = job else { break };
                        // A panic is handed to the resolving thread rather than leaving it
                        // waiting for this file forever.
                        let scan =
                            panic::catch_unwind(AssertUnwindSafe(|| read_file(&path, &mut buffer)));
                        if done_sender.send((index, scan)).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(done_sender);
            self.resolve_all(&job_sender, &done)
        })
    }

    fn resolve_all(
        &mut self,
        jobs: &mpsc::Sender<(usize, PathBuf)>,
        done: &mpsc::Receiver<(usize, thread::Result<FileResult>)>,
    ) -> Result<(), ScanError> {
        let mut dispatched = 0;
        let mut ready = HashMap::new();
        while let Some(index) = self.queue.pop_front() {
            for node in &self.nodes[dispatched..] {
                // The workers outlive `jobs`, so this cannot fail.
                let _ = jobs.send((dispatched, node.opened.clone()));
                dispatched += 1;
            }
            let scan = loop {
                if let Some(scan) = ready.remove(&index) {
                    break scan;
                }
                let Ok((finished, scan)) = done.recv() else {
                    unreachable!("the workers stop only when `jobs` closes");
                };
                ready.insert(finished, scan);
            };
            let scan = scan.unwrap_or_else(|payload| panic::resume_unwind(payload));
            self.add_file(index, scan)?;
        }
        self.resolve_macro_includes()
    }

    /// Records a scanned file and resolves its includes.
    fn add_file(&mut self, index: usize, scan: FileResult) -> Result<(), ScanError> {
        if let Some(via) = self.nodes[index].external_via {
            return self.add_external_file(index, via, scan);
        }
        let scan = scan.map_err(|failure| match failure {
            FileFailure::Read(source) => ScanError::Read {
                path: self.nodes[index].opened.clone(),
                source,
            },
            FileFailure::Bad(bad) => {
                let location = self.location(index, bad.line);
                match bad.kind {
                    BadKind::Computed => ScanError::ComputedInclude {
                        location,
                        text: bad.text,
                    },
                    BadKind::Malformed => ScanError::MalformedInclude {
                        location,
                        text: bad.text,
                    },
                }
            }
        })?;
        self.nodes[index].hash = scan.hash;
        let directives = scan.directives;
        for include in &directives.includes {
            let edge = self.resolve(index, include)?;
            self.add_edge(index, edge);
        }
        for define in directives.defines {
            let definitions = self.macros.entry(define.name).or_default();
            match define.header {
                Some(header) if !definitions.headers.contains(&header) => {
                    definitions.headers.push(header);
                }
                Some(_) => {}
                None => definitions.opaque = true,
            }
        }
        for include in directives.macro_includes {
            self.macro_includes.push((index, include));
        }
        Ok(())
    }

    /// Follows a toolkit or system header's includes, looking only for library files: the
    /// toolkit's version and the host compiler stand for the header itself, so what it says
    /// beyond its includes (a computed include, a header that is not there on this machine)
    /// is not the scanner's business. A library file it reaches joins the graph under the
    /// library file that included the header.
    fn add_external_file(
        &mut self,
        index: usize,
        via: (usize, u32),
        scan: FileResult,
    ) -> Result<(), ScanError> {
        let directives = match scan {
            Ok(scan) => scan.directives,
            Err(FileFailure::Read(_)) => return Ok(()),
            Err(FileFailure::Bad(_)) => match scan_lenient(&self.nodes[index].opened) {
                Some(directives) => directives,
                None => return Ok(()),
            },
        };
        for include in &directives.includes {
            if let Ok(Edge::File(node)) = self.resolve(index, include) {
                if self.nodes[node].external_via.is_none() {
                    self.add_edge(via.0, Edge::File(node));
                }
            }
        }
        Ok(())
    }

    fn add_edge(&mut self, index: usize, edge: Edge) {
        if !self.nodes[index].edges.contains(&edge) {
            self.nodes[index].edges.push(edge);
        }
    }

    /// Takes `#include MACRO` where every definition of `MACRO` in the graph expands to an
    /// angle include found in no include dir (so external); refuses it otherwise.
    fn resolve_macro_includes(&mut self) -> Result<(), ScanError> {
        let roots = self.roots;
        for (includer, include) in std::mem::take(&mut self.macro_includes) {
            let refuse = |scanner: &Self| ScanError::ComputedInclude {
                location: scanner.location(includer, include.line),
                text: include.text.clone(),
            };
            let expanded: Option<Vec<String>> = match self.macros.get(&include.name) {
                Some(definitions) if !definitions.opaque => definitions
                    .headers
                    .iter()
                    .map(|header| match header.kind {
                        IncludeKind::Angle => header.expand(include.args.as_deref()),
                        _ => None,
                    })
                    .collect(),
                _ => None,
            };
            let Some(names) = expanded else {
                return Err(refuse(self));
            };
            for name in &names {
                if roots
                    .include_dirs
                    .iter()
                    .any(|dir| self.probe(dir.join(name)).is_some())
                {
                    return Err(refuse(self));
                }
            }
            for name in names {
                self.externals.insert(name.clone());
                self.add_edge(includer, Edge::External(name));
            }
        }
        Ok(())
    }

    fn resolve(&mut self, includer: usize, include: &Include) -> Result<Edge, ScanError> {
        let roots = self.roots;
        let name: &str = &include.name;
        let first_dir = match include.kind {
            IncludeKind::Quoted => {
                let includer_dir = self.nodes[includer]
                    .opened
                    .parent()
                    .unwrap_or(Path::new("/"))
                    .to_path_buf();
                let candidate = includer_dir.join(name);
                if let Some(edge) = self.try_local(candidate, None, includer, include.line)? {
                    return Ok(edge);
                }
                0
            }
            IncludeKind::Angle => 0,
            IncludeKind::Next => self.nodes[includer].dir_index.map_or(0, |n| n + 1),
        };
        for (n, dir) in roots.include_dirs.iter().enumerate().skip(first_dir) {
            if let Some(edge) = self.try_local(dir.join(name), Some(n), includer, include.line)? {
                return Ok(edge);
            }
        }
        // Past the include dirs: the toolkit's and the host compiler's. The header is followed
        // (a library file it includes is part of the compile) but stays external.
        let after_include_dirs = roots.include_dirs.len();
        let skip_external = match (include.kind, self.nodes[includer].external_via) {
            (IncludeKind::Next, Some(_)) => self.nodes[includer]
                .dir_index
                .map_or(0, |n| n.saturating_sub(after_include_dirs) + 1),
            _ => 0,
        };
        let found = roots
            .external_dirs
            .iter()
            .enumerate()
            .skip(skip_external)
            .find_map(|(n, dir)| Some((n, self.probe(dir.join(name))?)));
        let found_external = found.is_some();
        if let Some((n, found)) = found {
            self.follow_external(found, after_include_dirs + n, includer, include.line);
        }
        let is_external_includer = self.nodes[includer].external_via.is_some();
        if is_external_includer {
            return Ok(Edge::External(name.to_owned()));
        }
        if include.kind == IncludeKind::Quoted && !found_external {
            let includer_dir = self.nodes[includer].opened.parent().map(Path::to_path_buf);
            return Err(ScanError::MissingHeader {
                header: name.to_owned(),
                location: self.location(includer, include.line),
                chain: self.chain(includer),
                searched: includer_dir
                    .into_iter()
                    .chain(roots.include_dirs.iter().cloned())
                    .chain(roots.external_dirs.iter().cloned())
                    .collect(),
            });
        }
        // Angle includes need no look in the external dirs: found there or nowhere, they are
        // external either way.
        if !self.externals.contains(name) {
            self.externals.insert(name.to_owned());
        }
        Ok(Edge::External(name.to_owned()))
    }

    /// Queues a toolkit or system header to be followed, once.
    fn follow_external(&mut self, found: Found, dir_index: usize, includer: usize, line: u32) {
        if self.visited.contains_key(&found.canonical) {
            return;
        }
        let via = self.nodes[includer]
            .external_via
            .unwrap_or((includer, line));
        let index = self.nodes.len();
        self.visited.insert(found.canonical.clone(), index);
        self.nodes.push(ScanNode {
            stable: found.canonical.display().to_string(),
            canonical: found.canonical,
            opened: found.path,
            dir_index: Some(dir_index),
            parent: Some(via),
            hash: String::new(),
            edges: Vec::new(),
            external_via: Some(via),
        });
        self.queue.push_back(index);
    }

    /// The node for `candidate` if it is a file, added to the graph when new.
    fn try_local(
        &mut self,
        candidate: PathBuf,
        dir_index: Option<usize>,
        includer: usize,
        line: u32,
    ) -> Result<Option<Edge>, ScanError> {
        let Some(found) = self.probe(candidate) else {
            return Ok(None);
        };
        if let Some(&node) = self.visited.get(&found.canonical) {
            return Ok(Some(match &self.nodes[node].external_via {
                Some(_) => Edge::External(found.path.display().to_string()),
                None => Edge::File(node),
            }));
        }
        if let Some(via) = self.nodes[includer].external_via {
            // A quoted include next to a toolkit header is the toolkit's own, unless it lies
            // under an include dir (or the root) and not in a toolkit dir.
            let in_external_dir = self
                .external_canonical
                .iter()
                .any(|dir| found.canonical.starts_with(dir));
            if in_external_dir
                || self
                    .stable_name(&found.canonical, &found.path, dir_index)
                    .is_none()
            {
                let external_dir = self.nodes[includer].dir_index.unwrap_or(0);
                let name = found.path.display().to_string();
                self.follow_external(found, external_dir, includer, line);
                return Ok(Some(Edge::External(name)));
            }
            let node = self.add_node(found.canonical, found.path, dir_index, Some(via))?;
            return Ok(Some(Edge::File(node)));
        }
        let node = self.add_node(
            found.canonical,
            found.path,
            dir_index,
            Some((includer, line)),
        )?;
        Ok(Some(Edge::File(node)))
    }

    /// Where `candidate` is when it is a file. The file system resolves `..` first; when that
    /// finds nothing (`sub/../x.cuh` with no `sub`), `..` is resolved lexically, so the scanner
    /// finds at least what the compiler finds.
    fn probe(&mut self, candidate: PathBuf) -> Option<Found> {
        if let Some(known) = self.probes.get(&candidate) {
            return known.clone();
        }
        let mut found = Found::at(&candidate);
        if found.is_none() && candidate.components().any(|c| c == Component::ParentDir) {
            found = Found::at(&normalize_lexically(&candidate));
        }
        self.probes.insert(candidate, found.clone());
        found
    }

    fn add_node(
        &mut self,
        canonical: PathBuf,
        opened: PathBuf,
        dir_index: Option<usize>,
        parent: Option<(usize, u32)>,
    ) -> Result<usize, ScanError> {
        let Some(stable) = self.stable_name(&canonical, &opened, dir_index) else {
            return Err(ScanError::OutsideRoots {
                path: canonical,
                location: parent.map(|(includer, line)| self.location(includer, line)),
                root: self.roots.root.clone(),
            });
        };
        if let Some(&other) = self.by_stable.get(&stable) {
            return Err(ScanError::AmbiguousPath {
                stable,
                first: self.nodes[other].canonical.clone(),
                second: canonical,
            });
        }
        let index = self.nodes.len();
        self.by_stable.insert(stable.clone(), index);
        self.visited.insert(canonical.clone(), index);
        self.nodes.push(ScanNode {
            stable,
            canonical,
            opened,
            dir_index,
            parent,
            hash: String::new(),
            edges: Vec::new(),
            external_via: None,
        });
        self.queue.push_back(index);
        Ok(index)
    }

    /// Relative to the root, else to the include dir it was found through, else to the first
    /// include dir holding it. Canonical paths first; the spelled path second, so that a
    /// symlink under the root pointing elsewhere still gets a name under the root.
    fn stable_name(
        &self,
        canonical: &Path,
        opened: &Path,
        dir_index: Option<usize>,
    ) -> Option<String> {
        let found_through = dir_index.map(|n| &self.bases[n + 1]);
        let order = || {
            std::iter::once(&self.bases[0])
                .chain(found_through)
                .chain(self.bases[1..].iter())
        };
        for base in order() {
            if let Ok(relative) = canonical.strip_prefix(&base.canonical) {
                return Some(base.name(relative));
            }
        }
        let lexical = normalize_lexically(opened);
        for base in order() {
            if let Ok(relative) = lexical.strip_prefix(&base.lexical) {
                return Some(base.name(relative));
            }
        }
        None
    }

    fn location(&self, index: usize, line: u32) -> String {
        format!("{}:{line}", self.nodes[index].stable)
    }

    /// Stable paths from the translation unit down to `index`.
    fn chain(&self, mut index: usize) -> Vec<String> {
        let mut chain = vec![self.nodes[index].stable.clone()];
        while let Some((parent, _)) = self.nodes[index].parent {
            chain.push(self.nodes[parent].stable.clone());
            index = parent;
        }
        chain.reverse();
        chain
    }

    fn finish(self, sources: Vec<usize>) -> IncludeGraph {
        // Toolkit and system headers leave the graph; library files keep their order.
        let mut renumbered = vec![usize::MAX; self.nodes.len()];
        let mut next = 0;
        for (old, node) in self.nodes.iter().enumerate() {
            if node.external_via.is_none() {
                renumbered[old] = next;
                next += 1;
            }
        }
        let files = self
            .nodes
            .iter()
            .filter(|node| node.external_via.is_none())
            .map(|node| (node.stable.clone(), node.hash.clone()))
            .collect();
        let nodes = self
            .nodes
            .into_iter()
            .filter(|node| node.external_via.is_none())
            .map(|node| GraphNode {
                stable: node.stable,
                absolute: node.canonical,
                edges: node
                    .edges
                    .into_iter()
                    .map(|edge| match edge {
                        Edge::File(old) => Edge::File(renumbered[old]),
                        external => external,
                    })
                    .collect(),
            })
            .collect();
        IncludeGraph {
            files,
            externals: self.externals,
            nodes,
            sources: sources.into_iter().map(|old| renumbered[old]).collect(),
            by_stable: self
                .by_stable
                .into_iter()
                .map(|(stable, old)| (stable, renumbered[old]))
                .collect(),
        }
    }
}

/// Resolves `.` and `..` without touching the file system.
fn normalize_lexically(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push(component);
                }
            }
            other => out.push(other),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The lexer: finds `#include` and `#define` directives in a file's bytes.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IncludeKind {
    /// `#include "x"`.
    Quoted,
    /// `#include <x>`.
    Angle,
    /// `#include_next`, either spelling.
    Next,
}

#[derive(Debug, PartialEq, Eq)]
struct Include {
    kind: IncludeKind,
    name: String,
    /// 1-based line of the `#`.
    line: u32,
}

#[derive(Debug)]
enum BadKind {
    Computed,
    Malformed,
}

#[derive(Debug)]
struct BadInclude {
    kind: BadKind,
    line: u32,
    text: String,
}

/// What the lexer collects from one file.
#[derive(Debug, Default)]
struct Directives {
    includes: Vec<Include>,
    macro_includes: Vec<MacroInclude>,
    defines: Vec<Define>,
}

/// `#include NAME` or `#include NAME(args)`.
#[derive(Debug, PartialEq, Eq)]
struct MacroInclude {
    line: u32,
    /// The directive's line, for errors.
    text: String,
    name: String,
    /// `None` without parentheses.
    args: Option<Vec<String>>,
}

/// A `#define`, with its replacement when that is a header name.
#[derive(Debug, PartialEq, Eq)]
struct Define {
    name: String,
    header: Option<HeaderMacro>,
}

/// A macro whose replacement is `<…>` or `"…"`, such as CUTLASS's
/// `#define CUDA_STD_HEADER(header) <cuda/std/header>`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct HeaderMacro {
    /// `None` for an object-like macro.
    params: Option<Vec<String>>,
    /// [`IncludeKind::Quoted`] or [`IncludeKind::Angle`].
    kind: IncludeKind,
    /// The replacement between the delimiters.
    template: String,
}

impl HeaderMacro {
    /// The header `NAME` or `NAME(args)` expands to, or `None` when the call does not fit.
    fn expand(&self, args: Option<&[String]>) -> Option<String> {
        let (params, args) = match (&self.params, args) {
            (None, None) => return Some(self.template.clone()),
            (Some(params), Some(args)) if params.len() == args.len() => (params, args),
            (Some(params), Some([only])) if params.is_empty() && only.is_empty() => {
                return Some(self.template.clone())
            }
            _ => return None,
        };
        // Parameters are not replaced inside a string literal.
        if self.kind == IncludeKind::Quoted {
            return Some(self.template.clone());
        }
        let template = self.template.as_bytes();
        let mut out = String::with_capacity(template.len());
        let mut i = 0;
        while i < template.len() {
            let start = i;
            if template[i].is_ascii_alphabetic() || template[i] == b'_' {
                while i < template.len() && is_identifier_byte(template[i]) {
                    i += 1;
                }
                let word = &self.template[start..i];
                match params.iter().position(|param| param == word) {
                    Some(k) => out.push_str(&args[k]),
                    None => out.push_str(word),
                }
            } else {
                i += 1;
                while !self.template.is_char_boundary(i) {
                    i += 1;
                }
                out.push_str(&self.template[start..i]);
            }
        }
        Some(out)
    }
}

/// Parses `#define` after its keyword; returns where ordinary lexing resumes (the body is lexed
/// like any code, so a comment opened there is honoured).
fn define(source: &[u8], after_keyword: usize, out: &mut Directives) -> usize {
    let start = skip_blanks(source, after_keyword);
    let mut end = start;
    while end < source.len() && is_identifier_byte(source[end]) {
        end += 1;
    }
    if start == end || source[start].is_ascii_digit() {
        return start;
    }
    let name = String::from_utf8_lossy(&source[start..end]).into_owned();
    let header = header_macro(source, end);
    out.defines.push(Define { name, header });
    end
}

/// The replacement of the macro whose parameter list (if any) starts at `i`, when it is a
/// header name and nothing else.
fn header_macro(source: &[u8], mut i: usize) -> Option<HeaderMacro> {
    let params = if source.get(i) == Some(&b'(') {
        let mut params = Vec::new();
        i += 1;
        loop {
            i = skip_blanks(source, i);
            let start = i;
            while i < source.len() && is_identifier_byte(source[i]) {
                i += 1;
            }
            let named = start < i;
            if named {
                params.push(String::from_utf8_lossy(&source[start..i]).into_owned());
                i = skip_blanks(source, i);
            }
            match source.get(i) {
                Some(b',') if named => i += 1,
                Some(b')') => {
                    i += 1;
                    break;
                }
                // Variadic, or not a parameter list this lexer understands.
                _ => return None,
            }
        }
        Some(params)
    } else {
        None
    };
    let open = skip_blanks(source, i);
    let (close, kind) = match source.get(open) {
        Some(b'<') => (b'>', IncludeKind::Angle),
        Some(b'"') => (b'"', IncludeKind::Quoted),
        _ => return None,
    };
    let length = source[open + 1..]
        .iter()
        .position(|&byte| byte == close || byte == b'\n')?;
    let end = open + 1 + length;
    if source[end] != close || !at_line_end(source, end + 1) {
        return None;
    }
    Some(HeaderMacro {
        params,
        kind,
        template: String::from_utf8_lossy(&source[open + 1..end]).into_owned(),
    })
}

/// Parses `NAME` or `NAME(args)` at `start`, the rest of the line being blank.
fn macro_include(source: &[u8], start: usize) -> Option<(String, Option<Vec<String>>)> {
    let mut i = start;
    while i < source.len() && is_identifier_byte(source[i]) {
        i += 1;
    }
    let name = String::from_utf8_lossy(&source[start..i]).into_owned();
    let after_name = skip_blanks(source, i);
    let (args, end) = if source.get(after_name) == Some(&b'(') {
        let mut args = Vec::new();
        let mut depth = 0usize;
        let mut arg_start = after_name + 1;
        let mut j = arg_start;
        loop {
            match *source.get(j)? {
                b'\n' => return None,
                b'(' => depth += 1,
                b')' if depth > 0 => depth -= 1,
                b')' => break,
                b',' if depth == 0 => {
                    args.push(trimmed(&source[arg_start..j]));
                    arg_start = j + 1;
                }
                _ => {}
            }
            j += 1;
        }
        args.push(trimmed(&source[arg_start..j]));
        (Some(args), j + 1)
    } else {
        (None, i)
    };
    at_line_end(source, end).then_some((name, args))
}

fn trimmed(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_owned()
}

/// Whether only blanks and comments follow `i` on its line.
fn at_line_end(source: &[u8], i: usize) -> bool {
    let rest = skip_blanks(source, i);
    match source.get(rest) {
        None | Some(b'\n') => true,
        Some(b'/') => source.get(skip_splices(source, rest + 1)) == Some(&b'/'),
        _ => false,
    }
}

/// Bytes that can change the lexer's state in the middle of a line.
const SPECIAL: [bool; 256] = {
    let mut table = [false; 256];
    table[b'\n' as usize] = true;
    table[b'\\' as usize] = true;
    table[b'/' as usize] = true;
    table[b'"' as usize] = true;
    table[b'\'' as usize] = true;
    table
};

fn is_identifier_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// Horizontal whitespace; `\r` too, so CRLF files read like LF ones.
fn is_blank(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | 0x0b | 0x0c | b'\r')
}

/// Appends the `#include` and `#define` directives of `source` to `out`, in order.
fn find_includes(source: &[u8], out: &mut Directives) -> Result<(), BadInclude> {
    let mut lines = LineCounter { at: 0, line: 1 };
    let mut i = 0;
    while i < source.len() {
        // A block comment before the `#` leaves it first on its line, as in the preprocessor.
        i = skip_blanks(source, i);
        if source.get(i) == Some(&b'#') {
            i = directive(source, i, &mut lines, out)?;
        }
        i = skip_rest_of_line(source, i);
    }
    Ok(())
}

/// [`find_includes`] that steps over a directive it cannot take (a computed include in a
/// toolkit header) instead of stopping there.
fn find_includes_lenient(source: &[u8], out: &mut Directives) {
    let mut lines = LineCounter { at: 0, line: 1 };
    let mut i = 0;
    while i < source.len() {
        i = skip_blanks(source, i);
        if source.get(i) == Some(&b'#') {
            if let Ok(next) = directive(source, i, &mut lines, out) {
                i = next;
            }
        }
        i = skip_rest_of_line(source, i);
    }
}

/// The includes of a toolkit or system header whose strict lexing stopped at a directive the
/// scanner refuses in library files; `None` when it cannot be read.
fn scan_lenient(path: &Path) -> Option<Directives> {
    let bytes = fs::read(path).ok()?;
    let mut directives = Directives::default();
    find_includes_lenient(&bytes, &mut directives);
    Some(directives)
}

/// Counts lines forward from the last position asked about; directives come in order.
struct LineCounter {
    at: usize,
    line: u32,
}

impl LineCounter {
    fn line_of(&mut self, source: &[u8], position: usize) -> u32 {
        let newlines = source[self.at..position]
            .iter()
            .filter(|&&byte| byte == b'\n')
            .count();
        self.line += newlines as u32;
        self.at = position;
        self.line
    }
}

/// Parses the directive whose `#` is at `hash`; returns where ordinary lexing resumes.
fn directive(
    source: &[u8],
    hash: usize,
    lines: &mut LineCounter,
    out: &mut Directives,
) -> Result<usize, BadInclude> {
    // The directive name, read across line splices into a small buffer: only `include`,
    // `include_next` and `define` matter, so longer names need not be kept.
    let mut keyword = [0u8; 12];
    let mut length = 0;
    let mut end = skip_blanks(source, hash + 1);
    loop {
        match source.get(end) {
            Some(&byte) if is_identifier_byte(byte) => {
                if let Some(slot) = keyword.get_mut(length) {
                    *slot = byte;
                }
                length += 1;
                end += 1;
            }
            Some(b'\\') if splice_len(source, end) > 0 => end += splice_len(source, end),
            _ => break,
        }
    }
    let kind = match keyword.get(..length) {
        Some(b"include") => None,
        Some(b"include_next") => Some(IncludeKind::Next),
        Some(b"define") => return Ok(define(source, end, out)),
        _ => return Ok(hash + 1),
    };
    let line = lines.line_of(source, hash);
    let open = skip_blanks(source, end);
    let (close, kind) = match source.get(open) {
        Some(b'"') => (b'"', kind.unwrap_or(IncludeKind::Quoted)),
        Some(b'<') => (b'>', kind.unwrap_or(IncludeKind::Angle)),
        Some(&byte) if byte.is_ascii_alphabetic() || byte == b'_' => {
            let Some((name, args)) = macro_include(source, open) else {
                return Err(bad_include(BadKind::Computed, source, hash, line));
            };
            out.macro_includes.push(MacroInclude {
                line,
                text: directive_text(source, hash),
                name,
                args,
            });
            return Ok(open);
        }
        _ => return Err(bad_include(BadKind::Malformed, source, hash, line)),
    };
    let mut i = open + 1;
    let mut spliced = false;
    loop {
        match source.get(i) {
            None | Some(b'\n') => return Err(bad_include(BadKind::Malformed, source, hash, line)),
            Some(&byte) if byte == close => break,
            Some(b'\\') if splice_len(source, i) > 0 => {
                spliced = true;
                i += splice_len(source, i);
            }
            Some(_) => i += 1,
        }
    }
    let raw = &source[open + 1..i];
    let name = if spliced {
        String::from_utf8_lossy(&remove_splices(raw)).into_owned()
    } else {
        String::from_utf8_lossy(raw).into_owned()
    };
    out.includes.push(Include { kind, name, line });
    // Past the closing delimiter, so `<a/*b.h>` opens no comment.
    Ok(i + 1)
}

fn bad_include(kind: BadKind, source: &[u8], hash: usize, line: u32) -> BadInclude {
    BadInclude {
        kind,
        line,
        text: directive_text(source, hash),
    }
}

/// The logical line of the directive whose `#` is at `hash`, splices removed, for messages.
fn directive_text(source: &[u8], hash: usize) -> String {
    let mut end = hash;
    loop {
        match source[end..].iter().position(|&byte| byte == b'\n') {
            Some(offset) if is_spliced_newline(source, end + offset) => end += offset + 1,
            Some(offset) => {
                end += offset;
                break;
            }
            None => {
                end = source.len();
                break;
            }
        }
    }
    let text = remove_splices(&source[hash..end]);
    String::from_utf8_lossy(&text).trim().to_owned()
}

/// Length of the line splice (backslash, optional blanks, newline) at `i`, or 0 when none.
fn splice_len(source: &[u8], i: usize) -> usize {
    let mut j = i + 1;
    while j < source.len() && matches!(source[j], b' ' | b'\t' | 0x0b | 0x0c | b'\r') {
        j += 1;
    }
    if source.get(i) == Some(&b'\\') && source.get(j) == Some(&b'\n') {
        j + 1 - i
    } else {
        0
    }
}

fn skip_splices(source: &[u8], mut i: usize) -> usize {
    while source.get(i) == Some(&b'\\') {
        match splice_len(source, i) {
            0 => break,
            length => i += length,
        }
    }
    i
}

/// Whether the newline at `newline` ends a line splice rather than the logical line.
fn is_spliced_newline(source: &[u8], newline: usize) -> bool {
    let mut j = newline;
    while j > 0 && matches!(source[j - 1], b' ' | b'\t' | 0x0b | 0x0c | b'\r') {
        j -= 1;
    }
    j > 0 && source[j - 1] == b'\\'
}

fn remove_splices(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match splice_len(bytes, i) {
            0 => {
                out.push(bytes[i]);
                i += 1;
            }
            length => i += length,
        }
    }
    out
}

/// Skips blanks, line splices and block comments; stops at a newline or anything else.
fn skip_blanks(source: &[u8], mut i: usize) -> usize {
    while i < source.len() {
        match source[i] {
            byte if is_blank(byte) => i += 1,
            b'\\' => match splice_len(source, i) {
                0 => return i,
                length => i += length,
            },
            b'/' => {
                let next = skip_splices(source, i + 1);
                if source.get(next) == Some(&b'*') {
                    i = skip_block_comment(source, next + 1);
                } else {
                    return i;
                }
            }
            _ => return i,
        }
    }
    i
}

/// Lexes to the end of the logical line; returns the position just past its newline.
fn skip_rest_of_line(source: &[u8], mut i: usize) -> usize {
    let n = source.len();
    while i < n {
        while i < n && !SPECIAL[source[i] as usize] {
            i += 1;
        }
        if i == n {
            break;
        }
        match source[i] {
            b'\n' => return i + 1,
            b'\\' => i += splice_len(source, i).max(1),
            b'/' => {
                let next = skip_splices(source, i + 1);
                match source.get(next) {
                    Some(b'/') => i = skip_line_comment(source, next + 1),
                    Some(b'*') => i = skip_block_comment(source, next + 1),
                    _ => i += 1,
                }
            }
            b'"' => {
                i = if is_raw_string_prefix(source, i) {
                    skip_raw_string(source, i + 1)
                        .unwrap_or_else(|| skip_quoted(source, i + 1, b'"'))
                } else {
                    skip_quoted(source, i + 1, b'"')
                };
            }
            _ => {
                // `'`: a digit separator in `1'000'000`, else a character literal.
                i = if is_digit_separator(source, i) {
                    i + 1
                } else {
                    skip_quoted(source, i + 1, b'\'')
                };
            }
        }
    }
    n
}

/// Returns the position of the newline that ends a `//` comment whose body starts at `i`.
fn skip_line_comment(source: &[u8], mut i: usize) -> usize {
    loop {
        match source[i.min(source.len())..]
            .iter()
            .position(|&byte| byte == b'\n')
        {
            None => return source.len(),
            Some(offset) if is_spliced_newline(source, i + offset) => i += offset + 1,
            Some(offset) => return i + offset,
        }
    }
}

/// Returns the position just past the `*/` closing a comment whose body starts at `i`.
fn skip_block_comment(source: &[u8], mut i: usize) -> usize {
    while i < source.len() {
        match source[i..].iter().position(|&byte| byte == b'*') {
            None => break,
            Some(offset) => i += offset + 1,
        }
        i = skip_splices(source, i);
        if source.get(i) == Some(&b'/') {
            return i + 1;
        }
    }
    source.len()
}

/// Skips a string or character literal whose body starts at `i`. A literal cannot span lines,
/// so an unterminated one ends before the newline, as the preprocessor reads it.
fn skip_quoted(source: &[u8], mut i: usize, quote: u8) -> usize {
    while i < source.len() {
        match source[i] {
            byte if byte == quote => return i + 1,
            b'\\' => i += splice_len(source, i).max(2),
            b'\n' => return i,
            _ => i += 1,
        }
    }
    source.len()
}

/// Whether the `"` at `quote` opens a raw string: `R`, `LR`, `uR`, `UR` or `u8R` right before it,
/// starting a token.
fn is_raw_string_prefix(source: &[u8], quote: usize) -> bool {
    if quote == 0 || source[quote - 1] != b'R' {
        return false;
    }
    let before = &source[..quote - 1];
    let start = match before {
        [.., b'u', b'8'] => quote - 3,
        [.., b'u' | b'U' | b'L'] => quote - 2,
        _ => quote - 1,
    };
    start == 0 || !is_identifier_byte(source[start - 1])
}

/// Returns the position just past a raw string whose delimiter starts at `i`, or `None` when
/// the delimiter is invalid (then it is lexed as an ordinary string).
fn skip_raw_string(source: &[u8], i: usize) -> Option<usize> {
    let mut open = i;
    while open < source.len()
        && open - i <= 16
        && !matches!(
            source[open],
            b'(' | b')' | b'\\' | b'"' | b' ' | b'\t' | 0x0b | 0x0c | b'\r' | b'\n'
        )
    {
        open += 1;
    }
    if source.get(open) != Some(&b'(') || open - i > 16 {
        return None;
    }
    let delimiter = &source[i..open];
    let mut k = open + 1;
    while let Some(offset) = source[k.min(source.len())..]
        .iter()
        .position(|&byte| byte == b')')
    {
        let close = k + offset;
        let rest = &source[close + 1..];
        if rest.starts_with(delimiter) && rest.get(delimiter.len()) == Some(&b'"') {
            return Some(close + 2 + delimiter.len());
        }
        k = close + 1;
    }
    Some(source.len())
}

/// Whether the `'` at `quote` separates digits of a number (`0x1'ff`) rather than opening a
/// character literal (`u8'a'`, `L'a'`).
fn is_digit_separator(source: &[u8], quote: usize) -> bool {
    let mut start = quote;
    while start > 0
        && (is_identifier_byte(source[start - 1]) || matches!(source[start - 1], b'.' | b'\''))
    {
        start -= 1;
    }
    if start == quote {
        return false;
    }
    let first = source[start];
    first.is_ascii_digit()
        || (first == b'.' && source.get(start + 1).is_some_and(u8::is_ascii_digit))
}

#[cfg(test)]
mod tests {
    use super::*;

    use tempfile::TempDir;

    /// A tree of files in a fresh temporary directory.
    fn tree(files: &[(&str, &str)]) -> TempDir {
        let dir = tempfile::tempdir().unwrap();
        write_files(dir.path(), files);
        dir
    }

    fn write_files(base: &Path, files: &[(&str, &str)]) {
        for (path, content) in files {
            let path = base.join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, content).unwrap();
        }
    }

    fn roots(root: &Path, include_dirs: &[&str]) -> ScanRoots {
        ScanRoots {
            root: root.to_owned(),
            include_dirs: include_dirs.iter().map(|dir| root.join(dir)).collect(),
            external_dirs: Vec::new(),
        }
    }

    fn scan(
        root: &Path,
        include_dirs: &[&str],
        sources: &[&str],
    ) -> Result<IncludeGraph, ScanError> {
        let sources: Vec<PathBuf> = sources.iter().map(|source| root.join(source)).collect();
        scan_includes(&sources, &roots(root, include_dirs))
    }

    fn file_names(graph: &IncludeGraph) -> Vec<&str> {
        graph.files().keys().map(String::as_str).collect()
    }

    fn externals(graph: &IncludeGraph) -> Vec<&str> {
        graph.externals().iter().map(String::as_str).collect()
    }

    fn includes(source: &str) -> Vec<(IncludeKind, String, u32)> {
        let mut out = Directives::default();
        find_includes(source.as_bytes(), &mut out).unwrap();
        out.includes
            .into_iter()
            .map(|include| (include.kind, include.name, include.line))
            .collect()
    }

    fn names(source: &str) -> Vec<String> {
        includes(source)
            .into_iter()
            .map(|(_, name, _)| name)
            .collect()
    }

    #[test]
    fn quoted_include_prefers_the_includers_directory() {
        let dir = tree(&[
            ("kernels/a.cu", "#include \"common.cuh\"\n"),
            ("kernels/common.cuh", "// next to the kernel\n"),
            ("include/common.cuh", "// in the include dir\n"),
        ]);
        let graph = scan(dir.path(), &["include"], &["kernels/a.cu"]).unwrap();
        assert_eq!(file_names(&graph), ["kernels/a.cu", "kernels/common.cuh"]);
    }

    #[test]
    fn include_dirs_are_searched_in_order() {
        let dir = tree(&[
            ("kernels/a.cu", "#include \"x.cuh\"\n#include <y.cuh>\n"),
            ("first/x.cuh", ""),
            ("first/y.cuh", ""),
            ("second/x.cuh", ""),
            ("second/y.cuh", ""),
        ]);
        let graph = scan(dir.path(), &["first", "second"], &["kernels/a.cu"]).unwrap();
        assert_eq!(
            file_names(&graph),
            ["first/x.cuh", "first/y.cuh", "kernels/a.cu"]
        );
        let graph = scan(dir.path(), &["second", "first"], &["kernels/a.cu"]).unwrap();
        assert_eq!(
            file_names(&graph),
            ["kernels/a.cu", "second/x.cuh", "second/y.cuh"]
        );
    }

    #[test]
    fn angle_include_is_found_in_an_include_dir() {
        let dir = tree(&[
            ("kernels/a.cu", "#include <af3/x.cuh>\n"),
            (
                "kernels/af3/x.cuh",
                "// angle includes skip the includer's directory\n",
            ),
            ("include/af3/x.cuh", ""),
        ]);
        let graph = scan(dir.path(), &["include"], &["kernels/a.cu"]).unwrap();
        assert_eq!(file_names(&graph), ["include/af3/x.cuh", "kernels/a.cu"]);
        assert!(graph.externals().is_empty());
    }

    #[test]
    fn angle_include_of_an_unknown_header_is_a_system_header() {
        let dir = tree(&[(
            "kernels/a.cu",
            "#include <vector>\n#include <cuda/std/cstdint>\n",
        )]);
        let graph = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
        assert_eq!(file_names(&graph), ["kernels/a.cu"]);
        assert_eq!(externals(&graph), ["cuda/std/cstdint", "vector"]);
    }

    #[test]
    fn library_file_reached_through_a_toolkit_header_is_hashed() {
        let dir = tree(&[
            ("kernels/a.cu", "#include <cuda/std/utility>\n"),
            (
                "toolkit/include/cuda/std/utility",
                "#include <cuda/std/detail/__config>\n#include \"detail/own.h\"\n\
                 #include MACRO_THE_TOOLKIT_USES\n",
            ),
            (
                "toolkit/include/cuda/std/detail/own.h",
                "#include <vendor_hook.h>\n",
            ),
            ("toolkit/include/cuda/std/detail/__config", ""),
            (
                "include/cuda/std/detail/__config",
                "#include_next <cuda/std/detail/__config>\n",
            ),
            ("include/vendor_hook.h", ""),
        ]);
        let mut roots = roots(dir.path(), &["include"]);
        roots.external_dirs = vec![dir.path().join("toolkit/include")];
        let graph = scan_includes(&[dir.path().join("kernels/a.cu")], &roots).unwrap();
        assert_eq!(
            file_names(&graph),
            [
                "include/cuda/std/detail/__config",
                "include/vendor_hook.h",
                "kernels/a.cu"
            ]
        );
        // The library's `__config` continues into the toolkit's with `#include_next`.
        assert_eq!(
            externals(&graph),
            ["cuda/std/detail/__config", "cuda/std/utility"]
        );
        assert!(graph.render_tree().contains("include/vendor_hook.h"));
    }

    #[test]
    fn quoted_include_found_only_in_an_external_dir_is_external() {
        let dir = tree(&[
            ("kernels/a.cu", "#include \"cuda_fp16.h\"\n"),
            ("toolkit/include/cuda_fp16.h", "#include \"not_here.h\"\n"),
        ]);
        let mut roots = roots(dir.path(), &[]);
        roots.external_dirs = vec![dir.path().join("toolkit/include")];
        let graph = scan_includes(&[dir.path().join("kernels/a.cu")], &roots).unwrap();
        assert_eq!(file_names(&graph), ["kernels/a.cu"]);
        assert_eq!(externals(&graph), ["cuda_fp16.h"]);

        roots.external_dirs.clear();
        let error = scan_includes(&[dir.path().join("kernels/a.cu")], &roots).unwrap_err();
        assert!(matches!(error, ScanError::MissingHeader { .. }), "{error}");
    }

    #[test]
    fn include_inside_if_zero_is_taken() {
        let dir = tree(&[
            (
                "kernels/a.cu",
                "#if 0\n#include \"dead.cuh\"\n#else\n#include \"live.cuh\"\n#endif\n\
                 #ifdef NEVER_DEFINED\n  #  include <other/x.cuh>\n#endif\n",
            ),
            ("kernels/dead.cuh", ""),
            ("kernels/live.cuh", ""),
        ]);
        let graph = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
        assert_eq!(
            file_names(&graph),
            ["kernels/a.cu", "kernels/dead.cuh", "kernels/live.cuh"]
        );
        assert_eq!(externals(&graph), ["other/x.cuh"]);
    }

    #[test]
    fn includes_in_comments_are_not_taken() {
        let dir = tree(&[
            (
                "kernels/a.cu",
                "/* a block comment\n#include \"missing1.cuh\"\n   */ int x;\n\
                 // #include \"missing2.cuh\"\n\
                 int y; // continued \\\n#include \"missing3.cuh\"\n\
                 int z; /* opens\n#include \"missing4.cuh\"\n*/\n\
                 /* before the hash */ #include \"real.cuh\"\n",
            ),
            ("kernels/real.cuh", ""),
        ]);
        let graph = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
        assert_eq!(file_names(&graph), ["kernels/a.cu", "kernels/real.cuh"]);
    }

    #[test]
    fn includes_in_string_literals_are_not_taken() {
        let source = "const char* a = \"/*\";\n#include \"one.cuh\"\n\
                      const char* b = \"\\\"/*\";\n#include \"two.cuh\"\n\
                      char c = '\"';\n#include \"three.cuh\"\n\
                      int d = 0x1'ff; /* opens\n#include \"not0.cuh\"\n*/\n#include \"four.cuh\"\n\
                      const char* e = R\"x(\n)y\"\n#include \"not1.cuh\"\n)\" )x\";\n\
                      const char* f = u8R\"(\n#include \"not2.cuh\"\n)\";\n\
                      #include <five.cuh>\n\
                      auto g = u8'a'; auto h = L'/';\n#include \"six.cuh\"\n";
        assert_eq!(
            names(source),
            [
                "one.cuh",
                "two.cuh",
                "three.cuh",
                "four.cuh",
                "five.cuh",
                "six.cuh"
            ]
        );
    }

    #[test]
    fn directive_spellings() {
        let source = "#include\"a.h\"\n  #  include <b.h>\n\t#\tinclude\t\"c.h\"\r\n\
                      # /* c */ include /* c */ <d.h> // trailing\n\
                      #include_next <e.h>\n#import \"f.h\"\n#includes \"g.h\"\n\
                      #if __has_include(\"h.h\") && __has_include(<i.h>)\n#endif\n\
                      #define S(x) #x\nx # include \"j.h\"\n#include <a/*b.h>\n#include \"k.h\"\n";
        assert_eq!(
            includes(source),
            [
                (IncludeKind::Quoted, "a.h".to_owned(), 1),
                (IncludeKind::Angle, "b.h".to_owned(), 2),
                (IncludeKind::Quoted, "c.h".to_owned(), 3),
                (IncludeKind::Angle, "d.h".to_owned(), 4),
                (IncludeKind::Next, "e.h".to_owned(), 5),
                (IncludeKind::Angle, "a/*b.h".to_owned(), 12),
                (IncludeKind::Quoted, "k.h".to_owned(), 13),
            ]
        );
    }

    #[test]
    fn line_continuations() {
        let source = "#define INCLUDE_IT \\\n#include \"not_a_directive.h\"\n\
                      #  include \\\n  \"continued.h\"\n\
                      # inc\\\nlude <split_keyword.h>\n\
                      #include \"split\\\n_name.h\"\n\
                      #define LONG a \\  \n  b \\\r\n#include \"also_not.h\"\n\
                      #include <after.h>\n";
        assert_eq!(
            includes(source),
            [
                (IncludeKind::Quoted, "continued.h".to_owned(), 3),
                (IncludeKind::Angle, "split_keyword.h".to_owned(), 5),
                (IncludeKind::Quoted, "split_name.h".to_owned(), 7),
                (IncludeKind::Angle, "after.h".to_owned(), 12),
            ]
        );
    }

    #[test]
    fn line_continuation_in_a_scanned_tree() {
        let dir = tree(&[
            (
                "kernels/a.cu",
                "#define X \\\n#include \"missing.cuh\"\n#include \\\n  \"real.cuh\"\n",
            ),
            ("kernels/real.cuh", ""),
        ]);
        let graph = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
        assert_eq!(file_names(&graph), ["kernels/a.cu", "kernels/real.cuh"]);
    }

    #[test]
    fn computed_include_is_refused_with_its_location() {
        let dir = tree(&[(
            "kernels/a.cu",
            "// one\n// two\n#include <vector>\n\n/* five\nsix */\n#include KERNEL_HEADER\n",
        )]);
        let error = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap_err();
        match &error {
            ScanError::ComputedInclude { location, text } => {
                assert_eq!(location, "kernels/a.cu:7");
                assert_eq!(text, "#include KERNEL_HEADER");
            }
            other => panic!("unexpected error: {other}"),
        }
        assert_eq!(
            error.to_string(),
            "computed include `#include KERNEL_HEADER` at kernels/a.cu:7 is not supported: \
             include the header by name"
        );
    }

    #[test]
    fn header_macros_are_recognized() {
        let mut out = Directives::default();
        let source = "#define STD(header) <cuda/std/header>\n\
                      #  define PAIR( a , b ) <a/b.hpp> // two\n#define WORD(h) <h/hh.h>\n\
                      #define LOCAL \"kernels/impl.cuh\" /* why */\n\
                      #define EMPTY\n#define SUM(a, b) ((a) + (b))\n#define VARIADIC(...) <x.h>\n\
                      #define TRAILING <x.h> extra\n#include STD(cstdint)\n#include LOCAL\n";
        find_includes(source.as_bytes(), &mut out).unwrap();
        let defines: Vec<(&str, Option<String>)> =
            out.defines
                .iter()
                .map(|define| {
                    let expansion = define.header.as_ref().and_then(|header| {
                        let args = header.params.as_ref().map(|params| {
                            params.iter().map(|p| format!("<{p}>")).collect::<Vec<_>>()
                        });
                        header.expand(args.as_deref())
                    });
                    (define.name.as_str(), expansion)
                })
                .collect();
        assert_eq!(
            defines,
            [
                ("STD", Some("cuda/std/<header>".to_owned())),
                ("PAIR", Some("<a>/<b>.hpp".to_owned())),
                ("WORD", Some("<h>/hh.<h>".to_owned())),
                ("LOCAL", Some("kernels/impl.cuh".to_owned())),
                ("EMPTY", None),
                ("SUM", None),
                ("VARIADIC", None),
                ("TRAILING", None),
            ]
        );
        let pair = out.defines[1].header.as_ref().unwrap();
        let args = ["cute".to_owned(), "tensor".to_owned()];
        assert_eq!(pair.expand(Some(&args)).as_deref(), Some("cute/tensor.hpp"));
        assert_eq!(pair.expand(Some(&args[..1])), None);
        assert_eq!(pair.expand(None), None);
        assert_eq!(
            out.macro_includes,
            [
                MacroInclude {
                    line: 9,
                    text: "#include STD(cstdint)".to_owned(),
                    name: "STD".to_owned(),
                    args: Some(vec!["cstdint".to_owned()]),
                },
                MacroInclude {
                    line: 10,
                    text: "#include LOCAL".to_owned(),
                    name: "LOCAL".to_owned(),
                    args: None,
                },
            ]
        );
    }

    #[test]
    fn include_through_a_macro_naming_external_headers_is_taken() {
        // CUTLASS 4 spells its standard headers this way.
        let dir = tree(&[
            (
                "kernels/a.cu",
                "#include \"config.cuh\"\n#include CUDA_STD_HEADER(cstdint)\n",
            ),
            (
                "kernels/config.cuh",
                "#include \"prefix.cuh\"\n#if !defined(CCCL_PREFIX)\n\
                 #  define CUDA_STD_HEADER(header) <cuda/std/header>\n#endif\n",
            ),
            // Scanned after the include that uses its definition.
            (
                "kernels/prefix.cuh",
                "#define CUDA_STD_HEADER(header) <cccl/cuda/std/header>\n",
            ),
        ]);
        let graph = scan(dir.path(), &["include"], &["kernels/a.cu"]).unwrap();
        assert_eq!(
            file_names(&graph),
            ["kernels/a.cu", "kernels/config.cuh", "kernels/prefix.cuh"]
        );
        assert_eq!(
            externals(&graph),
            ["cccl/cuda/std/cstdint", "cuda/std/cstdint"]
        );
        assert_eq!(
            graph.render_tree(),
            "\
kernels/a.cu
├── kernels/config.cuh
│   └── kernels/prefix.cuh
├── cuda/std/cstdint (external)
└── cccl/cuda/std/cstdint (external)
"
        );
    }

    #[test]
    fn include_through_a_macro_that_could_name_a_local_file_is_refused() {
        let cases = [
            // A quoted header: its content would be part of the key.
            "#define KERNEL_IMPL \"impl.cuh\"\n",
            // An angle header found in an include dir.
            "#define KERNEL_IMPL <af3/impl.cuh>\n",
            // One definition that is not a header name at all.
            "#ifdef A\n#define KERNEL_IMPL <cuda/std/cstdint>\n#else\n#define KERNEL_IMPL PICK(b)\n#endif\n",
        ];
        for config in cases {
            let dir = tree(&[
                (
                    "kernels/a.cu",
                    "#include \"config.cuh\"\n#include KERNEL_IMPL\n",
                ),
                ("kernels/config.cuh", config),
                ("kernels/impl.cuh", ""),
                ("include/af3/impl.cuh", ""),
            ]);
            let error = scan(dir.path(), &["include"], &["kernels/a.cu"]).unwrap_err();
            assert_eq!(
                error.to_string(),
                "computed include `#include KERNEL_IMPL` at kernels/a.cu:2 is not supported: \
                 include the header by name",
                "{config}"
            );
        }
    }

    #[test]
    fn malformed_include_is_refused() {
        let dir = tree(&[("kernels/a.cu", "\n#include <vector\n")]);
        let error = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "malformed include `#include <vector` at kernels/a.cu:2: expected `\"header\"` or `<header>`"
        );
    }

    #[test]
    fn missing_header_names_the_include_chain() {
        let dir = tree(&[
            ("kernels/a.cu", "#include <af3/x.cuh>\n"),
            ("include/af3/x.cuh", "#pragma once\n#include \"y.cuh\"\n"),
            (
                "include/af3/y.cuh",
                "#pragma once\n\n#include \"missing.cuh\"\n",
            ),
        ]);
        let error = scan(dir.path(), &["include"], &["kernels/a.cu"]).unwrap_err();
        let ScanError::MissingHeader {
            header,
            location,
            chain,
            searched,
        } = &error
        else {
            panic!("unexpected error: {error}");
        };
        assert_eq!(header, "missing.cuh");
        assert_eq!(location, "include/af3/y.cuh:3");
        assert_eq!(
            chain,
            &["kernels/a.cu", "include/af3/x.cuh", "include/af3/y.cuh"]
        );
        assert_eq!(
            searched,
            &[dir.path().join("include/af3"), dir.path().join("include")]
        );
        assert_eq!(
            error.to_string(),
            format!(
                "header \"missing.cuh\" not found: kernels/a.cu → include/af3/x.cuh → \
                 include/af3/y.cuh:3 → \"missing.cuh\"; searched {}, {}",
                dir.path().join("include/af3").display(),
                dir.path().join("include").display()
            )
        );
    }

    #[test]
    fn include_cycles_terminate() {
        for guard in ["", "#pragma once\n"] {
            let dir = tree(&[
                ("kernels/a.cu", "#include \"a.cuh\"\n"),
                ("kernels/a.cuh", &format!("{guard}#include \"b.cuh\"\n")),
                (
                    "kernels/b.cuh",
                    &format!("{guard}#include \"a.cuh\"\n#include \"b.cuh\"\n"),
                ),
            ]);
            let graph = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
            assert_eq!(
                file_names(&graph),
                ["kernels/a.cu", "kernels/a.cuh", "kernels/b.cuh"]
            );
            assert_eq!(
                graph.render_tree(),
                "kernels/a.cu\n\
                 └── kernels/a.cuh\n    \
                     └── kernels/b.cuh\n        \
                         ├── kernels/a.cuh (already shown)\n        \
                         └── kernels/b.cuh (already shown)\n"
            );
        }
    }

    #[test]
    fn files_outside_the_root_are_named_by_include_dir() {
        let dir = tree(&[(
            "kernels/a.cu",
            "#include <cute/tensor.hpp>\n#include \"local.cuh\"\n",
        )]);
        write_files(dir.path(), &[("kernels/local.cuh", "")]);
        let first = tree(&[("unused.h", "")]);
        let vendor = tree(&[
            (
                "cute/tensor.hpp",
                "#include \"layout.hpp\"\n#include \"../cute/layout.hpp\"\n",
            ),
            ("cute/layout.hpp", ""),
        ]);
        let roots = ScanRoots {
            root: dir.path().to_owned(),
            include_dirs: vec![first.path().to_owned(), vendor.path().to_owned()],
            external_dirs: Vec::new(),
        };
        let graph = scan_includes(&[dir.path().join("kernels/a.cu")], &roots).unwrap();
        assert_eq!(
            file_names(&graph),
            [
                "[1]/cute/layout.hpp",
                "[1]/cute/tensor.hpp",
                "kernels/a.cu",
                "kernels/local.cuh"
            ]
        );
        assert_eq!(
            graph.absolute_path("[1]/cute/layout.hpp"),
            Some(
                fs::canonicalize(vendor.path().join("cute/layout.hpp"))
                    .unwrap()
                    .as_path()
            )
        );
        assert_eq!(graph.absolute_path("cute/layout.hpp"), None);
    }

    #[test]
    fn a_file_outside_every_root_is_refused() {
        let dir = tree(&[
            ("project/kernels/a.cu", "#include \"../../elsewhere.cuh\"\n"),
            ("elsewhere.cuh", ""),
        ]);
        let root = dir.path().join("project");
        let error = scan(&root, &[], &["kernels/a.cu"]).unwrap_err();
        assert!(matches!(error, ScanError::OutsideRoots { .. }), "{error}");
        assert!(
            error.to_string().contains("(included at kernels/a.cu:1)"),
            "{error}"
        );
    }

    #[test]
    fn a_symlink_under_the_root_keeps_its_name_under_the_root() {
        let dir = tree(&[("kernels/a.cu", "#include \"../third_party/lib/x.cuh\"\n")]);
        let elsewhere = tree(&[("x.cuh", "#include \"y.cuh\"\n"), ("y.cuh", "")]);
        fs::create_dir(dir.path().join("third_party")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("third_party/lib")).unwrap();
        let graph = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
        assert_eq!(
            file_names(&graph),
            [
                "kernels/a.cu",
                "third_party/lib/x.cuh",
                "third_party/lib/y.cuh"
            ]
        );
    }

    #[test]
    fn paths_are_normalized_and_files_deduplicated() {
        let dir = tree(&[
            (
                "kernels/a.cu",
                "#include \"../include/./af3/../af3/x.cuh\"\n#include <af3/x.cuh>\n\
                 #include \"sub/../b.cuh\"\n#include \"no_such_dir/../c.cuh\"\n",
            ),
            ("kernels/sub/.keep", ""),
            ("kernels/c.cuh", ""),
            ("kernels/b.cuh", ""),
            ("include/af3/x.cuh", ""),
        ]);
        let graph = scan(
            dir.path(),
            &["include/../include"],
            &["kernels/a.cu", "kernels/../kernels/a.cu"],
        )
        .unwrap();
        assert_eq!(
            file_names(&graph),
            [
                "include/af3/x.cuh",
                "kernels/a.cu",
                "kernels/b.cuh",
                "kernels/c.cuh"
            ]
        );
    }

    #[test]
    fn include_next_continues_after_the_includers_dir() {
        let dir = tree(&[
            ("kernels/a.cu", "#include <wrap.h>\n"),
            ("first/wrap.h", "#include_next <wrap.h>\n"),
            ("second/wrap.h", "#include_next <wrap.h>\n"),
        ]);
        let graph = scan(dir.path(), &["first", "second"], &["kernels/a.cu"]).unwrap();
        assert_eq!(
            file_names(&graph),
            ["first/wrap.h", "kernels/a.cu", "second/wrap.h"]
        );
        assert_eq!(externals(&graph), ["wrap.h"]);
    }

    #[test]
    fn the_hash_follows_the_content() {
        let dir = tree(&[
            ("kernels/a.cu", "#include \"x.cuh\"\n"),
            ("kernels/x.cuh", "int x;\n"),
        ]);
        let before = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
        assert_eq!(
            before.files()["kernels/x.cuh"],
            hex::encode(Sha256::digest(b"int x;\n"))
        );
        fs::write(dir.path().join("kernels/x.cuh"), "int y;\n").unwrap();
        let after = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
        assert_ne!(
            before.files()["kernels/x.cuh"],
            after.files()["kernels/x.cuh"]
        );
        assert_eq!(
            before.files()["kernels/a.cu"],
            after.files()["kernels/a.cu"]
        );
    }

    #[test]
    fn stable_paths_do_not_depend_on_where_the_tree_lives() {
        let files = [
            (
                "kernels/a.cu",
                "#include <af3/x.cuh>\n#include <cute/t.hpp>\n",
            ),
            ("include/af3/x.cuh", "#include \"../af3/y.cuh\"\n"),
            ("include/af3/y.cuh", "int y;\n"),
        ];
        let scan_copy = || {
            let dir = tree(&files);
            let vendor = tree(&[("cute/t.hpp", "int t;\n")]);
            let roots = ScanRoots {
                root: dir.path().to_owned(),
                include_dirs: vec![dir.path().join("include"), vendor.path().to_owned()],
                external_dirs: Vec::new(),
            };
            let graph = scan_includes(&[dir.path().join("kernels/a.cu")], &roots).unwrap();
            (dir, vendor, graph)
        };
        let (first_dir, _first_vendor, first) = scan_copy();
        let (second_dir, _second_vendor, second) = scan_copy();
        assert_ne!(first_dir.path(), second_dir.path());
        assert_eq!(first.files(), second.files());
        assert_eq!(first.render_tree(), second.render_tree());
        assert!(first.files().contains_key("[1]/cute/t.hpp"));
    }

    #[test]
    fn render_tree_snapshot() {
        let dir = tree(&[
            (
                "kernels/a.cu",
                "#include <af3/x.cuh>\n#include <cuda_fp16.h>\n#include \"af3/common.cuh\"\n",
            ),
            (
                "kernels/b.cu",
                "#include \"af3/common.cuh\"\n",
            ),
            (
                "include/af3/x.cuh",
                "#pragma once\n#include \"common.cuh\"\n#include \"common.cuh\"\n#include <cuda_fp16.h>\n",
            ),
            ("include/af3/common.cuh", "#pragma once\n#include <cstdint>\n"),
        ]);
        let graph = scan(
            dir.path(),
            &["include"],
            &["kernels/a.cu", "kernels/b.cu", "kernels/a.cu"],
        )
        .unwrap();
        assert_eq!(
            graph.render_tree(),
            "\
kernels/a.cu
├── include/af3/x.cuh
│   ├── include/af3/common.cuh
│   │   └── cstdint (external)
│   └── cuda_fp16.h (external)
├── cuda_fp16.h (external)
└── include/af3/common.cuh (already shown)
kernels/b.cu
└── include/af3/common.cuh (already shown)
"
        );
        assert_eq!(externals(&graph), ["cstdint", "cuda_fp16.h"]);
    }

    #[test]
    fn a_missing_source_is_a_read_error() {
        let dir = tree(&[]);
        let error = scan(dir.path(), &[], &["kernels/none.cu"]).unwrap_err();
        assert!(matches!(error, ScanError::Read { .. }), "{error}");
        assert!(error.to_string().contains("none.cu"), "{error}");
    }
}

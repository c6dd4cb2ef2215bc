//! Resolution of `#include` directives to files: relative to the includer, through the include
//! dirs (and `#include_next` past the dir the includer came from), to toolkit and system headers,
//! and the include chain that names where a missing header was wanted.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fs::{self, File};
use std::io::Read as _;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Component, Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;

use sha2::{Digest, Sha256};

use super::lex::{
    find_includes, scan_lenient, BadInclude, BadKind, Directives, HeaderMacro, Include,
    IncludeKind, MacroInclude,
};
use super::{Edge, GraphNode, IncludeGraph, ScanError, ScanRoots};

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

pub(super) struct Scanner<'r> {
    roots: &'r ScanRoots,
    /// The root, then each include dir.
    bases: Vec<NamingBase>,
    /// Candidate path → the file it leads to, if any.
    probes: HashMap<PathBuf, Option<Found>>,
    /// The external dirs, canonical: a file under one is the toolkit's or the system's.
    external_canonical: Vec<PathBuf>,
    pub(super) visited: HashMap<PathBuf, usize>,
    by_stable: HashMap<String, usize>,
    nodes: Vec<ScanNode>,
    queue: VecDeque<usize>,
    externals: BTreeSet<String>,
    /// Quoted includes under a conditional that resolved nowhere: (includer, header).
    absent: BTreeSet<(String, String)>,
    macros: HashMap<String, MacroDefinitions>,
    /// Each `#include MACRO` with its includer, resolved once every file is scanned.
    macro_includes: Vec<(usize, MacroInclude)>,
}

impl<'r> Scanner<'r> {
    pub(super) fn new(roots: &'r ScanRoots) -> Self {
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
            absent: BTreeSet::new(),
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
    pub(super) fn run(&mut self) -> Result<(), ScanError> {
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
        let skip_external = match (include.kind, self.nodes[includer].dir_index) {
            (IncludeKind::Next, Some(n)) if n >= after_include_dirs => n - after_include_dirs + 1,
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
            self.follow_external(found, Some(after_include_dirs + n), includer, include.line);
        }
        let is_external_includer = self.nodes[includer].external_via.is_some();
        if is_external_includer {
            return Ok(Edge::External(name.to_owned()));
        }
        if include.kind == IncludeKind::Quoted && !found_external && include.conditional {
            // The scanner evaluates no `#if`: a header missing under one is most likely one
            // this compile never reads (NVRTC's own `target` under `#ifdef __CUDACC_RTC__`).
            // Should it appear anywhere searched, it is found and hashed, changing the key.
            let includer_stable = self.nodes[includer].stable.clone();
            self.absent.insert((includer_stable, name.to_owned()));
            return Ok(Edge::Absent(name.to_owned()));
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
    fn follow_external(
        &mut self,
        found: Found,
        dir_index: Option<usize>,
        includer: usize,
        line: u32,
    ) {
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
            dir_index,
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
                || self.is_toolkit_copy(&found, dir_index).is_some()
            {
                let external_dir = dir_index.or(self.nodes[includer].dir_index);
                let name = found.path.display().to_string();
                self.follow_external(found, external_dir, includer, line);
                return Ok(Some(Edge::External(name)));
            }
            let node = self.add_node(found.canonical, found.path, dir_index, Some(via))?;
            return Ok(Some(Edge::File(node)));
        }
        if let Some(name) = self.is_toolkit_copy(&found, dir_index) {
            let external_dir = dir_index.or(self.nodes[includer].dir_index);
            self.follow_external(found, external_dir, includer, line);
            self.externals.insert(name.clone());
            return Ok(Some(Edge::External(name)));
        }
        let node = self.add_node(
            found.canonical,
            found.path,
            dir_index,
            Some((includer, line)),
        )?;
        Ok(Some(Edge::File(node)))
    }

    /// Whether `found`, a file under the root or an include dir, is a byte-for-byte copy of
    /// the toolkit's (or the host compiler's) file at the same relative path, as torch's
    /// `nvidia/cu13/include` is of the runtime headers: then it is the toolkit's header, which
    /// the compiler's identity already keys, and not a library file. Returns that relative
    /// path, by which the header is listed as external.
    fn is_toolkit_copy(&mut self, found: &Found, dir_index: Option<usize>) -> Option<String> {
        let stable = self.stable_name(&found.canonical, &found.path, dir_index)?;
        let relative = match stable.strip_prefix('[') {
            Some(rest) => rest
                .split_once("]/")
                .map_or(stable.as_str(), |(_, path)| path),
            None => stable.as_str(),
        }
        .to_owned();
        let mut bytes: Option<Vec<u8>> = None;
        for n in 0..self.roots.external_dirs.len() {
            let candidate = self.roots.external_dirs[n].join(&relative);
            let Some(theirs) = self.probe(candidate) else {
                continue;
            };
            if theirs.canonical == found.canonical {
                return Some(relative);
            }
            if bytes.is_none() {
                bytes = Some(fs::read(&found.path).ok()?);
            }
            if fs::read(&theirs.path).ok() == bytes {
                return Some(relative);
            }
        }
        None
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

    pub(super) fn add_node(
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

    pub(super) fn finish(self, sources: Vec<usize>) -> IncludeGraph {
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
            absent: self.absent,
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

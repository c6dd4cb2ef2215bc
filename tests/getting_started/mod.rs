//! docs/getting-started.md, executed: its shell blocks and files in order, as one bash script,
//! in a fresh home directory where `~/src/kwheel` is this clone. Only the caches `ci/setup` and
//! `ci/setup-tests` fill are shared with the real home (the CUDA toolchains, kwheel's wheel
//! build, torch), and pip is offline: kwheel reaches every environment through
//! `PIP_FIND_LINKS`, as the page says.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::support::*;

/// The page, relative to the workspace.
const PAGE: &str = "docs/getting-started.md";

/// How long the whole page may take: a cold build of kwheel's own wheel is most of it.
const TIME_LIMIT: Duration = Duration::from_secs(60 * 60);

/// A fenced block of the page that the script runs or writes.
#[derive(Debug, PartialEq)]
enum Step {
    /// A ```sh block: its lines run as they are.
    Shell(String),
    /// A block whose info string names `file=PATH`: PATH (relative to the shell's current
    /// directory then) gets the block's text.
    File { path: String, text: String },
}

/// Every ```sh block and every `file=` block of `markdown`, in order; other blocks (output,
/// examples) are not part of the walk-through.
fn steps(markdown: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in markdown.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_owned(), String::new())),
            (Some(_), Some(_)) => {
                let (info, text) = open.take().unwrap();
                let file = info
                    .split_whitespace()
                    .find_map(|word| word.strip_prefix("file="));
                if let Some(path) = file {
                    steps.push(Step::File {
                        path: path.to_owned(),
                        text,
                    });
                } else if info == "sh" {
                    steps.push(Step::Shell(text));
                }
            }
            (Some((_, text)), None) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{PAGE} has an unclosed code block");
    steps
}

/// The page as one bash script: files are written with a quoted here-document, so nothing in
/// them is expanded.
fn script(steps: &[Step]) -> String {
    let mut script = String::from("set -eo pipefail\nset -x\n");
    for step in steps {
        match step {
            Step::Shell(text) => script.push_str(text),
            Step::File { path, text } => {
                assert!(!text.contains("KWHEEL_PAGE_EOF"), "{path}");
                script.push_str(&format!(
                    "mkdir -p \"$(dirname '{path}')\"\ncat >'{path}' <<'KWHEEL_PAGE_EOF'\n{text}KWHEEL_PAGE_EOF\n"
                ));
            }
        }
    }
    script
}

/// The real home's directory for `variable`, else `default` under the real home.
fn real_dir(variable: &str, default: &str) -> PathBuf {
    std::env::var_os(variable)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(&std::env::var_os("HOME").unwrap()).join(default))
}

#[test]
fn the_page_has_files_and_commands_in_order() {
    let page = std::fs::read_to_string(workspace().join(PAGE)).unwrap();
    let steps = steps(&page);
    let files: Vec<&str> = steps
        .iter()
        .filter_map(|step| match step {
            Step::File { path, .. } => Some(path.as_str()),
            Step::Shell(_) => None,
        })
        .collect();
    assert_eq!(
        files,
        [
            "include/tinyops/common.cuh",
            "csrc/scale.cu",
            "csrc/relu.cu",
            "kernels.toml",
            "tinyops/__init__.py",
            "tinyops/ops.py",
            "pyproject.toml",
        ]
    );
    let shell: String = steps
        .iter()
        .filter_map(|step| match step {
            Step::Shell(text) => Some(text.as_str()),
            Step::File { .. } => None,
        })
        .collect();
    // The install without the registry, then the library's commands, in the page's order.
    let mut position = 0;
    for command in [
        "bash ci/setup",
        "cargo run --release -- release build-kwheel",
        "export PIP_FIND_LINKS=",
        "pip install kwheel",
        "kwheel dev bundle-kernels",
        "kwheel dev build-wheel",
        "kwheel dev build-sdist",
        "kwheel release check",
        "pip install ~/tinyops/target/kwheel/wheels/tinyops-0.1.0-",
        "pip install ~/tinyops\n",
        "pip install ~/tinyops/target/kwheel/sdist/tinyops-0.1.0.tar.gz",
    ] {
        let found = shell[position..]
            .find(command)
            .unwrap_or_else(|| panic!("`{command}` after byte {position} of:\n{shell}"));
        position += found + command.len();
    }
}

#[test]
fn a_library_goes_from_an_empty_folder_to_installed_wheels_as_the_page_says() {
    if !have_toolchains() {
        return;
    }
    let cache = real_dir("XDG_CACHE_HOME", ".cache");
    let torch = cache.join("kwheel/torch");
    if !torch.join("torch/__init__.py").is_file() {
        assert!(
            std::env::var("KWHEEL_REQUIRE_TOOLCHAINS").as_deref() != Ok("1"),
            "torch is required but missing at {} (`bash ci/setup-tests` installs it)",
            torch.display()
        );
        skipped("no torch (`bash ci/setup-tests` installs it)");
        return;
    }
    if release::runtime::find_cargo_zigbuild().is_none() || release::runtime::find_zig().is_none() {
        assert!(
            std::env::var("KWHEEL_REQUIRE_TOOLCHAINS").as_deref() != Ok("1"),
            "cargo-zigbuild and zig are required (`bash ci/setup-tests` installs them)"
        );
        skipped("no cargo-zigbuild or zig (`bash ci/setup-tests` installs them)");
        return;
    }
    let page = std::fs::read_to_string(workspace().join(PAGE)).unwrap();
    let script = script(&steps(&page));
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("src")).unwrap();
    std::os::unix::fs::symlink(workspace(), home.path().join("src/kwheel")).unwrap();

    let (status, out, text) = run_in_fresh_home(&script, home.path(), &cache, &torch);
    let status = status.unwrap_or_else(|| panic!("{PAGE} took over {TIME_LIMIT:?}:\n{text}"));
    assert!(status.success(), "{PAGE} failed ({status}):\n{text}");

    // The library's own bundle, built from ~/tinyops/kernels.toml: never the embedded one.
    let bundle = prebuilt::Bundle::open(home.path().join("tinyops/target/kwheel/_prebuilt"))
        .unwrap_or_else(|error| panic!("{error}\n{text}"));
    assert_eq!(bundle.index().package, "tinyops");
    let kernels: Vec<&String> = bundle.index().kernels.keys().collect();
    assert_eq!(kernels, ["relu", "scale_f32"], "{text}");
    // The users' wheel, and both builds from source, installed.
    let installs = out
        .lines()
        .filter(|line| {
            line.starts_with("Successfully installed ") && line.contains(" tinyops-0.1.0")
        })
        .count();
    assert_eq!(installs, 3, "{text}");
    assert!(out.contains("\ncu130/sm_90a\n"), "{text}");
    assert!(out.contains("tensor([2., 2., 2.])"), "{text}");
    // `import kwheel` exports its API and nothing of the standard library (no `os`, `sys`).
    let output = Command::new(home.path().join("venv/bin/python"))
        .args([
            "-c",
            "import json, kwheel; print(json.dumps([sorted(name for name in dir(kwheel) \
             if not name.startswith('_')), sorted(kwheel.__all__)]))",
        ])
        .current_dir(home.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", super::support::text(&output));
    let (public, all): (Vec<String>, Vec<String>) = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(public, all);
    assert!(all.contains(&"open".to_owned()), "{all:?}");
    // The sdist's wheel ships no cubin, and select() says the kernel compiles on first load.
    assert!(
        out.contains(release::library::RECIPES_ONLY_REASON),
        "{text}"
    );
}

/// Runs `script` with bash in `home` as `HOME`, sharing only the caches of the real home
/// (`cache`: what `ci/setup*` fill) and cargo's and rustup's, offline for pip, with `torch` on
/// `PYTHONPATH`. Returns the exit status (`None` past [`TIME_LIMIT`]), stdout, and both
/// streams as one text.
fn run_in_fresh_home(
    script: &str,
    home: &Path,
    cache: &Path,
    torch: &Path,
) -> (Option<std::process::ExitStatus>, String, String) {
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(home)
        .env("HOME", home)
        // The caches ci/setup fills, cargo and rustup of the real home; nothing else of it.
        .env("XDG_CACHE_HOME", cache)
        .env("CARGO_HOME", real_dir("CARGO_HOME", ".cargo"))
        .env("RUSTUP_HOME", real_dir("RUSTUP_HOME", ".rustup"))
        .env_remove("PIP_FIND_LINKS")
        .env_remove("VIRTUAL_ENV")
        .env_remove("KWHEEL_COMMAND")
        // Offline: nothing may come from a package index, kwheel least of all.
        .env("PIP_NO_INDEX", "1")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        // The users' torch, which the page assumes they have (`ci/setup-torch`'s, for this
        // Python): pip sees its metadata there and takes the library's torch pin as met.
        .env("PYTHONPATH", torch)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Both pipes drain on threads, so a chatty step never blocks on a full pipe.
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > TIME_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    let text = format!("{out}\n--- stderr ---\n{err}");
    (status, out, text)
}

/// The shell lines of the README's Install section (its first block).
fn readme_install_steps() -> String {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let section = readme
        .split("## Install")
        .nth(1)
        .expect("README has an Install section");
    let block = section
        .split("```")
        .nth(1)
        .expect("the Install section has a block");
    block
        .strip_prefix("text")
        .unwrap_or(block)
        .trim()
        .to_owned()
}

#[test]
fn the_readme_install_steps_work_from_an_empty_home() {
    if !have_toolchains() {
        return;
    }
    let cache = real_dir("XDG_CACHE_HOME", ".cache");
    if release::runtime::find_cargo_zigbuild().is_none() || release::runtime::find_zig().is_none() {
        assert!(
            std::env::var("KWHEEL_REQUIRE_TOOLCHAINS").as_deref() != Ok("1"),
            "cargo-zigbuild and zig are required (`bash ci/setup-wheel` installs them)"
        );
        skipped("no cargo-zigbuild or zig (`bash ci/setup-wheel` installs them)");
        return;
    }
    let steps = readme_install_steps();
    assert!(steps.contains("bash ci/setup-wheel"), "{steps}");
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("src")).unwrap();
    std::os::unix::fs::symlink(workspace(), home.path().join("src/kwheel")).unwrap();
    // As a user runs them: in the clone, with pip of an activated virtual environment.
    let script = format!(
        "set -eo pipefail\nset -x\ncd ~/src/kwheel\npython3 -m venv ~/venv && . ~/venv/bin/activate\n{steps}\nkwheel --version\n"
    );
    let (status, out, text) = run_in_fresh_home(&script, home.path(), &cache, Path::new(""));
    let status =
        status.unwrap_or_else(|| panic!("the Install steps took over {TIME_LIMIT:?}:\n{text}"));
    assert!(
        status.success(),
        "the README's Install steps failed ({status}):\n{text}"
    );
    assert!(out.lines().any(|line| line == "kwheel 0.1.0"), "{text}");
    assert!(home.path().join("venv/bin/kwheel").is_file(), "{text}");
}

#[test]
fn the_script_writes_files_verbatim_and_runs_commands_in_order() {
    let page = "intro\n```sh\necho one\n```\n```toml file=a/b.toml\nx = \"$HOME\"\n```\n\
                ```python\nnot run\n```\n```sh\necho two\n```\n";
    let steps = steps(page);
    assert_eq!(
        steps,
        [
            Step::Shell("echo one\n".into()),
            Step::File {
                path: "a/b.toml".into(),
                text: "x = \"$HOME\"\n".into()
            },
            Step::Shell("echo two\n".into()),
        ]
    );
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new("bash")
        .arg("-c")
        .arg(script(&steps))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(stdout(&output), "one\ntwo\n");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a/b.toml")).unwrap(),
        "x = \"$HOME\"\n"
    );
}

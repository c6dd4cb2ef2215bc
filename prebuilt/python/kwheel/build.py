"""kwheel's PEP 517 build backend for kernel libraries.

A kernel library's ``pyproject.toml`` names it, and ``pip install .``, ``pip install git+…``
and ``pip install <sdist>`` then build the library's wheel with the ``kwheel`` command that
the ``kwheel`` wheel installs::

    [build-system]
    requires = ["kwheel>=0.1.0,<0.2"]
    build-backend = "kwheel.build"

    [tool.kwheel]
    manifest = "kernels.toml"   # the kernel manifest, inside the project (default)
    prebuilt = false            # true: compile cubins at install time when toolchains are found
    torch = "2.11.*"            # optional: override the manifest's torch pin

The manifest must lie inside the project: a path relative to ``pyproject.toml``'s folder,
without ``..``, with no symbolic link on the way that leads out (both this module and
``kwheel pep517`` refuse anything else, naming ``[tool.kwheel] manifest``).

By default the wheel carries the kernel sources and an index of recipes but no cubin, so the
first ``load()`` of each kernel JIT-compiles it (and caches the cubin under the user's cache
directory); ``status()`` says so, and ``select()`` names the JIT path in its refusal. With
``prebuilt = true`` (or ``--config-settings prebuilt=true``, or ``KWHEEL_BUILD_PREBUILT=1``)
and the manifest's CUDA toolchains present (``kwheel toolchains``), the backend bundles real
cubins into the wheel instead; without the toolchains it says why on stderr and falls back to
the JIT path.

Each hook is one call of ``kwheel pep517 <verb>`` (maturin's pattern): this module reads
``pyproject.toml`` and the config settings, the command does the work (including the
toolchain check and the fallback to the JIT wheel) and prints one JSON object, which is all
the backend reads of its output, so rewording a message cannot break a build. The command is
``KWHEEL_COMMAND`` when set, else the one installed with this package (its
``.data/scripts``), else ``kwheel`` on ``PATH``.

``pyproject.toml`` is read with ``tomllib`` (Python 3.11+), else with ``tomli``, the same
parser as a package, which ``get_requires_for_build_*`` asks pip to install into the build
environment on Python 3.9 and 3.10 (the versions the ``cp39-abi3`` runtime also supports).

Until kwheel is published on the package registry, pip finds this backend among local wheels:
``PIP_FIND_LINKS=<folder of kwheel's wheel> pip install .`` (see docs/getting-started.md).
"""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys

__all__ = [
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_wheel",
]

PYPROJECT = "pyproject.toml"
DEFAULT_MANIFEST = "kernels.toml"
COMMAND_VARIABLE = "KWHEEL_COMMAND"
PREBUILT_VARIABLE = "KWHEEL_BUILD_PREBUILT"


class BuildError(RuntimeError):
    """The ``kwheel`` command failed or could not be found; the message says which and why."""


# Python 3.11 brought ``tomllib``; before it, the same parser is the ``tomli`` package.
TOMLI_REQUIREMENT = "tomli>=1.1"


def get_requires_for_build_wheel(config_settings=None):
    """Beyond ``kwheel`` itself, which ``build-system.requires`` names: ``tomli`` where the
    standard library has no ``tomllib`` (Python before 3.11)."""
    return [] if sys.version_info >= (3, 11) else [TOMLI_REQUIREMENT]


def get_requires_for_build_sdist(config_settings=None):
    """As for a wheel: ``tomli`` before Python 3.11, nothing else."""
    return get_requires_for_build_wheel(config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """Builds the library's wheel into ``wheel_directory`` and returns its file name."""
    config = _config(config_settings)
    command = _pep517("build-wheel", config)
    command += ["--wheel-directory", os.path.abspath(wheel_directory)]
    if config["prebuilt"]:
        command.append("--prebuilt")
    return _file_name(command, _run(command))


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    """Writes the wheel's ``.dist-info`` into ``metadata_directory`` and returns its name.

    Taken from the recipes-only wheel, which compiles nothing: its METADATA and WHEEL are
    those of the wheel ``build_wheel`` builds either way, so pip need not bundle twice.
    """
    config = _config(config_settings)
    command = _pep517("prepare-metadata", config)
    command += ["--metadata-directory", os.path.abspath(metadata_directory)]
    answer = _run(command)
    dist_info = answer.get("dist_info")
    if not isinstance(dist_info, str) or not dist_info.endswith(".dist-info"):
        raise BuildError(f"`{' '.join(command)}` named no .dist-info: {answer}")
    return dist_info


def build_sdist(sdist_directory, config_settings=None):
    """Writes the library's sdist into ``sdist_directory`` and returns its file name."""
    config = _config(config_settings)
    command = [_kwheel_command(), "pep517", "build-sdist", "--manifest", config["manifest"]]
    command += ["--sdist-directory", os.path.abspath(sdist_directory)]
    return _file_name(command, _run(command))


def _pep517(verb, config):
    """``kwheel pep517 <verb>`` for a wheel of this configuration."""
    command = [_kwheel_command(), "pep517", verb, "--manifest", config["manifest"]]
    if config.get("torch"):
        command += ["--torch", config["torch"]]
    return command


def _say(message):
    print(f"kwheel.build: {message}", file=sys.stderr, flush=True)


def _run(command):
    """Runs ``kwheel pep517 …``, passing its notes on to stderr; returns its JSON answer."""
    _say(" ".join(command))
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if result.stderr:
        sys.stderr.write(result.stderr)
    if result.returncode != 0:
        raise BuildError(
            f"`{' '.join(command)}` failed (exit {result.returncode}):\n{result.stderr.strip()}"
        )
    try:
        answer = json.loads(result.stdout)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise BuildError(f"`{' '.join(command)}` gave no JSON answer:\n{result.stdout}")
    return answer


def _file_name(command, answer):
    """The file name of the verified archive the answer names."""
    name = answer.get("file_name")
    if not isinstance(name, str) or not name or answer.get("verified") is not True:
        raise BuildError(f"`{' '.join(command)}` named no verified file: {answer}")
    return name


def _kwheel_command():
    """The ``kwheel`` executable: this package's own script, ``KWHEEL_COMMAND``, or PATH."""
    explicit = os.environ.get(COMMAND_VARIABLE)
    if explicit:
        return explicit
    try:
        distribution = importlib.metadata.distribution("kwheel")
        for file in distribution.files or []:
            if file.name in ("kwheel", "kwheel.exe") and file.parent.name in ("bin", "Scripts"):
                path = os.path.abspath(str(distribution.locate_file(file)))
                if os.access(path, os.X_OK):
                    return path
    except importlib.metadata.PackageNotFoundError:
        pass
    found = shutil.which("kwheel")
    if found:
        return found
    raise BuildError(
        "no `kwheel` command: install the kwheel wheel (it ships the command), set "
        f"{COMMAND_VARIABLE}, or put `kwheel` on PATH (`cargo install --path <kwheel clone>`)"
    )


def _config(config_settings):
    """``[tool.kwheel]`` of ``pyproject.toml``, overridden by config settings and the
    environment."""
    table = _tool_table()
    settings = dict(config_settings or {})
    manifest = settings.get("manifest") or table.get("manifest") or DEFAULT_MANIFEST
    _check_inside_project(manifest)
    if not os.path.isfile(manifest):
        raise BuildError(
            f"no kernel manifest `{manifest}` in {os.getcwd()} "
            f"(`[tool.kwheel] manifest` of {PYPROJECT})"
        )
    prebuilt = table.get("prebuilt", False)
    for override in (settings.get("prebuilt"), os.environ.get(PREBUILT_VARIABLE)):
        if override is not None and override != "":
            prebuilt = str(override).lower() in ("1", "true", "yes", "on")
    return {
        "manifest": manifest,
        "prebuilt": bool(prebuilt),
        "torch": settings.get("torch") or table.get("torch"),
    }


def _check_inside_project(manifest):
    """Refuses a manifest that does not lie inside the project (the current directory, where
    pip runs the backend): absolute, with a ``..`` component, or reached through a symbolic
    link that leads out. An sdist must not build a library from elsewhere on the machine;
    ``kwheel pep517`` checks the same again."""
    if not isinstance(manifest, str) or not manifest:
        raise BuildError(f"`[tool.kwheel] manifest` of {PYPROJECT} is not a path: {manifest!r}")
    project = os.path.realpath(os.getcwd())
    parts = manifest.replace(os.sep, "/").split("/")
    if os.path.isabs(manifest):
        reason = "is absolute"
    elif ".." in parts:
        reason = "has a `..` component"
    else:
        real = os.path.realpath(os.path.join(project, manifest))
        if os.path.commonpath([project, real]) == project:
            return
        reason = f"leads out of the project through a symbolic link, to `{real}`"
    raise BuildError(
        f"`[tool.kwheel] manifest` `{manifest}` {reason}: the kernel manifest must lie inside "
        f"the project (`{project}`), as a path relative to {PYPROJECT} without `..` and without "
        "a symbolic link that leads out"
    )


def _tool_table():
    """The ``[tool.kwheel]`` table of ``pyproject.toml`` (empty when there is none)."""
    try:
        with open(PYPROJECT, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return {}
    toml = _toml_module()
    try:
        document = toml.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise BuildError(f"{os.path.abspath(PYPROJECT)} is not valid TOML: {error}") from error
    table = document.get("tool", {}).get("kwheel", {})
    if not isinstance(table, dict):
        raise BuildError(f"`tool.kwheel` in {os.path.abspath(PYPROJECT)} is not a table")
    return table


def _toml_module():
    """``tomllib`` (Python 3.11+), else ``tomli``, which ``get_requires_for_build_*`` asks for."""
    try:
        import tomllib

        return tomllib
    except ImportError:
        pass
    try:
        import tomli

        return tomli
    except ImportError as error:
        raise BuildError(
            f"reading {PYPROJECT} on Python {sys.version_info[0]}.{sys.version_info[1]} needs "
            f"`{TOMLI_REQUIREMENT}` (pip installs it into the build environment; without build "
            "isolation, install it first)"
        ) from error

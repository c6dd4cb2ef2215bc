"""kwheel's PEP 517 build backend for kernel libraries.

A kernel library's ``pyproject.toml`` names it, and ``pip install .``, ``pip install git+…``
and ``pip install <sdist>`` then build the library's wheel with the ``kwheel`` command that
the ``kwheel`` wheel installs::

    [build-system]
    requires = ["kwheel>=0.1.0,<0.2"]
    build-backend = "kwheel.build"

    [tool.kwheel]
    manifest = "kernels.toml"   # the kernel manifest, relative to pyproject.toml (default)
    prebuilt = false            # true: compile cubins at install time when toolchains are found
    torch = "2.11.*"            # optional: override the manifest's torch pin

By default the wheel carries the kernel sources and an index of recipes but no cubin, so the
first ``load()`` of each kernel JIT-compiles it (and caches the cubin under the user's cache
directory); ``status()`` says so, and ``select()`` names the JIT path in its refusal. With
``prebuilt = true`` (or ``--config-settings prebuilt=true``, or ``KWHEEL_BUILD_PREBUILT=1``)
and the manifest's CUDA toolchains present (``kwheel toolchains``), the backend bundles real
cubins into the wheel instead; without the toolchains it says why on stderr and falls back to
the JIT path.

The ``kwheel`` command is the one installed with this package (its ``.data/scripts``), else
``KWHEEL_COMMAND``, else ``kwheel`` on ``PATH``.
"""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

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


def get_requires_for_build_wheel(config_settings=None):
    """Nothing beyond ``kwheel`` itself, which ``build-system.requires`` names."""
    return []


def get_requires_for_build_sdist(config_settings=None):
    """Nothing beyond ``kwheel`` itself."""
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """Builds the library's wheel into ``wheel_directory`` and returns its file name."""
    config = _config(config_settings)
    command = [_kwheel_command(), "dev", "build-wheel", "--manifest", config["manifest"]]
    command += ["--out", os.path.abspath(wheel_directory), "--quiet"]
    if config.get("torch"):
        command += ["--torch", config["torch"]]
    if config["prebuilt"]:
        missing = _missing_toolchains(config["manifest"])
        if missing is None:
            with tempfile.TemporaryDirectory(prefix="kwheel-bundle-") as scratch:
                command += ["--bundle", os.path.join(scratch, "_prebuilt")]
                return _run(command)
        _say(
            "prebuilt cubins were asked for, but the CUDA toolchains are missing "
            f"({missing}); building a wheel that JIT-compiles each kernel on first load"
        )
    return _run(command + ["--recipes-only"])


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    """Writes the wheel's ``.dist-info`` into ``metadata_directory`` and returns its name.

    Taken from the recipes-only wheel, which compiles nothing: its METADATA and WHEEL are
    those of the wheel ``build_wheel`` builds either way, so pip need not bundle twice.
    """
    config = _config(config_settings)
    with tempfile.TemporaryDirectory(prefix="kwheel-metadata-") as scratch:
        command = [_kwheel_command(), "dev", "build-wheel", "--manifest", config["manifest"]]
        command += ["--out", scratch, "--quiet", "--recipes-only"]
        if config.get("torch"):
            command += ["--torch", config["torch"]]
        wheel = os.path.join(scratch, _run(command))
        with zipfile.ZipFile(wheel) as archive:
            names = [name for name in archive.namelist() if ".dist-info/" in name]
            dist_info = names[0].split("/", 1)[0]
            for name in names:
                if not name.endswith("/RECORD"):
                    archive.extract(name, metadata_directory)
    return dist_info


def build_sdist(sdist_directory, config_settings=None):
    """Writes the library's sdist into ``sdist_directory`` and returns its file name."""
    config = _config(config_settings)
    command = [_kwheel_command(), "dev", "build-sdist", "--manifest", config["manifest"]]
    return _run(command + ["--out", os.path.abspath(sdist_directory)])


def _say(message):
    print(f"kwheel.build: {message}", file=sys.stderr, flush=True)


def _run(command):
    """Runs ``kwheel``; returns the file name of what it wrote (its last line's path)."""
    _say(" ".join(command))
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if result.stderr:
        sys.stderr.write(result.stderr)
    if result.returncode != 0:
        raise BuildError(
            f"`{' '.join(command)}` failed (exit {result.returncode}):\n{result.stderr.strip()}"
        )
    written = [line for line in result.stdout.splitlines() if line.endswith(", verified")]
    if not written:
        raise BuildError(f"`{' '.join(command)}` wrote nothing it named:\n{result.stdout}")
    path = written[-1].rsplit(" (", 1)[0]
    return os.path.basename(path)


def _missing_toolchains(manifest):
    """None when every CUDA build of the manifest has a toolchain, else what is missing."""
    result = subprocess.run(
        [_kwheel_command(), "toolchains", "--manifest", manifest],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if result.returncode == 0:
        return None
    missing = [line for line in result.stdout.splitlines() if "missing" in line]
    return "; ".join(missing) or result.stdout.strip()


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


def _tool_table():
    """The ``[tool.kwheel]`` table: through ``tomllib`` (Python 3.11+), else a reader for its
    flat ``key = "string"`` / ``key = true`` lines."""
    try:
        with open(PYPROJECT, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return {}
    try:
        import tomllib
    except ImportError:
        tomllib = None
    if tomllib is not None:
        return tomllib.loads(data.decode("utf-8")).get("tool", {}).get("kwheel", {})
    table, inside = {}, False
    for raw in data.decode("utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("["):
            inside = line == "[tool.kwheel]"
            continue
        match = re.fullmatch(r'([A-Za-z0-9_-]+)\s*=\s*("([^"]*)"|true|false)', line)
        if inside and match:
            key, value, text = match.groups()
            table[key] = text if text is not None else value == "true"
    return table

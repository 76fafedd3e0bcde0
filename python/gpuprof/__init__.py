"""gpuprof as `pip install gpuprof-memory` installs it: the `gpuprof` and `gpuprof-collector` commands,
the in-process shim `libgpuprof_shim.so` and a pytest plugin (`pytest --gpuprof`, docs/pytest.md).

The profiler itself is the Rust binaries; this package only finds the shim the wheel installed,
for the plugin and for anyone who preloads it by hand (`LD_PRELOAD=$(python -m gpuprof shim)`).
"""

import os
import shutil

SHIM_FILE = "libgpuprof_shim.so"
# Where the wheel puts the shim, relative to the scheme's data directory; the `gpuprof` binary
# finds it at `<its directory>/../lib/gpuprof/`, since scripts go to `<data>/bin`.
SHIM_DATA_PATH = ("lib", "gpuprof", SHIM_FILE)

# The distribution on PyPI (`gpuprof` there is another project's): scripts/build-wheel.py.
DISTRIBUTION = "gpuprof-memory"


def shim_path():
    """The shim library to preload: $GPUPROF_SHIM (as `gpuprof run --via shim` takes it), else the
    file this distribution installed, else next to a `gpuprof` on PATH (a cargo build's
    target/release). Raises FileNotFoundError saying where it looked."""
    looked = []
    given = os.environ.get("GPUPROF_SHIM")
    if given:
        if os.path.isfile(given):
            return os.path.abspath(given)
        raise FileNotFoundError(f"GPUPROF_SHIM={given} does not exist: point it at libgpuprof_shim.so, or unset it")
    installed = _installed_shim()
    if installed:
        return installed
    looked.append(f"the files of the installed {DISTRIBUTION} distribution")
    binary = shutil.which("gpuprof")
    if binary:
        directory = os.path.dirname(os.path.realpath(binary))
        for candidate in (os.path.join(directory, SHIM_FILE), os.path.join(directory, "..", *SHIM_DATA_PATH)):
            if os.path.isfile(candidate):
                return os.path.realpath(candidate)
            looked.append(candidate)
    else:
        looked.append("next to a gpuprof on PATH (none)")
    raise FileNotFoundError(
        f"{SHIM_FILE} not found (looked in {', '.join(looked)}): `pip install gpuprof-memory`, or set GPUPROF_SHIM to the library"
    )


def _installed_shim():
    # The distribution's RECORD names the file wherever the install scheme put it (a virtual
    # environment, --user, /usr/local), so no scheme is guessed here.
    try:
        from importlib import metadata

        files = metadata.files(DISTRIBUTION) or []
    except Exception:  # not installed as a distribution (run from a source tree)
        return None
    for file in files:
        if file.name == SHIM_FILE:
            path = str(file.locate())
            if os.path.isfile(path):
                return os.path.realpath(path)
    return None

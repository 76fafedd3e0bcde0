#!/usr/bin/env python3
"""Packs already-built gpuprof binaries into the wheel `pip install gpuprof-memory` installs:

    gpuprof_memory-<version>-py3-none-manylinux_<x>_<y>_<arch>.whl
      gpuprof/                                  the Python package (python/gpuprof: the pytest plugin)
      gpuprof_memory-<v>.data/scripts/gpuprof   -> <prefix>/bin/gpuprof
      gpuprof_memory-<v>.data/scripts/gpuprof-collector
      gpuprof_memory-<v>.data/data/lib/gpuprof/libgpuprof_shim.so   -> <prefix>/lib/gpuprof/
      gpuprof_memory-<v>.data/data/share/man/man1/gpuprof*.1        -> <prefix>/share/man/man1/ (man finds them beside bin/)
      gpuprof_memory-<v>.data/data/share/bash-completion/completions/gpuprof, share/zsh/site-functions/_gpuprof,
        share/fish/vendor_completions.d/gpuprof.fish                -> where each shell looks under <prefix>
      gpuprof_memory-<v>.dist-info/             METADATA, WHEEL, entry_points.txt (pytest11), RECORD

    cargo build --release -p gpuprof -p gpuprof-collector -p gpuprof-shim
    python3 scripts/build-wheel.py            # from target/release into dist/; prints the wheel's path

Why not maturin: its `bin` bindings pack the binaries of one cargo package per wheel, and ours are
two binaries of two packages plus a cdylib of a third that is not a Python extension; it would
also compile the workspace again in its own profile. The wheel format is a zip with three small
text files (PEP 427), so this script, standard library only, packs what cargo built, and the
tests pack the test build's own binaries with it (agent/tests/wheel.rs) instead of compiling twice.

The platform tag is read off the binaries, not asserted: every library they need must be one the
manylinux policy (PEP 600, auditwheel's policy list) lets a wheel take from the system, and the
newest GLIBC symbol version they need gives manylinux_<x>_<y>. The symbol versions checked are
glibc's and libgcc_s's (what Rust binaries need); a binary that needs versions of another
library (libstdc++, libz) is refused, since its limits per glibc level are not checked here:
use auditwheel for such a build. Needs binutils' readelf and strip.
"""

import argparse
import base64
import hashlib
import io
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The distribution's name on PyPI: `gpuprof` there is another project's profiler (0.7.1, with a
# `gpuprof` command of its own), so this one is `gpuprof-memory` (free when checked, 2026-11-29);
# the package it installs and its commands keep the name people know.
DISTRIBUTION = "gpuprof-memory"
# The distribution's name in file names (PEP 427: runs of -_. as one underscore).
FILE_NAME = re.sub(r"[-_.]+", "_", DISTRIBUTION)
NAME = "gpuprof"
SHIM = "libgpuprof_shim.so"
# Libraries a manylinux wheel may take from the system (auditwheel's lib_whitelist, the same in
# every manylinux policy), and the dynamic loader itself.
SYSTEM_LIBRARIES = {
    "libatomic.so.1",
    "libgcc_s.so.1",
    "libstdc++.so.6",
    "libm.so.6",
    "libanl.so.1",
    "libdl.so.2",
    "librt.so.1",
    "libc.so.6",
    "libnsl.so.1",
    "libutil.so.1",
    "libpthread.so.0",
    "libX11.so.6",
    "libXext.so.6",
    "libXrender.so.1",
    "libICE.so.6",
    "libSM.so.6",
    "libGL.so.1",
    "libgobject-2.0.so.0",
    "libgthread-2.0.so.0",
    "libglib-2.0.so.0",
    "libresolv.so.2",
    "libexpat.so.1",
    "libz.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
}
# glibc symbols the policy forbids whatever the version (auditwheel's blacklist): a strong
# reference is refused; a weak one (Rust's std looks __cxa_thread_atexit_impl up that way) is not.
FORBIDDEN_SYMBOLS = {
    "__cxa_thread_atexit_impl",
    "__issignaling",
    "__issignalingf",
    "__issignalingl",
    "pthread_getattr_default_np",
    "pthread_setattr_default_np",
}
# libgcc_s versions every manylinux policy allows, on x86_64 and aarch64 alike.
GCC_NEWEST = (4, 2, 0)
# Where each shell's completion script goes under the install prefix: bash-completion looks in
# share/bash-completion/completions beside the command's bin/, zsh and fish in these folders
# under /usr/local and /usr (a virtual environment's are not on their paths: docs/install.md).
COMPLETIONS = {
    "bash": "share/bash-completion/completions/gpuprof",
    "zsh": "share/zsh/site-functions/_gpuprof",
    "fish": "share/fish/vendor_completions.d/gpuprof.fish",
}
MACHINES = {"Advanced Micro Devices X86-64": "x86_64", "AArch64": "aarch64"}
SUMMARY = "GPU memory profiler: every CUDA allocation of a process tree, the tensor that made it, and leaks; with a pytest plugin"


class Refused(Exception):
    """The binaries cannot go into a manylinux wheel, or cannot be packed: the message says why."""


def readelf(args, path):
    try:
        return subprocess.run(["readelf", "-W", *args, str(path)], check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        raise Refused("readelf (binutils) is needed to check the binaries: apt-get install binutils") from None
    except subprocess.CalledProcessError as error:
        raise Refused(f"{path} is not an ELF file readelf can read: {error.stderr.strip()}") from None


def version_tuple(text):
    return tuple(int(part) for part in text.split("."))


def audit(path):
    """(machine, newest glibc version) of one binary; Refused when it is outside the policy."""
    header = readelf(["-h"], path)
    machine = re.search(r"Machine:\s+(.+)", header)
    arch = MACHINES.get(machine.group(1).strip()) if machine else None
    if arch is None:
        raise Refused(
            f"{path}: machine {machine.group(1).strip() if machine else '?'} is not one gpuprof builds wheels for (x86_64, aarch64)"
        )
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf(["-d"], path))
    outside = sorted(set(needed) - SYSTEM_LIBRARIES)
    if outside:
        raise Refused(
            f"{path.name} links {', '.join(outside)}, outside the manylinux policy: link it statically "
            "(the workspace vendors libbpf, libelf and zlib) or leave it out of the wheel"
        )
    glibc = []
    library = None
    needs = False
    for line in readelf(["-V"], path).splitlines():
        # Only the version needs (.gnu.version_r: each library, then the versions needed of it).
        if line.startswith("Version "):
            needs, library = line.startswith("Version needs section"), None
            continue
        file = re.search(r"File: (\S+)", line)
        if file:
            library = file.group(1)
            continue
        name = re.search(r"Name: (\S+)", line)
        if not needs or not name or library is None:
            continue
        version = name.group(1)
        if version.startswith("GLIBC_") and re.fullmatch(r"GLIBC_\d+(\.\d+)+", version):
            glibc.append(version_tuple(version[len("GLIBC_") :]))
        elif re.fullmatch(r"GCC_\d+(\.\d+)+", version) and library == "libgcc_s.so.1":
            if version_tuple(version[len("GCC_") :]) > GCC_NEWEST:
                raise Refused(f"{path.name} needs {version} of libgcc_s.so.1, newer than every manylinux policy allows")
        else:
            raise Refused(
                f"{path.name} needs {version} of {library}, which this builder does not check: audit the wheel with auditwheel"
            )
    for line in readelf(["--dyn-syms"], path).splitlines():
        fields = line.split()
        if len(fields) >= 8 and fields[6] == "UND" and fields[4] == "GLOBAL":
            symbol = fields[7].split("@")[0]
            if symbol in FORBIDDEN_SYMBOLS:
                raise Refused(f"{path.name} references {symbol}, which the manylinux policy forbids")
    if not glibc:
        raise Refused(
            f"{path.name} needs no glibc symbol version: a static (musl) build is not what this builder packs"
        )
    return arch, max(glibc)


def exports(path, symbol):
    """Whether the library defines `symbol` in its dynamic symbol table."""
    for line in readelf(["--dyn-syms"], path).splitlines():
        fields = line.split()
        if len(fields) >= 8 and fields[6] != "UND" and fields[7].split("@")[0] == symbol:
            return True
    return False


def binary_version(path, name):
    try:
        out = subprocess.run([str(path), "--version"], check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as error:
        raise Refused(f"cannot run `{path} --version`: {error}") from None
    match = re.fullmatch(re.escape(name) + r" (\S+)", out)
    if not match:
        raise Refused(f"`{path} --version` printed {out!r}, not `{name} VERSION`")
    return match.group(1)


def made_by(gpuprof, scratch):
    """The man pages and completion scripts, as the binary makes them from its own command line:
    (path under the install prefix, content) pairs."""

    def run(*args):
        try:
            return subprocess.run([str(gpuprof), *args], check=True, capture_output=True).stdout
        except (OSError, subprocess.CalledProcessError) as error:
            raise Refused(f"cannot run `{gpuprof} {' '.join(args)}`: {error}") from None

    pages = Path(scratch) / "man1"
    run("man", "--dir", str(pages))
    made = [(f"share/man/man1/{page.name}", page.read_bytes()) for page in sorted(pages.glob("*.1"))]
    if not made:
        raise Refused(f"`{gpuprof} man --dir` wrote no page")
    made += [(place, run("completions", shell)) for shell, place in COMPLETIONS.items()]
    return made


def record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def strip_debug(path, into):
    """A copy of the binary without debug sections (the symbol table stays, for backtraces)."""
    copy = Path(into) / path.name
    try:
        subprocess.run(
            ["strip", "--strip-debug", "-o", str(copy), str(path)], check=True, capture_output=True, text=True
        )
    except FileNotFoundError:
        raise Refused("strip (binutils) is needed to strip debug info (or pass --keep-debug)") from None
    except subprocess.CalledProcessError as error:
        raise Refused(f"strip {path}: {error.stderr.strip()}") from None
    return copy


def build(gpuprof, collector, shim, out_dir, keep_debug, python_dir):
    for path in (gpuprof, collector, shim):
        if not path.is_file():
            raise Refused(
                f"{path} does not exist: cargo build --release -p gpuprof -p gpuprof-collector -p gpuprof-shim"
            )
    version = binary_version(gpuprof, "gpuprof")
    collector_version = binary_version(collector, "gpuprof-collector")
    if collector_version != version:
        raise Refused(f"gpuprof is {version} but gpuprof-collector is {collector_version}: build both from one tree")
    if not re.fullmatch(r"\d+(\.\d+)*", version):
        raise Refused(f"version {version} is not a plain release number PEP 440 and Cargo spell alike")
    audits = [audit(path) for path in (gpuprof, collector, shim)]
    if not exports(shim, "gpuprof_shim_flush"):
        raise Refused(f"{shim} does not export gpuprof_shim_flush, which the pytest plugin calls: rebuild gpuprof-shim")
    arches = {arch for arch, _ in audits}
    if len(arches) != 1:
        raise Refused(f"the binaries are for different machines ({', '.join(sorted(arches))})")
    newest = max(glibc for _, glibc in audits)
    tag = f"py3-none-manylinux_{newest[0]}_{newest[1]}_{arches.pop()}"
    package = python_dir / NAME
    sources = sorted(p for p in package.glob("*.py"))
    if not sources:
        raise Refused(f"no Python package at {package}")

    data = f"{FILE_NAME}-{version}.data"
    info = f"{FILE_NAME}-{version}.dist-info"
    with tempfile.TemporaryDirectory() as scratch:
        if not keep_debug:
            gpuprof, collector, shim = (strip_debug(p, scratch) for p in (gpuprof, collector, shim))
        entries = [(f"{NAME}/{p.name}", p.read_bytes(), 0o644) for p in sources]
        entries += [
            (f"{data}/scripts/gpuprof", gpuprof.read_bytes(), 0o755),
            (f"{data}/scripts/gpuprof-collector", collector.read_bytes(), 0o755),
            (f"{data}/data/lib/gpuprof/{SHIM}", shim.read_bytes(), 0o755),
        ]
        entries += [(f"{data}/data/{place}", content, 0o644) for place, content in made_by(gpuprof, scratch)]
    metadata = "\n".join(
        [
            "Metadata-Version: 2.1",
            f"Name: {DISTRIBUTION}",
            f"Version: {version}",
            f"Summary: {SUMMARY}",
            "License: Apache-2.0",
            "Requires-Python: >=3.8",
            "Classifier: Framework :: Pytest",
            "Classifier: Operating System :: POSIX :: Linux",
            "Classifier: Programming Language :: Rust",
            "Description-Content-Type: text/markdown",
            "",
            "`gpuprof` and `gpuprof-collector` on PATH, gpuprof's in-process shim, and a pytest plugin "
            "(`pytest --gpuprof`, markers `limit_gpu_memory` and `gpu_leak_free`). See docs/install.md and docs/pytest.md.",
            "",
        ]
    )
    wheel = f"Wheel-Version: 1.0\nGenerator: gpuprof scripts/build-wheel.py\nRoot-Is-Purelib: false\nTag: {tag}\n"
    entry_points = "[pytest11]\ngpuprof = gpuprof.pytest_plugin\n"
    entries += [
        (f"{info}/METADATA", metadata.encode(), 0o644),
        (f"{info}/WHEEL", wheel.encode(), 0o644),
        (f"{info}/entry_points.txt", entry_points.encode(), 0o644),
    ]
    record = io.StringIO()
    for name, content, _ in entries:
        record.write(f"{name},{record_hash(content)},{len(content)}\n")
    record.write(f"{info}/RECORD,,\n")
    entries.append((f"{info}/RECORD", record.getvalue().encode(), 0o644))

    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{FILE_NAME}-{version}-{tag}.whl"
    # The same inputs give the same bytes: fixed timestamps (SOURCE_DATE_EPOCH when set).
    stamp = time.gmtime(max(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")), 315532800))[:6]
    staging = target.with_suffix(f".tmp{os.getpid()}")
    with zipfile.ZipFile(staging, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content, mode in entries:
            entry = zipfile.ZipInfo(name, date_time=stamp)
            entry.external_attr = (0o100000 | mode) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, content)
    os.replace(staging, target)
    return target


def main():
    parser = argparse.ArgumentParser(description="Packs built gpuprof binaries into a manylinux wheel.")
    release = ROOT / "target" / "release"
    parser.add_argument(
        "--gpuprof", type=Path, default=release / "gpuprof", help="the gpuprof binary [target/release/gpuprof]"
    )
    parser.add_argument(
        "--collector", type=Path, default=release / "gpuprof-collector", help="the gpuprof-collector binary"
    )
    parser.add_argument("--shim", type=Path, default=release / SHIM, help=f"the shim library [target/release/{SHIM}]")
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the wheel goes [dist/]")
    parser.add_argument(
        "--python", type=Path, default=ROOT / "python", help="the folder holding the gpuprof Python package"
    )
    parser.add_argument(
        "--keep-debug", action="store_true", help="pack the binaries as built (by default debug info is stripped)"
    )
    args = parser.parse_args()
    try:
        print(build(args.gpuprof, args.collector, args.shim, args.out, args.keep_debug, args.python))
    except Refused as error:
        print(f"build-wheel: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The stand-in libraries and fixture programs the benchmarks run against, compiled as the test
suite compiles them (testkit/src/lib.rs): shared objects with hidden symbols but the real
libraries' exported names, and the small C workloads."""

import subprocess
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "testkit" / "fixtures"


def shared(source, output, *extra):
    """Compiles testkit/fixtures/SOURCE into the shared object OUTPUT; returns OUTPUT."""
    output = Path(output)
    command = ["cc", "-shared", "-fPIC", "-O1", "-fno-ipa-icf", "-fvisibility=hidden", "-o", output]
    subprocess.run([*command, FIXTURES / source, *extra], check=True)
    return output


def program(source, output, *extra):
    """Compiles testkit/fixtures/SOURCE into the program OUTPUT; returns OUTPUT."""
    output = Path(output)
    subprocess.run(["cc", "-O1", "-o", output, FIXTURES / source, *extra], check=True)
    return output


def libcuda(directory):
    """The libcuda stand-in as DIRECTORY/libcuda.so.1 (for LD_LIBRARY_PATH)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    return shared("libcuda_standin.c", Path(directory) / "libcuda.so.1", "-lpthread", "-ldl")

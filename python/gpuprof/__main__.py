"""`python -m gpuprof shim`: prints the path of the installed shim (for LD_PRELOAD by hand)."""

import sys

from . import shim_path


def main(argv):
    if argv != ["shim"]:
        print("usage: python -m gpuprof shim   (prints the path of libgpuprof_shim.so)", file=sys.stderr)
        return 2
    try:
        print(shim_path())
    except FileNotFoundError as error:
        print(f"gpuprof: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

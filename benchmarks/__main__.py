"""``python -m benchmarks NAME [args]``: see :mod:`benchmarks.cli`."""

import sys

from benchmarks.cli import main

if __name__ == "__main__":  # not when a spawned worker (multi_gpu) imports it again
    sys.exit(main())

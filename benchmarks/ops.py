"""The op benchmark, `python -m pallas_kernels.bench`, run as a script from a checkout (the form the
commands in benchmarks/RESULTS.md take): the same flags, e.g.

    python3 benchmarks/ops.py --backends gpu --shapes 4x4096 --fla DIR --out DIR
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pallas_kernels.bench import main  # noqa: E402

if __name__ == "__main__":
  main()

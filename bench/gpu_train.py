"""GPU training benchmark (same as `tunesmith bench`). Usage:

    python bench/gpu_train.py [--groups main,full,liger] [--out docs/benchmarks] [--tiny]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tunesmith.benchmarks.report import run_all  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(run_all(sys.argv[1:]))

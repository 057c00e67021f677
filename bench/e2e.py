"""End-to-end benchmark: `tunesmith train` vs `llamafactory-cli train` (and Unsloth on the
dense cases) on one GPU (same as `tunesmith bench --e2e`). On the H200, from the repository
root, with LLaMA-Factory 0.9.5's wheels in .carry/whl:

    python bench/e2e.py --out $OUT            (about 8.5 minutes; --help for the knobs)
    python bench/e2e.py --tiny --out /tmp/e2e (CPU check of the tunesmith side)
    python bench/e2e.py --systems tunesmith,unsloth --cases dense,dense_recompute --out $OUT
        (Unsloth's wheels in .carry/uns; docs/benchmarks/README.md says which, and how
        bitsandbytes and torchao get into /tmp/site_uns first)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tunesmith.benchmarks.e2e import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())

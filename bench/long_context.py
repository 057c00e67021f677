"""Long-context benchmark: LoRA on single rows of 32k / 64k / 128k tokens through
`tunesmith train` on one GPU (offloaded checkpointing, chunked loss). On the H200, from the
repository root:

    python bench/long_context.py --out $OUT            (about 7 minutes; --help for knobs)
    python bench/long_context.py --tiny --out /tmp/lc  (CPU check: tiny model, 512/1024)
    python bench/long_context.py --estimate-only --out /tmp/lc   (the paper estimate only)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tunesmith.benchmarks.long_context import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())

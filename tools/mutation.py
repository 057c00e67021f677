"""Mutation testing of train/, data/ and kernels/ with mutmut, bounded for a small machine.

    python tools/mutation.py [--sample 120] [--seed 0] [--max-children 2]

mutmut (config: [tool.mutmut] in pyproject.toml) copies src/ to mutants/, builds every
mutant of the three packages, and runs, for each mutant, the fast tests that reach the
mutated function. The full set takes hours on 2 cores, so this script runs a seeded random
sample of the mutants (--sample 0: all of them) and prints the killed share of the sample.
PYTHONPATH is cleared so the tests import the mutated copy, never src/.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTMUT = [sys.executable, "-m", "mutmut"]
KILLED = {"killed", "timeout", "caught by type check"}  # a mutant the suite detected
NOT_RUN = {"not checked", "skipped"}
# mutmut files exit -9 (SIGKILL: its wall-clock limit, or memory) under "segfault"; on a
# shared machine that is mostly a slow run, so it is reported apart, never as killed
SIGKILLED = "segfault"


def _mutmut(*args: str) -> str:
    """Run mutmut; its output goes through a file, not a pipe: orphaned fork-server
    children may hold a pipe open long after mutmut exited."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    log = ROOT / "mutants" / f"mutmut-{args[0]}.log"
    log.parent.mkdir(exist_ok=True)
    with open(log, "w", encoding="utf-8") as fh:
        code = subprocess.run(MUTMUT + list(args), cwd=ROOT, env=env, text=True, stdout=fh,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    text = log.read_text(encoding="utf-8", errors="replace")
    if code not in (0, 1) and args[0] == "run":
        sys.exit(f"mutmut {' '.join(args[:2])} failed (exit {code}); see {log}:\n{text[-3000:]}")
    return text


def statuses() -> dict[str, str]:
    """Every generated mutant -> its status ('not checked' until run)."""
    out = _mutmut("results", "--all", "true")
    found = re.findall(r"^\s*(\S+__mutmut_\d+): (.+?)\s*$", out, flags=re.M)
    return dict(found)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sample", type=int, default=120, help="mutants to run (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-children", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "mutants" / "score.json")
    ns = p.parse_args()
    # a first, tiny run generates every mutant and maps tests to functions
    _mutmut("run", "--max-children", str(ns.max_children), "tunesmith.data.packing.*__mutmut_1")
    every = sorted(statuses())
    if not every:
        sys.exit("mutmut generated no mutants; see mutants/mutmut-debug.log")
    chosen = every if ns.sample <= 0 else sorted(
        random.Random(ns.seed).sample(every, min(ns.sample, len(every))))
    _mutmut("run", "--max-children", str(ns.max_children), *chosen)
    got = statuses()
    counts = Counter(got.get(name, "missing") for name in chosen)
    ran = sum(n for s, n in counts.items() if s not in NOT_RUN)
    killed = sum(n for s, n in counts.items() if s in KILLED)
    by_package = Counter(name.split(".")[1] for name in chosen
                         if got.get(name) in KILLED)
    sigkilled = counts.get(SIGKILLED, 0)
    report = {"generated": len(every), "sampled": len(chosen), "seed": ns.seed, "ran": ran,
              "killed": killed, "score": round(100 * killed / max(ran, 1), 1),
              "sigkilled": sigkilled,
              "score_without_sigkilled": round(100 * killed / max(ran - sigkilled, 1), 1),
              "statuses": dict(counts), "killed_by_package": dict(by_package),
              "survivors": sorted(n for n in chosen if got.get(n) == "survived")}
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "survivors"}, indent=2))
    print(f"{killed}/{ran} sampled mutants killed ({report['score']}%); survivors in {ns.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The fault campaign: `python tools/faults.py --out DIR` runs every fault, writes
faults.json and faults.md (one row per fault) into DIR.

    python tools/faults.py --out docs/faults            # the full campaign (CPU only)
    python tools/faults.py --quick --out /tmp/f         # a few of each (~2 min)
    python tools/faults.py child PHASE K train x.yaml   # (internal) a run armed to die
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path[:0] = [str(HERE), str(HERE.parent / "src"), str(HERE.parent / "tests")]


def campaign(work: Path, quick: bool, only: set[str] | None = None) -> list[dict]:
    from faultlib import apifuzz, checkpoints, datafuzz, diskfull, kills, locking, uploads

    from tiny import build_tokenizer, save_tiny_model, write_alpaca

    n = (lambda full, small: small if quick else full)  # noqa: E731
    os.environ.setdefault("TUNESMITH_CACHE", str(work / "cache"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok = build_tokenizer()
    model = save_tiny_model(work / "tiny-llama")
    data = write_alpaca(work / "train.json", 48)
    parts = [
        lambda: kills.kill_campaign(work / "kills", model, data, n(20, 6)),
        lambda: checkpoints.crash_in_checkpoint_writes(work, n(50, 23)),
        lambda: checkpoints.corrupt_checkpoints(work, n(20, 6)),
        lambda: checkpoints.disk_full_checkpoint(work, n(14, 7)),
        lambda: diskfull.disk_full_cache(work, tok, n(8, 4)),
        lambda: diskfull.disk_full_export(work, n(6, 3)),
        lambda: diskfull.disk_full_metrics(work, n(6, 3)),
        lambda: locking.lock_campaign(work / "locks", model, data, n(10, 4)),
        lambda: datafuzz.data_fuzz(work / "fuzz", tok, 1000, 2000),
        lambda: datafuzz.property_readers(n(300, 50)),
        lambda: apifuzz.api_fuzz(n(400, 60)),
        lambda: uploads.upload_campaign(work / "uploads"),
    ]
    names = ["kills", "crashes", "corrupt", "enospc-checkpoint", "enospc-cache",
             "enospc-export", "enospc-metrics", "lock", "data-fuzz", "reader-property",
             "api-fuzz", "uploads"]
    figures = []
    for name, part in zip(names, parts, strict=True):
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        fig = part()
        fig["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"{fig['fault']}: {fig['ok']}/{fig['count']} ({fig['seconds']} s)", flush=True)
        figures.append(fig)
    return figures


# What a fault that "ended as it should" did, per part (the figure counts these).
HAPPENED = {
    "kill -9 at random points of a run": "the killed run left no half state that was used; "
    "the re-run finished and its adapter (or export) is bitwise equal to the uninterrupted one",
    "crash inside checkpoint writing": "auto picked the newest complete checkpoint and read "
    "back exactly the weights it holds",
    "checkpoint file truncated or bit-flipped": "auto passed over the damaged checkpoint, "
    "printed which file and why, and resumed from the previous one; naming it is an error",
    "disk full while writing a checkpoint": "StorageError naming checkpoint-N, the path and "
    "the free MiB; the partial folder removed; the previous checkpoint picked",
    "disk full while writing the tokenised cache": "StorageError naming the cache path and "
    "free space; the next run rebuilt the entry with every sample",
    "disk full while exporting": "StorageError naming export_dir and free space; export_dir "
    "as it was (absent or the previous export); no partial folder left",
    "disk full while writing metrics": "StorageError naming metrics.jsonl and free space; the "
    "half record cut off, so a resumed run appends whole lines",
    "two runs into one output_dir": "the second run refused ('in use by another run', pid), "
    "the first's files byte-identical; after SIGKILL of the holder the stale lock was "
    "recovered and the run finished",
    "data fuzz (bad rows)": "every bad row reported with file:line (or file[row i]) and a "
    "reason, no good row lost, 0 crashes",
    "reader property test (hypothesis)": "rows or located bad rows (or one file-level "
    "DataError naming the file), never an exception",
    "API fuzz (OpenAPI schema)": "no response >= 500, the server answered afterwards, and a "
    "body over the limit got 413 with the tokenizer never called",
    "web UI uploads": "every hostile upload refused with a message, the good one stored, "
    "nothing written outside the working folder",
}


def markdown(figures: list[dict], command: str) -> str:
    lines = [f"Command: `{command}` on {platform.node()} ({os.cpu_count()} CPUs, "
             f"{platform.platform()}), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
             "| fault | what was done | how often | what happened | figure | seconds |",
             "|---|---|---|---|---|---|"]
    for f in figures:
        happened = HAPPENED.get(f["fault"], "")
        if f["ok"] != f["count"]:
            happened += " — failures: " + "; ".join(str(n) for n in f["notes"])[:300]
        lines.append(f"| {f['fault']} | {f['how']} | {f['count']} | {happened} | "
                     f"{f['ok']}/{f['count']} | {f['seconds']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["child"]:
        from faultlib.shim import child_main

        return child_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "faults-out"))
    parser.add_argument("--quick", action="store_true", help="a few of each fault")
    parser.add_argument("--only", default="", help="comma-separated parts, e.g. kills,lock")
    parser.add_argument("--render", metavar="FAULTS_JSON",
                        help="only rewrite faults.md from an earlier faults.json")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.render:
        figures = json.loads(Path(args.render).read_text())
        (out / "faults.md").write_text(markdown(figures, "python tools/faults.py " + " ".join(
            a for a in argv if a != args.render and a != "--render")))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tunesmith-faults-") as work:
        figures = campaign(Path(work), args.quick, set(filter(None, args.only.split(","))))
    command = "python tools/faults.py " + " ".join(argv)
    (out / "faults.json").write_text(json.dumps(figures, indent=1, default=str))
    (out / "faults.md").write_text(markdown(figures, command))
    bad = [f["fault"] for f in figures if f["ok"] != f["count"]]
    print(markdown(figures, command))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""Run all 52 LLaMA-Factory example YAMLs (tests/fixtures/llamafactory_examples) on
SmolLM2-135M-Instruct with LLaMA-Factory's own demo data, and write the outcome table.

    python tools/lf_examples_smollm2.py [--steps 1] [--cutoff_len 128] [--only NAME,...]
                                        [--work DIR] [--out docs/lf_examples_smollm2.md]

Each YAML is changed only in
  - model_name_or_path -> smollm2-135m-instruct (the packaged model, cached once), except
    where it names an earlier example's output (saves/...), which is kept, under the work dir;
  - dataset_dir -> tests/fixtures/llamafactory_data (LLaMA-Factory's data/ folder);
  - relative output paths (output_dir, adapter_name_or_path, export_dir, tokenized_path)
    -> the same relative path under the work dir, so one example's output feeds the next
    exactly as in LLaMA-Factory (train_lora/qwen3_lora_sft -> merge_lora/qwen3_lora_sft);
  - deepspeed: examples/deepspeed/X -> tests/fixtures/llamafactory_deepspeed/X (a copy);
  - a step cap: max_steps (default 1), gradient_accumulation_steps 1 (a step is one
    micro-batch of the example's per_device_train_batch_size: on a shared 2-core CPU one
    step of 8 accumulated samples of SmolLM2 takes minutes) and cutoff_len (default 128);
    predict YAMLs get max_new_tokens 16 instead (generation length is their cost),
    inference YAMLs one prompt of 16 tokens;
  - where the example cannot mean SmolLM2: template llama3 (its <|eot_id|> and
    <|start_header_id|> are not in SmolLM2's vocabulary; tunesmith refuses rather than
    grow the vocabulary) -> the tokenizer's own template; the ASFT examples' datasets
    (med, math: not in LLaMA-Factory's demo folder) -> alpaca_en_demo; LLaMA Pro's
    freeze_trainable_layers 8 (its expanded 40-layer model) -> 6, which divides SmolLM2's
    30 layers (LLaMA-Factory refuses 8 on 30 layers as tunesmith does). The table says so.
Everything else (template, LoRA/optimizer keys, batch size, accumulation, bf16, workers,
max_samples, ...) is LLaMA-Factory's value. Every YAML runs as its own `python -m tunesmith
train|export|chat` process. A YAML is "run" when that command exits 0; its steps and final
loss come from run_summary.json. YAMLs that cannot run here are listed with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "tests" / "fixtures" / "llamafactory_examples"
DATA_DIR = ROOT / "tests" / "fixtures" / "llamafactory_data"
DEEPSPEED_DIR = ROOT / "tests" / "fixtures" / "llamafactory_deepspeed"
MODEL = "smollm2-135m-instruct"
OUTPUT_KEYS = ("output_dir", "adapter_name_or_path", "export_dir", "tokenized_path")
GEN_TOKENS = 16

_VL = "vision-language model; SmolLM2-135M is text-only (train_lora/qwen3vl_lora_sft.yaml "\
      "runs on a tiny Qwen2-VL in tests/test_vision_llamafactory.py)"
_PREQUANT = "a pre-quantised checkpoint ({}): its kernels need a CUDA GPU and no such "\
            "SmolLM2 checkpoint exists offline"
# example -> why it is not run on this CPU machine (the loader still has to accept it)
NOT_RUN_HERE: dict[str, str] = {
    "extras/fp8/llama3_fp8_deepspeed_sft.yaml": "needs GPU: fp8 training (torchao) needs a "
                                                "Hopper-class CUDA GPU",
    "extras/fp8/llama3_fp8_fsdp_sft.yaml": "needs GPU: fp8 training (torchao) needs a "
                                           "Hopper-class CUDA GPU, FSDP several GPUs",
    "extras/fsdp_qlora/llama3_lora_sft.yaml": "needs GPU: FSDP over bitsandbytes 4-bit "
                                              "weights shards across CUDA GPUs",
    "extras/qoft/llama3_oft_sft_awq.yaml": "needs GPU: " + _PREQUANT.format("AWQ"),
    "extras/qoft/llama3_oft_sft_gptq.yaml": "needs GPU: " + _PREQUANT.format("GPTQ"),
    "train_qlora/llama3_lora_sft_aqlm.yaml": "needs GPU: " + _PREQUANT.format("AQLM"),
    "train_qlora/llama3_lora_sft_awq.yaml": "needs GPU: " + _PREQUANT.format("AWQ"),
    "train_qlora/llama3_lora_sft_gptq.yaml": "needs GPU: " + _PREQUANT.format("GPTQ"),
    "merge_lora/qwen3_gptq.yaml": "needs GPU: GPTQ quantisation at export (gptqmodel) "
                                  "calibrates on a CUDA GPU",
    "extras/oft/qwen2_5vl_oft_sft.yaml": _VL,
    "inference/mossvl.yaml": _VL,
    "inference/qwen3vl.yaml": _VL,
    "merge_lora/mossvl_lora_sft.yaml": _VL,
    "merge_lora/qwen3vl_lora_sft.yaml": _VL,
    "train_full/mossvl_full_sft.yaml": _VL,
    "train_full/qwen3vl_full_sft.yaml": _VL,
    "train_lora/mossvl_lora_sft.yaml": _VL,
    "train_lora/qwen3vl_lora_dpo.yaml": _VL,
    "train_lora/qwen3vl_lora_sft.yaml": _VL,
}
# example keys that name something SmolLM2 or the demo folder lacks -> stand-in (see doc)
STAND_INS = {("template", "llama3"): "", ("dataset", "med"): "alpaca_en_demo",
             ("dataset", "math"): "alpaca_en_demo", ("freeze_trainable_layers", 8): 6}
# examples whose output a later example reads run first (LLaMA-Factory's README order)
FIRST = ("train_lora/qwen3_lora_sft.yaml", "train_full/qwen3_full_sft.yaml")
LAST_PREFIXES = ("extras/nlg_eval/", "merge_lora/", "inference/")


@dataclass
class Outcome:
    example: str
    status: str  # run | failed | refused | not run here
    steps: int | None = None
    loss: float | None = None
    seconds: float | None = None
    note: str = ""


def verb_of(example: str) -> str:
    if example.startswith("merge_lora/"):
        return "export"
    return "chat" if example.startswith("inference/") else "train"


def stand_ins(data: dict[str, Any]) -> list[str]:
    """Apply STAND_INS to `data`; returns what was replaced, for the table."""
    notes = []
    for (key, value), other in STAND_INS.items():
        if data.get(key) == value:
            data[key] = other
            notes.append(f"{key} {value} -> {other or 'tokenizer own'}")
    return notes


def run_keys(example: str, work: Path, steps: int, cutoff_len: int = 128) -> dict[str, Any]:
    """The example's keys with the model, paths and step cap replaced (see the module doc)."""
    data = yaml.safe_load((EXAMPLES / example).read_text(encoding="utf-8"))
    stand_ins(data)
    model = str(data.get("model_name_or_path", ""))
    data["model_name_or_path"] = str(work / model) if model.startswith("saves/") else MODEL
    for key in OUTPUT_KEYS:
        value = data.get(key)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            data[key] = str(work / value)
    if "deepspeed" in data:
        data["deepspeed"] = str(DEEPSPEED_DIR / Path(data["deepspeed"]).name)
    if verb_of(example) != "train":
        return data
    data["dataset_dir"] = str(DATA_DIR)
    if data.get("do_predict") or data.get("predict_with_generate"):
        data["max_new_tokens"] = GEN_TOKENS
    else:
        data.update(max_steps=steps, gradient_accumulation_steps=1,
                    cutoff_len=min(cutoff_len, data.get("cutoff_len", 1024)))
    return data


def ordered(examples: list[str]) -> list[str]:
    def rank(name: str) -> tuple[int, str]:
        if name in FIRST:
            return 0, str(FIRST.index(name))
        return (2 if name.startswith(LAST_PREFIXES) else 1), name

    return sorted(examples, key=rank)


def loader_verdict(example: str, work: Path) -> str:
    """'' when tunesmith's config loader accepts the (substituted) example, else why not."""
    from tunesmith.config.loader import build_config
    from tunesmith.errors import ConfigError

    sys.path.insert(0, str(ROOT / "tests"))
    from lf_examples import substituted

    try:
        build_config(substituted(EXAMPLES / example, MODEL, work))
    except ConfigError as exc:
        lines = [x.strip(" -") for x in str(exc).replace(f"{ROOT}/", "").splitlines()
                 if x.strip()]
        return lines[1] if len(lines) > 1 else lines[0]
    return ""


def run_example(example: str, work: Path, steps: int, cutoff_len: int, timeout: int) -> Outcome:
    keys = run_keys(example, work, steps, cutoff_len)
    cfg = work / "yaml" / example
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(yaml.safe_dump(keys, sort_keys=False), encoding="utf-8")
    command = [sys.executable, "-m", "tunesmith", verb_of(example), str(cfg)]
    if verb_of(example) == "chat":
        command += ["--prompt", "Who are you?", "--max_new_tokens", str(GEN_TOKENS),
                    "--temperature", "0"]
    cleared = clear_export_dir(keys) if verb_of(example) == "export" else ""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    start = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout,
                              cwd=work)
    except subprocess.TimeoutExpired:
        return Outcome(example, "failed", seconds=timeout, note=f"timed out after {timeout} s")
    seconds = time.perf_counter() - start
    log = work / "logs" / (example.replace("/", "__") + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(done.stdout + "\n--- stderr ---\n" + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        errors = [x for x in done.stderr.splitlines() if x.startswith("error:")]
        reason = errors[-1] if errors else (done.stderr.strip().splitlines() or ["?"])[-1]
        return Outcome(example, "failed", seconds=seconds, note=reason[:300])
    replaced = stand_ins(yaml.safe_load((EXAMPLES / example).read_text(encoding="utf-8")))
    note = describe_output(example, keys, done.stdout)
    return Outcome(example, "run", *summary_figures(keys), seconds=seconds,
                   note="; ".join([note, *replaced, *([cleared] if cleared else [])]))


def clear_export_dir(keys: dict[str, Any]) -> str:
    """Two merge examples export to saves/qwen3_sft_merged. LLaMA-Factory writes over it;
    tunesmith refuses a non-empty export_dir without overwrite_output_dir, so the walk
    removes an earlier example's export first (as a user running one merge would have
    none) and says so in the table."""
    folder = Path(keys.get("export_dir", ""))
    if not keys.get("export_dir") or not folder.is_dir() or not any(folder.iterdir()):
        return ""
    shutil.rmtree(folder)
    return f"removed the earlier export in {folder.name} first"


def summary_figures(keys: dict[str, Any]) -> tuple[int | None, float | None]:
    path = Path(keys.get("output_dir", "")) / "run_summary.json"
    if not keys.get("output_dir") or not path.is_file():
        return None, None
    summary = json.loads(path.read_text(encoding="utf-8"))
    return summary.get("steps"), summary.get("final_loss")


def describe_output(example: str, keys: dict[str, Any], stdout: str) -> str:
    """What the run left behind, in a few words, for the table."""
    if verb_of(example) == "chat":
        answer = [x for x in stdout.splitlines() if x.startswith("assistant>")]
        return f"answered: {answer[-1][10:].strip()[:60]!r}" if answer else "no answer printed"
    folder = Path(keys.get("export_dir") or keys.get("output_dir", ""))
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    wanted = [n for n in ("adapter_model.safetensors", "model.safetensors",
                          "model.safetensors.index.json", "generated_predictions.jsonl",
                          "pissa_converted", "value_head.safetensors") if n in names]
    if keys.get("tokenized_path") and (Path(keys["tokenized_path"]) / "manifest.json").is_file():
        wanted.append("tokenized_path dataset")
    return "wrote " + ", ".join(wanted) if wanted else "wrote: " + ", ".join(names[:6])


def walk(work: Path, steps: int, cutoff_len: int, only: list[str], timeout: int
         ) -> list[Outcome]:
    names = [p.relative_to(EXAMPLES).as_posix() for p in sorted(EXAMPLES.rglob("*.yaml"))]
    outcomes = []
    for example in ordered([n for n in names if not only or n in only]):
        verdict = loader_verdict(example, work)
        if verdict:
            outcomes.append(Outcome(example, "refused", note=verdict))
        elif example in NOT_RUN_HERE:
            outcomes.append(Outcome(example, "not run here", note=NOT_RUN_HERE[example]))
        else:
            outcomes.append(run_example(example, work, steps, cutoff_len, timeout))
        o = outcomes[-1]
        print(f"{o.status:13s} {example} {o.steps} {o.loss} {o.seconds} {o.note[:120]}",
              flush=True)
    return outcomes


def render_table(outcomes: list[Outcome], steps: int, cutoff_len: int) -> str:
    counts = {s: sum(o.status == s for o in outcomes)
              for s in ("run", "failed", "not run here", "refused")}
    accepted = len(outcomes) - counts["refused"]
    lines = [
        "# LLaMA-Factory's example YAMLs on SmolLM2-135M-Instruct",
        "",
        "Generated by `python tools/lf_examples_smollm2.py` (see its docstring for exactly "
        "what is substituted): each of LLaMA-Factory 0.9.5's example YAMLs with only the "
        "model (smollm2-135m-instruct), the data folder (LLaMA-Factory's `data/`, "
        "tests/fixtures/llamafactory_data), the output paths (under a work folder, so one "
        f"example's output feeds the next) and a step cap (max_steps {steps}, "
        f"gradient_accumulation_steps 1, cutoff_len "
        f"{cutoff_len}; predict and chat YAMLs {GEN_TOKENS} new tokens) changed, and the "
        "stand-ins the notes name where an example names a template, dataset or layer "
        "count SmolLM2 or the demo folder lacks; each runs as its own "
        "`tunesmith train|export|chat` process on a 2-core CPU shared with other jobs "
        f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; seconds are wall "
        "time including start-up and model loading).",
        "",
        f"Accepted by the config loader: {accepted} of {len(outcomes)}; run here: "
        f"{counts['run']}; failed: {counts['failed']}; not run here (needs a GPU or a "
        f"vision model): {counts['not run here']}; refused: {counts['refused']}.",
        "",
        "| example | status | steps | final loss | seconds | notes |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for o in sorted(outcomes, key=lambda o: o.example):
        loss = f"{o.loss:.4f}" if o.loss is not None else ""
        secs = f"{o.seconds:.0f}" if o.seconds is not None else ""
        note = o.note.replace("|", "\\|")
        lines.append(f"| `{o.example}` | {o.status} | {o.steps if o.steps is not None else ''}"
                     f" | {loss} | {secs} | {note} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--cutoff_len", type=int, default=128)
    parser.add_argument("--only", default="", help="comma-separated example names")
    parser.add_argument("--work", default="", help="work folder (default: a fresh temp dir)")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--reuse", default="", help="outcomes.json of an earlier walk: its "
                        "rows stand for the examples not in --only (the table covers both)")
    parser.add_argument("--out", default="", help="the table (default: "
                        "docs/lf_examples_smollm2.md when all examples run, else none)")
    ns = parser.parse_args()
    import tempfile

    work = Path(ns.work or tempfile.mkdtemp(prefix="lf-smollm2-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    only = [x for x in ns.only.split(",") if x]
    outcomes = walk(work, ns.steps, ns.cutoff_len, only, ns.timeout)
    if ns.reuse:
        fresh = {o.example for o in outcomes}
        earlier = json.loads(Path(ns.reuse).read_text(encoding="utf-8"))
        outcomes += [Outcome(**o) for o in earlier if o["example"] not in fresh]
    (work / "outcomes.json").write_text(json.dumps([o.__dict__ for o in outcomes], indent=1))
    out = ns.out or ("" if only else str(ROOT / "docs" / "lf_examples_smollm2.md"))
    if out:
        Path(out).write_text(render_table(outcomes, ns.steps, ns.cutoff_len), encoding="utf-8")
        print(f"wrote {out}")
    return 1 if any(o.status == "failed" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())

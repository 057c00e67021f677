"""Vision-language training benchmark: Qwen2-VL-7B shapes, random weights, mixed media.

    python bench/vl.py [--out DIR] [--tiny] [--steps N] [--samples N] [--systems a,b,...]

Builds everything offline in a work folder: a Qwen2-VL config with Qwen2-VL-7B's shapes (the
7B language model and the 675M vision tower; --tiny: 2 layers, hidden 64), random bf16
weights, a byte-level BPE tokenizer carrying the vision tokens, the image processor config,
and a dataset mixed as the seed article describes (about 25% text only, 60% one image of
224-448 px sides, 15% a 4-frame 224 px video given as frames). Then it times, each in its
own process, LoRA r16 on the language model's projections with the vision tower and
projector frozen, micro-batch 4, no recompute:

    tunesmith           `tunesmith train <yaml>` (the CLI path a user runs)
    tunesmith+packing   the same with neat_packing and varlen attention (rows of cutoff_len,
                        per-sample mrope, FlashAttention varlen in the language model)
    tunesmith+liger     the same with enable_liger_kernel (when liger-kernel is installed)
    hf / hf+liger       transformers + PEFT in a plain loop on the same batches (full logits,
                        the model's own loss), + liger-kernel's instance patch

Steady-state tokens/s counts real (non-pad) tokens, vision tokens included, as the peers
recipe (/work/shared/peers, PEERS_LF_STAGE=mm) does for LLaMA-Factory. Writes results.json
and results.md to --out (default $OUT or ./bench-out). On one H200 building the model takes
a few minutes and each system about one to two (24 steps); --systems runs a subset, so the
five systems can be split over calls of at most 10 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SRC = str(Path(__file__).resolve().parents[1] / "src")
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
SIDES = (224, 280, 336, 392, 448)
WORDS = ("the model reads an image and answers questions about what it shows in detail with "
         "colour shape count position motion person animal text scene light").split()
LF_REFERENCE = {"llamafactory": (5646, 62.7), "llamafactory+liger": (4895, 46.3)}  # the issue
SYSTEMS = ("tunesmith", "tunesmith+packing", "tunesmith+liger", "hf", "hf+liger")


def model_shapes(tiny: bool) -> tuple[dict, dict]:
    if tiny:
        text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                    rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
        vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2)
    else:  # Qwen2-VL-7B
        text = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                    num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                    rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
                    rope_theta=1e6)
        vision = dict(depth=32, embed_dim=1280, hidden_size=3584, num_heads=16, mlp_ratio=4)
    vision.update(patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    return text, vision


def build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *VISION_TOKENS]
    trainer = trainers.BpeTrainer(vocab_size=min(vocab_size, 2000), special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([" ".join(WORDS)] * 50, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>")


def build_model(folder: Path, tiny: bool) -> None:
    import torch
    from transformers import AutoModelForImageTextToText, Qwen2VLConfig

    text, vision = model_shapes(tiny)
    tok = build_tokenizer(text["vocab_size"])
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    special = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                   pad_token_id=tok.pad_token_id)
    cfg = Qwen2VLConfig(text_config={**text, **special, "max_position_embeddings": 32768},
                        vision_config=vision, image_token_id=ids["<|image_pad|>"],
                        video_token_id=ids["<|video_pad|>"],
                        vision_start_token_id=ids["<|vision_start|>"],
                        vision_end_token_id=ids["<|vision_end|>"], **special)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, "merge_size": 2,
        "temporal_patch_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}}))
    del model


def build_data(folder: Path, n: int, tiny: bool, seed: int = 7) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    media = folder / "media"
    media.mkdir(parents=True, exist_ok=True)
    sides = (56, 84) if tiny else SIDES
    rows = []
    for i in range(n):
        ask = " ".join(rng.choice(WORDS, int(rng.integers(10, 60))))
        answer = " ".join(rng.choice(WORDS, int(rng.integers(40, 300))))
        row: dict = {"messages": [{"role": "user", "content": ask},
                                  {"role": "assistant", "content": answer}]}
        kind = rng.random()
        if kind >= 0.25:
            frames = 1 if kind < 0.85 else 4
            w, h = (int(rng.choice(sides)), int(rng.choice(sides))) if frames == 1 \
                else (sides[0], sides[0])
            paths = []
            for f in range(frames):
                p = media / f"{i}_{f}.png"
                Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(p)
                paths.append(str(p.relative_to(folder)))
            tag, col, value = (("<image>", "images", paths) if frames == 1
                               else ("<video>", "videos", [paths]))
            row["messages"][0]["content"] = tag + ask
            row[col] = value
        rows.append(row)
    (folder / "mm.json").write_text(json.dumps(rows))
    entry = {"file_name": "mm.json", "formatting": "sharegpt",
             "columns": {"messages": "messages", "images": "images", "videos": "videos"},
             "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                      "assistant_tag": "assistant"}}
    (folder / "dataset_info.json").write_text(json.dumps({"mm": entry}))


def train_config(work: Path, system: str, steps: int, tiny: bool) -> dict:
    cuda = not tiny
    return {"model_name_or_path": str(work / "model"), "dataset": "mm",
            "dataset_dir": str(work / "data"), "template": "qwen2_vl", "cutoff_len": 2048,
            "finetuning_type": "lora", "lora_rank": 16, "lora_alpha": 32,
            "lora_target": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
            "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
            "learning_rate": 1e-4, "lr_scheduler_type": "constant", "max_steps": steps,
            "bf16": cuda, "gradient_checkpointing": "false", "logging_steps": 1,
            "save_steps": 0, "output_dir": str(work / "runs" / system),
            "overwrite_output_dir": True, "preprocessing_num_workers": 8,
            "dataloader_num_workers": 4 if cuda else 0, "plot_loss": False,
            "neat_packing": system == "tunesmith+packing",
            "attn_implementation": "varlen" if system == "tunesmith+packing" else "sdpa",
            "enable_liger_kernel": system == "tunesmith+liger"}


def steady_rate(metrics: Path, warmup: int) -> float:
    lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    rates = [x["tokens_per_s"] for x in lines if x.get("step", 0) > warmup
             and x.get("tokens_per_s")]
    return statistics.median(rates) if rates else 0.0


def run_tunesmith(work: Path, system: str, steps: int, warmup: int, tiny: bool) -> dict:
    import yaml

    cfg = train_config(work, system, steps, tiny)
    path = work / f"{system}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-m", "tunesmith", "train", str(path)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {"system": system, "error": done.stderr[-2000:]}
    out = Path(cfg["output_dir"])
    perf = json.loads((out / "run_summary.json").read_text())["performance"]
    return {"system": system, "tokens_per_s": steady_rate(out / "metrics.jsonl", warmup),
            "peak_memory_gb": perf["peak_memory_gb"], "mfu": perf.get("mfu"),
            "final_loss": json.loads((out / "run_summary.json").read_text())["final_loss"]}


def hf_batches(work: Path, tiny: bool, count: int):
    """The same samples tunesmith trains on, collated 4 per batch (padded, unpacked) as the
    loop asks for them, so collation (patchify) is inside the timed region as for tunesmith."""
    from tunesmith.config import load_config
    from tunesmith.data.batching import collate
    from tunesmith.data.loading import DataContext, prepare_data
    from tunesmith.data.template import ChatRenderer, load_template_source
    from tunesmith.models.loader import load_tokenizer
    from tunesmith.models.processor import load_vision_settings

    cfg = load_config(overrides=train_config(work, "hf", 1, tiny))
    tok = load_tokenizer(str(work / "model"))
    name, source = load_template_source("qwen2_vl", tok)
    vision = load_vision_settings(str(work / "model"), tok, cfg)
    data = prepare_data(cfg.data, DataContext(ChatRenderer(name, source, tok), tok, 42, "sft",
                                              False, vision, "bench"))
    return (collate([data.train[(4 * b + k) % len(data.train)] for k in range(4)],
                    tok.pad_token_id) for b in range(count))


def hf_model(work: Path, liger: bool, device: str):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForImageTextToText.from_pretrained(work / "model", dtype=dtype,
                                                        attn_implementation="sdpa").to(device)
    if liger:
        from liger_kernel.transformers import apply_liger_kernel_to_qwen2_vl

        apply_liger_kernel_to_qwen2_vl(model=model)
    targets = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=targets, task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def run_hf(work: Path, system: str, steps: int, warmup: int, tiny: bool) -> dict:
    """transformers + PEFT: the model's own forward and loss (full logits), AdamW, bf16."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = hf_model(work, system == "hf+liger", device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    batches = hf_batches(work, tiny, steps)
    tokens, start, losses = 0, 0.0, []
    for i, batch in enumerate(batches):
        if i == warmup:
            sync(device)
            tokens, start = 0, time.perf_counter()
        b = batch.to(torch.device(device))
        labels = torch.full_like(b.input_ids, -100).view(-1)
        labels[b.target_index + 1] = b.target_ids
        inputs = {k: getattr(b, k) for k in ("pixel_values", "image_grid_thw",
                                              "pixel_values_videos", "video_grid_thw")
                  if getattr(b, k) is not None}
        types = mm_types(model, b)
        if types is not None:
            inputs["mm_token_type_ids"] = types
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(input_ids=b.input_ids, attention_mask=b.attention_mask,
                         labels=labels.view_as(b.input_ids), **inputs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
        tokens += b.n_tokens
    sync(device)
    rate = tokens / (time.perf_counter() - start) if start else 0.0
    peak = torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None
    return {"system": system, "tokens_per_s": rate, "peak_memory_gb": peak, "mfu": None,
            "final_loss": losses[-1]}


def mm_types(model, batch):
    """Token types (1 image, 2 video) where the installed transformers wants them."""
    import json as _json

    cfg = _json.loads(Path(model.config.name_or_path, "config.json").read_text())
    types = ((batch.input_ids == cfg["image_token_id"]).int()
             + 2 * (batch.input_ids == cfg["video_token_id"]).int())
    import inspect

    wants = "mm_token_type_ids" in inspect.signature(model.get_base_model().forward).parameters
    return types if wants else None


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def run_worker(args: argparse.Namespace) -> None:
    runner = run_hf if args.worker.startswith("hf") else run_tunesmith
    result = runner(Path(args.work), args.worker, args.steps, args.warmup, args.tiny)
    Path(args.result).write_text(json.dumps(result))


def run_system(work: Path, system: str, args: argparse.Namespace) -> dict:
    """Each system in its own process (no memory or compile state shared)."""
    result = work / f"{system}.json"
    cmd = [sys.executable, __file__, "--worker", system, "--work", str(work), "--result",
           str(result), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    done = subprocess.run(cmd + (["--tiny"] if args.tiny else []), capture_output=True,
                          text=True)
    if done.returncode != 0 or not result.is_file():
        return {"system": system, "error": done.stderr[-2000:]}
    return json.loads(result.read_text())


def write_report(results: list[dict], out: Path, args: argparse.Namespace) -> None:
    out.mkdir(parents=True, exist_ok=True)
    best_lf = max(v[0] for v in LF_REFERENCE.values())
    lines = ["| system | tokens/s | peak memory (GB) | MFU | vs LLaMA-Factory's faster run |",
             "|---|---:|---:|---:|---:|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['system']} | error | | | |")
            continue
        mem = f"{r['peak_memory_gb']:.1f}" if r.get("peak_memory_gb") is not None else "n/a"
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "n/a"
        lines.append(f"| {r['system']} | {r['tokens_per_s']:,.0f} | {mem} | {mfu} | "
                     f"{r['tokens_per_s'] / best_lf:.2f}x |")
    for name, (rate, mem) in LF_REFERENCE.items():
        lines.append(f"| {name} (issue 14, peers recipe) | {rate:,} | {mem} | n/a | "
                     f"{rate / best_lf:.2f}x |")
    shape = "tiny (CPU check)" if args.tiny else "Qwen2-VL-7B shapes"
    head = (f"Vision-language LoRA SFT, {shape}, micro-batch 4, no recompute, "
            f"{args.samples} samples, {args.steps} steps ({args.warmup} warm-up).\n\n")
    (out / "results.md").write_text(head + "\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps({"tiny": args.tiny, "results": results,
                                                  "llamafactory": LF_REFERENCE}, indent=2))
    print(head + "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--tiny", action="store_true", help="tiny shapes on CPU, a few steps")
    p.add_argument("--steps", type=int, default=0, help="timed + warm-up steps per system")
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--samples", type=int, default=0)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--work", default="", help="where the model and data are built (default: "
                   "a folder under the system temp dir, never under --out)")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.steps = args.steps or (4 if args.tiny else 24)
    args.warmup = args.warmup or (1 if args.tiny else 6)
    args.samples = args.samples or (24 if args.tiny else 400)
    if args.worker:
        run_worker(args)
        return 0
    import tempfile

    tag = "tiny" if args.tiny else "7b"
    work = Path(args.work or Path(tempfile.gettempdir()) / f"tunesmith-vl-bench-{tag}")
    if not (work / "model" / "config.json").is_file():
        build_model(work / "model", args.tiny)
    if not (work / "data" / "mm.json").is_file():
        build_data(work / "data", args.samples, args.tiny)
    results = [run_system(work, s, args) for s in args.systems.split(",") if s]
    write_report(results, Path(args.out), args)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())

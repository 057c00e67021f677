"""Write template parity fixtures by running LLaMA-Factory's own encoder.

    /work/side/lf/bin/python tools/lf_fixtures.py [--extra-src /path/to/LLaMA-Factory/src]

Two tokenizers are built offline (no download): a byte-level BPE one and a
SentencePiece-style one (Metaspace word markers, added at the start of every piece), both
trained on the fixture conversations and carrying every special token that some template
uses. For every template name in src/tunesmith/resources/templates/slots.json and a few
conversations (single and multi-turn, system prompts, the default system, tool calls and
results, unicode, thinking on and off, mask_history), LLaMA-Factory's supervised
processor gives the input ids and labels, written to tests/fixtures/templates/<name>.json.
Templates with media plugins are encoded with their text path (no images, base plugin).
Names only a newer source tree registers are encoded by that tree (`--extra-src`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "src" / "tunesmith" / "resources" / "templates" / "slots.json"
SLOTS = ROOT / "src" / "tunesmith" / "resources" / "templates" / "slots"
OUT = ROOT / "tests" / "fixtures" / "templates"
TOOLS = json.dumps([{"name": "get_weather", "description": "Weather of a city",
                     "parameters": {"type": "object", "properties": {
                         "city": {"type": "string", "description": "city name"},
                         "unit": {"type": "string", "enum": ["c", "f"]}},
                         "required": ["city"]}}])
CONVERSATIONS = {
    "single": {"system": "", "tools": "", "messages": [
        ("user", "Hello, how are you?"), ("assistant", "I am fine, thank you.")]},
    "system_multi": {"system": "You are a kind tutor.", "tools": "", "messages": [
        ("user", "Grüße! Was ist 2+2? 你好 🎉"), ("assistant", "Es ist 4. 好的 ✓"),
        ("user", "And 3*3?"), ("assistant", "It's 9.")]},
    "tools": {"system": "Answer briefly.", "tools": TOOLS, "messages": [
        ("user", "Weather in Paris?"),
        ("function", json.dumps({"name": "get_weather",
                                 "arguments": {"city": "Paris", "unit": "c"}})),
        ("observation", json.dumps({"temp": 21, "sky": "sunny"})),
        ("assistant", "It is sunny, 21 °C.")]},
    "tools_no_system": {"system": "", "tools": TOOLS, "messages": [
        ("user", "Weather in Rome?"),
        ("function", json.dumps({"name": "get_weather", "arguments": {"city": "Rome"}})),
        ("observation", "22 degrees"), ("assistant", "22 degrees in Rome.")]},
    "thinking": {"system": "", "tools": "", "messages": [
        ("user", "Is 7 prime?"),
        ("assistant", "<think>\n7 has no divisors but 1 and itself.\n</think>\n\nYes."),
        ("user", "And 9?"), ("assistant", "No, 9 = 3 * 3.")]},
}
# (name, data keys): every template gets "default"; reasoning templates the others too
VARIANTS = {"default": {}, "mask_history": {"mask_history": True},
            "nothink": {"enable_thinking": False}}
TOKEN_PATTERNS = [r"<\|[^|<>]{1,40}\|>", r"<｜[^｜]{1,40}｜>", r"</?[A-Za-z_][\w:.-]{0,40}>",
                  r"\[/?[A-Z_]{2,30}\]", r"<\|[^|<>]{1,40}>", r"<[^|<>]{1,40}\|>"]


def special_tokens(table: dict) -> list[str]:
    found: set[str] = {"<s>", "</s>", "<unk>", "<|endoftext|>"}
    for name in table:
        data = json.loads((SLOTS / f"{name}.json").read_text(encoding="utf-8"))
        found.update(data["stop_words"])  # the template makes them special tokens anyway
        texts = [*data["thought_words"], *data["tool_call_words"]]
        for slots in [*data["slots"].values(), data.get("tools_slots") or []]:
            for s in slots:
                if isinstance(s, dict) and "token" in s:
                    found.add(s["token"])
                elif isinstance(s, str):
                    texts.append(s)
        for text in texts:
            for pattern in TOKEN_PATTERNS:
                found.update(m.strip() for m in re.findall(pattern, text) if m.strip())
    return sorted(found)


def corpus() -> list[str]:
    texts = [c for conv in CONVERSATIONS.values() for _, c in conv["messages"]]
    texts += [conv["system"] for conv in CONVERSATIONS.values()] + [TOOLS]
    return texts * 3 + ["The quick brown fox jumps over the lazy dog. " * 4]


def build_tokenizers(specials: list[str], out: Path) -> dict[str, Path]:
    from tokenizers import (
        SentencePieceBPETokenizer,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    folders = {}
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=700, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    sp = SentencePieceBPETokenizer()
    sp.train_from_iterator(corpus(), vocab_size=700, special_tokens=specials)
    for name, tok, eos in (("bpe", bpe, "<|endoftext|>"), ("sp", sp, "</s>")):
        obj = tok if isinstance(tok, Tokenizer) else tok._tokenizer
        fast = PreTrainedTokenizerFast(tokenizer_object=obj, bos_token="<s>", eos_token=eos,
                                       unk_token="<unk>")
        folders[name] = out / "tokenizers" / name
        fast.save_pretrained(str(folders[name]))
    return folders


def encode_with_lf(name: str, tok_dir: Path, conv: dict, keys: dict) -> dict:
    from llamafactory.data.mm_plugin import get_mm_plugin
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tok_dir))
    args = DataArguments(template=name, cutoff_len=100_000, **keys)
    template = get_template_and_fix_tokenizer(tokenizer, args)
    template = dataclasses.replace(template, mm_plugin=get_mm_plugin(name="base"))
    msgs = [{"role": r, "content": c} for r, c in conv["messages"]]
    proc = SupervisedDatasetProcessor(template=template, tokenizer=tokenizer, processor=None,
                                      data_args=args)
    try:
        ids, labels = proc._encode_data_example(msgs[:-1], msgs[-1:], conv["system"],
                                                conv["tools"], [], [], [])
    except Exception as exc:  # recorded: tunesmith must refuse the same conversation
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"input_ids": ids, "mask": label_mask(ids, labels)}


def label_mask(ids: list[int], labels: list[int]) -> str:
    """Labels as one character per token: '.' ignored, '+' trained on the token itself, 'e'
    trained to predict EOS instead (efficient_eos templates); keeps the fixtures small."""
    eos_only = {lab for i, lab in zip(ids, labels, strict=True) if lab not in (-100, i)}
    if len(eos_only) > 1:
        raise SystemExit(f"unexpected labels {sorted(eos_only)}")
    return "".join("." if lab == -100 else "+" if lab == i else "e"
                   for i, lab in zip(ids, labels, strict=True))


def template_fixture(name: str, tok_dirs: dict[str, Path], reasoning: bool) -> dict:
    from datetime import datetime

    cases = []
    for tok_name, tok_dir in tok_dirs.items():
        for conv_name, conv in CONVERSATIONS.items():
            for var_name, keys in VARIANTS.items():
                if var_name == "nothink" and not reasoning:
                    continue
                if var_name == "mask_history" and conv_name != "system_multi":
                    continue
                if tok_name == "sp" and conv_name not in ("single", "tools", "system_multi"):
                    continue
                case = {"tokenizer": tok_name, "conversation": conv_name, "variant": var_name}
                case.update(encode_with_lf(name, tok_dir, conv, keys))
                cases.append(case)
    return {"template": name, "date": datetime.now().strftime("%d %b %Y"), "cases": cases}


DATASETS = [("glaive_toolcall_en_demo", "qwen"), ("glaive_toolcall_zh_demo", "glm4"),
            ("alpaca_en_demo", "llama3"), ("identity", "qwen3")]


def dataset_fixtures() -> None:
    """LLaMA-Factory's whole data path (dataset_info.json, converters, template, processor)
    on its own demo files (tests/fixtures/llamafactory_data/), with the BPE tokenizer."""
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments, ModelArguments
    from transformers import PreTrainedTokenizerFast, Seq2SeqTrainingArguments

    tok_dir = OUT / "tokenizers" / "bpe"
    out = {}
    for dataset, name in DATASETS:
        tok = PreTrainedTokenizerFast.from_pretrained(str(tok_dir))
        data_args = DataArguments(template=name, dataset=dataset, cutoff_len=4096,
                                  dataset_dir=str(ROOT / "tests/fixtures/llamafactory_data"),
                                  overwrite_cache=True)
        template = get_template_and_fix_tokenizer(tok, data_args)
        module = get_dataset(template, ModelArguments(model_name_or_path=str(tok_dir)), data_args,
                             Seq2SeqTrainingArguments(output_dir="/tmp/lf-fixtures",
                                                      report_to="none"),
                             "sft", tokenizer=tok, processor=None)
        train = module["train_dataset"]
        out[f"{dataset}/{name}"] = [{"input_ids": ids, "mask": label_mask(ids, labels)}
                                    for ids, labels in zip(train["input_ids"], train["labels"],
                                                           strict=True)]
    (OUT / "datasets.json").write_text(json.dumps(out, ensure_ascii=False,
                                                  separators=(",", ":")) + "\n",
                                       encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--extra-src", help="a newer LLaMA-Factory src/ tree for extra names")
    p.add_argument("--names", nargs="*", help="only these templates (used by --extra-src)")
    p.add_argument("--datasets", action="store_true",
                   help="only the whole-pipeline fixtures on LLaMA-Factory's demo data")
    ns = p.parse_args()
    if ns.datasets:
        dataset_fixtures()
        return
    table = json.loads(TABLE.read_text(encoding="utf-8"))
    if not ns.names:
        specials = special_tokens(table)
        tok_dirs = build_tokenizers(specials, OUT)
        (OUT / "conversations.json").write_text(json.dumps(
            {"conversations": CONVERSATIONS, "variants": VARIANTS}, ensure_ascii=False,
            indent=1) + "\n", encoding="utf-8")
    tok_dirs = {n: OUT / "tokenizers" / n for n in ("bpe", "sp")}
    from llamafactory.data.template import TEMPLATES

    names = ns.names or sorted(table)
    missing = [n for n in names if n not in TEMPLATES]
    for name in names:
        if name in missing:
            continue
        fixture = template_fixture(name, tok_dirs, table[name]["thinking"])
        (OUT / f"{name}.json").write_text(json.dumps(fixture, ensure_ascii=False,
                                                     separators=(",", ":")) + "\n",
                                          encoding="utf-8")
    if missing and ns.extra_src:
        subprocess.run([sys.executable, __file__, "--names", *missing],
                       env={"PYTHONPATH": ns.extra_src, "DISABLE_VERSION_CHECK": "1"}, check=True)
    elif missing:
        print(f"not in this LLaMA-Factory: {', '.join(missing)} (give --extra-src)")
    print(f"wrote fixtures for {len(names) - (len(missing) if not ns.extra_src else 0)} "
          "templates")


if __name__ == "__main__":
    main()

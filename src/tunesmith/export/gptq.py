"""GPTQ quantisation of an exported HF folder through transformers' GPTQConfig (which runs
gptqmodel via optimum), calibrated on texts of export_quantization_dataset."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

from tunesmith.config.export_quant_keys import ExportQuantConfig
from tunesmith.errors import ExportError

GPTQ_BITS = (2, 3, 4, 8)
GPTQ_PACKAGES = ("gptqmodel", "optimum")


def check_gptq(q: ExportQuantConfig, export_format: str) -> None:
    """Fail before the merge when GPTQ cannot run: bits, format, data file, packages."""
    bits = q.export_quantization_bit
    if bits not in GPTQ_BITS:
        raise ExportError(f"export_quantization_bit: {bits} is not a GPTQ width; use one of "
                          f"{', '.join(map(str, GPTQ_BITS))}")
    if export_format != "hf":
        raise ExportError("export_quantization_bit: GPTQ writes a Hugging Face folder; set "
                          "export_format: hf (for GGUF use gguf_type: q8_0)")
    if not q.export_quantization_dataset or not Path(q.export_quantization_dataset).is_file():
        raise ExportError(f"export_quantization_dataset: {q.export_quantization_dataset!r} is "
                          "not a file; give calibration texts (e.g. data/c4_demo.jsonl)")
    missing = [p for p in GPTQ_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        raise ExportError(f"export_quantization_bit: needs the {' and '.join(missing)} "
                          f"package(s), not installed; pip install {' '.join(missing)} "
                          "(GPTQ calibration runs on a CUDA GPU)")


def calibration_texts(path: str, nsamples: int, seed: int = 0) -> list[str]:
    """`nsamples` texts from a .jsonl / .json (rows with "text") or .txt file."""
    p = Path(path)
    if p.suffix == ".txt":
        texts = [line for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    elif p.suffix == ".json":
        texts = [row["text"] for row in json.loads(p.read_text(encoding="utf-8"))]
    else:
        texts = []
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                row = json.loads(line)
                if "text" not in row:
                    raise ExportError(f"{p}:{n}: a calibration row needs a \"text\" field")
                texts.append(row["text"])
    if not texts:
        raise ExportError(f"export_quantization_dataset: {p} holds no text")
    random.Random(seed).shuffle(texts)
    return texts[:nsamples]


def quantize_folder(folder: Path, q: ExportQuantConfig, shard_gb: float) -> None:
    """Replace the weights in `folder` (a complete HF export) by their GPTQ quantisation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPTQConfig

    tok = AutoTokenizer.from_pretrained(folder)
    texts = [tok.decode(tok(t)["input_ids"][:q.export_quantization_maxlen])
             for t in calibration_texts(q.export_quantization_dataset,
                                        q.export_quantization_nsamples)]
    config = GPTQConfig(bits=q.export_quantization_bit, dataset=texts, tokenizer=tok)
    model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=config,
                                                 device_map="auto")
    for old in folder.glob("model*.safetensors*"):
        old.unlink()
    model.save_pretrained(folder, max_shard_size=f"{int(shard_gb * 1000)}MB")

"""`tunesmith export`: config -> base + adapters merged -> HF folder or GGUF (+ Modelfile).

Read top to bottom; every step is a call into the export layer. The whole export is
written into a hidden temporary folder renamed into place on success.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tunesmith.config.schema import Config
from tunesmith.errors import ConfigError
from tunesmith.export.card import render_card
from tunesmith.export.gptq import check_gptq, quantize_folder
from tunesmith.export.hf_folder import write_hf_folder
from tunesmith.export.merge import merge_adapters
from tunesmith.export.staging import check_export_dir, staged_dir

log = logging.getLogger(__name__)


def check_export_config(cfg: Config) -> Path:
    """Cross-key checks for `tunesmith export`; returns the export folder."""
    e = cfg.export
    if not cfg.model.model_name_or_path:
        raise ConfigError("model_name_or_path: not set; give the base model the adapters were "
                          "trained on, e.g. smollm2-135m-instruct")
    if e.export_legacy_format:
        raise ConfigError("export_legacy_format: true asks for pickle (.bin) weights, which "
                          "tunesmith does not write (loading them can run code); remove the key "
                          "or set it to false to get safetensors")
    return check_export_dir(e.export_dir, cfg.training.overwrite_output_dir)


def run_export(cfg: Config) -> Path:
    """Merge and write the export; returns the folder holding it."""
    out = check_export_config(cfg)
    e = cfg.export
    if e.export_format == "gguf":
        from tunesmith.export.gguf_file import check_gguf_supported

        check_gguf_supported(cfg.model)  # fail before the (long) merge
    quant = cfg.export_quant
    if quant.export_quantization_bit:
        check_gptq(quant, e.export_format)
    merged = merge_adapters(cfg.model, e.export_device)
    with staged_dir(out) as tmp:
        if e.export_format == "hf":
            files = write_hf_folder(merged, tmp, e.export_size)
            kind = "Hugging Face safetensors"
            if quant.export_quantization_bit:
                quantize_folder(tmp, quant, e.export_size)
                files = sorted(p.name for p in tmp.iterdir())
                kind = f"Hugging Face safetensors, GPTQ {quant.export_quantization_bit}-bit"
        else:
            from tunesmith.export.gguf_file import write_gguf
            from tunesmith.export.modelfile import write_modelfile

            gguf_path = write_gguf(merged, tmp, e.gguf_type)
            write_modelfile(merged, gguf_path)
            files = [gguf_path.name, "Modelfile"]
            kind = f"GGUF {e.gguf_type}"
        card = render_card(merged.base_name, merged.adapters, kind, files)
        (tmp / "README.md").write_text(card, encoding="utf-8")
    print(f"exported {kind} to {out}: {', '.join(files)}")
    return out

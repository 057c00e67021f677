"""GPTQ quantisation of an export (LLaMA-Factory's export_quantization_* keys)."""

from __future__ import annotations

from dataclasses import dataclass

from tunesmith.config.fields import opt


@dataclass
class ExportQuantConfig:
    export_quantization_bit: int = opt(
        0, "`tunesmith export`: quantise the merged model with GPTQ to this many bits (2, 3, "
        "4 or 8; 0: off). Needs the gptqmodel and optimum packages and, in practice, a GPU.",
        minimum=0, maximum=8, advanced=True)
    export_quantization_dataset: str = opt(
        "", "GPTQ calibration texts: a .jsonl/.json file of rows with a \"text\" field (e.g. "
        "LLaMA-Factory's data/c4_demo.jsonl), or a .txt file with one text per line.",
        advanced=True)
    export_quantization_nsamples: int = opt(128, "GPTQ: calibration samples.", minimum=1,
                                            advanced=True)
    export_quantization_maxlen: int = opt(1024, "GPTQ: tokens per calibration sample.",
                                          minimum=8, advanced=True)

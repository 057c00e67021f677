"""Write a merged model as one GGUF file (llama.cpp, Ollama) with the `gguf` package.

    merged model --state dict (ties removed)--> per tensor: name map, Q/K row order,
    dtype (1-D: f32; 2-D: f16 | bf16 | q8_0) --GGUFWriter--> header, metadata (hyper-
    parameters, tokenizer, chat template, special ids), tensor infos, tensor data
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tunesmith.config.schema import ModelConfig
from tunesmith.errors import ExportError
from tunesmith.export.gguf_arch import (
    ArchSpec,
    arch_spec,
    gguf_tensor_name,
    head_dim,
    llama3_rope_factors,
    prepare_tensor,
    rope_parameters,
)
from tunesmith.export.gguf_vocab import GGUFVocab, build_vocab
from tunesmith.export.hf_folder import unique_state_dict
from tunesmith.export.merge import MergedModel, load_base_config
from tunesmith.models.processor import is_vision_model, model_type_of

Q8_BLOCK = 32  # values per Q8_0 block; rows of other lengths fall back to f16


def check_gguf_supported(model_cfg: ModelConfig) -> None:
    """Fail before merging when the base cannot become a GGUF."""
    from tunesmith.models.provision import resolve_model_path

    path = resolve_model_path(model_cfg.model_name_or_path, model_cfg.cache_dir or None)
    if is_vision_model(path):
        raise ExportError(
            f"export_format: gguf cannot hold the vision-language model {path!r} "
            f"({model_type_of(path)}): llama.cpp runs such models as a language-model GGUF "
            "plus a separate mmproj GGUF for the vision tower, and tunesmith does not write "
            "mmproj files yet, so a GGUF alone would silently lose the vision tower; use "
            "export_format: hf")
    arch_spec(load_base_config(path, model_cfg.trust_remote_code))


def gguf_file_name(merged: MergedModel, gguf_type: str) -> str:
    source = merged.adapters[-1] if merged.adapters else merged.base_name
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(source.rstrip("/")).name).strip("-.")
    return f"{stem or 'model'}-{gguf_type}.gguf"


def encode_tensor(data: np.ndarray, gguf_type: str) -> tuple[np.ndarray, Any]:
    """(array to write, raw GGML type or None) for one tensor; 1-D tensors stay f32."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    if data.ndim == 1:
        return data.astype(np.float32), None
    if gguf_type == "bf16":
        return quantize(data, Q.BF16), Q.BF16
    if gguf_type == "q8_0" and data.shape[-1] % Q8_BLOCK == 0:
        return quantize(data, Q.Q8_0), Q.Q8_0
    return data.astype(np.float16), None


def _file_type(gguf_type: str) -> int:
    from gguf import LlamaFileType

    return {"f16": LlamaFileType.MOSTLY_F16, "bf16": LlamaFileType.MOSTLY_BF16,
            "q8_0": LlamaFileType.MOSTLY_Q8_0}[gguf_type]


def add_hyperparameters(writer: Any, config: Any, spec: ArchSpec, name: str,
                        gguf_type: str) -> None:
    from gguf import GGML_QUANT_VERSION

    writer.add_name(name)
    writer.add_file_type(_file_type(gguf_type))
    if gguf_type == "q8_0":
        writer.add_quantization_version(GGML_QUANT_VERSION)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None)
                             or config.num_attention_heads)
    rope = rope_parameters(config)
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    if rope.get("rope_type") == "linear":
        from gguf import RopeScalingType

        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    dim = head_dim(config)
    writer.add_rope_dimension_count(dim)
    if spec.gguf_arch == "qwen3" or dim != config.hidden_size // config.num_attention_heads:
        writer.add_key_length(dim)
        writer.add_value_length(dim)


def add_tokenizer(writer: Any, vocab: GGUFVocab, template: str) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    adders = {"bos": writer.add_bos_token_id, "eos": writer.add_eos_token_id,
              "unk": writer.add_unk_token_id, "pad": writer.add_pad_token_id}
    for key, token_id in vocab.special_ids.items():
        adders[key](token_id)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(vocab.add_eos)
    if template:
        writer.add_chat_template(template)


def add_tensors(writer: Any, model: torch.nn.Module, spec: ArchSpec, gguf_type: str) -> None:
    from tqdm.auto import tqdm

    config = model.config
    tensors = unique_state_dict(model)
    for hf_name, tensor in tqdm(tensors.items(), desc=f"converting to {gguf_type}",
                                unit="tensor"):
        name = gguf_tensor_name(hf_name)
        prepared = prepare_tensor(hf_name, tensor.detach().float().cpu(), spec, config)
        data, raw_type = encode_tensor(prepared.numpy(), gguf_type)
        if raw_type is None:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=raw_type)
    if rope_parameters(config).get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(config).numpy())


def write_gguf(merged: MergedModel, folder: Path, gguf_type: str) -> Path:
    """Write `<name>-<gguf_type>.gguf` into `folder` and return its path.

    Raises:
        ExportError: unsupported architecture, rotary scaling, tensor or tokenizer.
    """
    from gguf import GGUFWriter

    config = merged.model.config
    spec = arch_spec(config)
    vocab = build_vocab(merged.tokenizer, config.vocab_size)
    path = folder / gguf_file_name(merged, gguf_type)
    writer = GGUFWriter(str(path), spec.gguf_arch)
    try:
        add_hyperparameters(writer, config, spec, path.stem, gguf_type)
        add_tokenizer(writer, vocab, merged.template_source)
        add_tensors(writer, merged.model, spec, gguf_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file(progress=True)
    finally:
        writer.close()
    return path

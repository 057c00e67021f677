"""Write a merged model as a Hugging Face folder: sharded safetensors (+ index), config,
generation config, and the tokenizer carrying the chat template used in training."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tunesmith.export.merge import MergedModel
from tunesmith.models.processor import save_processor_files

GB = 1_000_000_000  # as in transformers' "5GB"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def unique_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict without the second name of tied tensors (the output head when it shares
    the embedding): transformers re-ties them on load from `tie_word_embeddings`."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr() + tensor.storage_offset() *
               tensor.element_size(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor
    return out


def plan_shards(sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    """Group tensor names into shards of at most `max_bytes` (a larger tensor sits alone)."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes.items():
        if shards[-1] and used + size > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def shard_names(count: int) -> list[str]:
    if count == 1:
        return [SINGLE_FILE]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def write_weights(tensors: dict[str, torch.Tensor], folder: Path, shard_gb: float,
                  dtype: torch.dtype) -> list[str]:
    """Save tensors (cast to `dtype`) as safetensors shards of at most `shard_gb` GB, with an
    index when there is more than one shard. Returns the weight file names."""
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if t.is_floating_point() else t

    sizes = {n: t.numel() * (dtype.itemsize if t.is_floating_point() else t.element_size())
             for n, t in tensors.items()}
    shards = plan_shards(sizes, max(1, int(shard_gb * GB)))
    names = shard_names(len(shards))
    weight_map: dict[str, str] = {}
    with tqdm(total=sum(sizes.values()), desc="writing safetensors", unit="B",
              unit_scale=True) as bar:
        for file_name, members in zip(names, shards, strict=True):
            part = {n: cast(tensors[n]).detach().to("cpu").contiguous() for n in members}
            save_file(part, str(folder / file_name), metadata={"format": "pt"})
            weight_map.update({n: file_name for n in members})
            bar.update(sum(sizes[n] for n in members))
    if len(names) > 1:
        index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
        (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return names


def write_tokenizer(merged: MergedModel, folder: Path) -> None:
    """The tokenizer, with the chat template the adapter was trained with."""
    if merged.template_source:
        merged.tokenizer.chat_template = merged.template_source
    merged.tokenizer.save_pretrained(str(folder))


def write_hf_folder(merged: MergedModel, folder: Path, shard_gb: float) -> list[str]:
    """Everything `AutoModelForCausalLM.from_pretrained(folder)` needs, offline."""
    model = merged.model
    files = write_weights(unique_state_dict(model), folder, shard_gb, merged.save_dtype)
    model.config.dtype = merged.save_dtype
    model.config.save_pretrained(str(folder))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(folder))
    write_tokenizer(merged, folder)
    save_processor_files(merged.base_path, folder)  # a vision-language model's processor
    return files

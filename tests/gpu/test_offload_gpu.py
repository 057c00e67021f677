"""Offloaded checkpointing on a GPU: the copies out run on a side stream (no host wait) and
the gradients equal recompute without offload."""

from __future__ import annotations

import pytest
import torch

from tiny import build_model
from tunesmith.models.acceleration import ActivationOffload, enable_checkpointing

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _grads(offload: bool) -> tuple[dict[str, torch.Tensor], ActivationOffload | None]:
    torch.manual_seed(0)
    model = build_model("llama").cuda()
    enable_checkpointing(model, "true")
    ids = torch.randint(0, 100, (2, 64), device="cuda")
    hooks = ActivationOffload(pin_memory=True) if offload else None
    if hooks is not None:
        with hooks:
            loss = model(input_ids=ids, labels=ids).loss
    else:
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}, hooks


def test_async_offload_equals_recompute():
    plain, _ = _grads(False)
    offloaded, hooks = _grads(True)
    # every GPU tensor went out asynchronously (CPU ones stay where they are)
    assert hooks.device_packed > 0 and hooks.async_copies == hooks.device_packed
    assert hooks.unpacked == hooks.packed
    for name, g in plain.items():
        torch.testing.assert_close(offloaded[name], g, msg=name)  # same math; SDPA's
        # backward may sum in another order between runs


def _lora_grads(to_host: bool):
    from peft import LoraConfig, get_peft_model

    from tunesmith.models.host_embedding import embedding_to_host

    torch.manual_seed(0)
    model = get_peft_model(build_model("llama", vocab_size=32000, hidden=256).cuda(),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    enable_checkpointing(model, "offload")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    host, _ = embedding_to_host(model, "offload") if to_host else (None, "")
    freed = before - torch.cuda.memory_allocated()
    ids_host = torch.randint(3, 32000, (2, 64)).pin_memory()
    ids = ids_host.to("cuda", non_blocking=True)
    with ActivationOffload(pin_memory=True):
        if host is not None:
            host.stage(ids_host, ids)
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return grads, host, freed


def test_host_embedding_frees_the_table_and_keeps_the_gradients():
    plain, _, _ = _lora_grads(False)
    moved, host, freed = _lora_grads(True)
    assert freed >= 32000 * 256 * 4  # the fp32 table left the GPU
    assert host.staged_hits == 1 and host.host_reads == 0
    assert plain.keys() == moved.keys() and plain
    for name, g in plain.items():
        torch.testing.assert_close(moved[name], g, msg=name)

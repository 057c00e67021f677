"""QLoRA (bitsandbytes 4-bit) and fp8 (torchao) on a CUDA GPU through tunesmith's loaders."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_qlora_4bit_trains_an_adapter(tmp_path, tiny_llama_dir):
    pytest.importorskip("bitsandbytes")
    import bitsandbytes as bnb

    from tunesmith.adapters.setup import prepare_trainable
    from tunesmith.config.schema import FinetuningConfig
    from tunesmith.models.load_options import LoadOptions
    from tunesmith.models.loader import load_causal_lm

    device = torch.device("cuda")
    model = load_causal_lm(str(tiny_llama_dir), dtype=torch.bfloat16, device=device,
                           opts=LoadOptions(quantization_bit=4))
    assert isinstance(model.model.layers[0].mlp.up_proj, bnb.nn.Linear4bit)
    model = prepare_trainable(model, FinetuningConfig(lora_rank=4), [])
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.arange(32, device=device)[None] % 100
    losses = []
    for _ in range(5):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    assert losses[-1] < losses[0]


def test_fp8_swaps_the_decoder_linears():
    pytest.importorskip("torchao")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("fp8 needs Hopper or newer")
    from tiny import build_model
    from tunesmith.models.fp8 import convert_to_fp8

    model = build_model(hidden=128).cuda()
    swapped = convert_to_fp8(model, torch.device("cuda"))
    assert swapped == 2 * 7  # q k v o gate up down in both layers; the head stays
    ids = torch.arange(64, device="cuda")[None] % 100
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)

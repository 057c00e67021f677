"""PiSSA, OFT, additional_target, create_new_adapter, LLaMA Pro and freeze_extra_modules:
each checked against PEFT's own result or the plain computation."""

from __future__ import annotations

import pytest
import torch

from tiny import build_model
from tunesmith.adapters.setup import prepare_trainable
from tunesmith.adapters.variants import llama_pro_layers
from tunesmith.config.method_keys import MethodConfig
from tunesmith.config.schema import FinetuningConfig
from tunesmith.errors import ConfigError


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.arange(10)[None] % 50
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_pissa_init_keeps_the_function_and_moves_the_principal_part():
    base = build_model(seed=1)
    ref = _logits(base)
    w = base.model.layers[0].self_attn.q_proj.weight.detach().clone()
    model = prepare_trainable(base, FinetuningConfig(lora_rank=4, lora_target=["q_proj"]), [],
                              MethodConfig(pissa_init=True, pissa_iter=-1))
    torch.testing.assert_close(_logits(model), ref, rtol=1e-4, atol=1e-4)  # W_res + BA = W
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    b = layer.lora_B["default"].weight
    assert b.abs().sum() > 0  # plain LoRA starts with B = 0
    s = torch.linalg.svdvals(w)[:4]
    ba = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight) * layer.scaling[
        "default"]
    torch.testing.assert_close(torch.linalg.svdvals(ba)[:4], s, rtol=1e-3, atol=1e-4)


def test_oft_adapts_the_targets_through_peft():
    from peft.tuners.oft import OFTLayer

    model = prepare_trainable(build_model(), FinetuningConfig(finetuning_type="oft"), [],
                              MethodConfig(oft_block_size=16, oft_target=["v_proj", "o_proj"]))
    adapted = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, OFTLayer)}
    assert adapted == {"v_proj", "o_proj"}
    assert all("oft" in n for n, p in model.named_parameters() if p.requires_grad)
    with pytest.raises(ConfigError, match="exactly one"):
        prepare_trainable(build_model(), FinetuningConfig(finetuning_type="oft"), [],
                          MethodConfig(oft_rank=4, oft_block_size=16))


def test_additional_target_trains_and_saves_the_module(tmp_path):
    model = prepare_trainable(build_model(), FinetuningConfig(lora_rank=4), [],
                              MethodConfig(additional_target=["embed_tokens"]))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any("embed_tokens.modules_to_save" in n for n in trainable)
    model.save_pretrained(tmp_path)
    from safetensors.torch import load_file

    assert any("embed_tokens" in k for k in load_file(tmp_path / "adapter_model.safetensors"))


def test_create_new_adapter_merges_the_old_one(tmp_path):
    first = prepare_trainable(build_model(), FinetuningConfig(lora_rank=4), [])
    for n, p in first.named_parameters():
        if "lora_B" in n:
            p.data.normal_()
    first.save_pretrained(tmp_path / "a")
    merged_ref = _logits(first)
    model = prepare_trainable(build_model(), FinetuningConfig(lora_rank=4), [str(tmp_path / "a")],
                              MethodConfig(create_new_adapter=True))
    torch.testing.assert_close(_logits(model), merged_ref, rtol=1e-4, atol=1e-4)
    assert all(float(p.abs().sum()) == 0 for n, p in model.named_parameters() if "lora_B" in n)
    kept = prepare_trainable(build_model(), FinetuningConfig(lora_rank=4), [str(tmp_path / "a")])
    assert any(float(p.abs().sum()) > 0 for n, p in kept.named_parameters() if "lora_B" in n)


def test_llama_pro_trains_every_stride_th_layer():
    assert llama_pro_layers(8, 2) == {3, 7}
    assert llama_pro_layers(6, 3) == {1, 3, 5}
    with pytest.raises(ConfigError, match="divide"):
        llama_pro_layers(8, 3)
    model = prepare_trainable(build_model(layers=4), FinetuningConfig(
        finetuning_type="freeze", freeze_trainable_layers=2), [], MethodConfig(use_llama_pro=True))
    layers = {int(n.split(".")[2]) for n, p in model.named_parameters() if p.requires_grad}
    assert layers == {1, 3}


def test_freeze_extra_modules_adds_non_layer_modules():
    model = prepare_trainable(build_model(), FinetuningConfig(
        finetuning_type="freeze", freeze_trainable_layers=1), [],
        MethodConfig(freeze_extra_modules=["embed_tokens", "norm"]))
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "model.embed_tokens.weight" in names and "model.norm.weight" in names
    assert not any(".layers.0." in n for n in names)
    with pytest.raises(ConfigError, match="choose among"):
        prepare_trainable(build_model(), FinetuningConfig(finetuning_type="freeze"), [],
                          MethodConfig(freeze_extra_modules=["vision_tower"]))


def test_method_keys_of_another_finetuning_type_fail():
    with pytest.raises(ConfigError, match="pissa_init: needs finetuning_type lora"):
        prepare_trainable(build_model(), FinetuningConfig(finetuning_type="full"), [],
                          MethodConfig(pissa_init=True))
    with pytest.raises(ConfigError, match="use_llama_pro: needs finetuning_type freeze"):
        prepare_trainable(build_model(), FinetuningConfig(), [], MethodConfig(use_llama_pro=True))

"""The fused LoRA SwiGLU MLP (kernels/lora_mlp.py): same loss and gradients as PEFT's layers,
less kept for backward, refused where it does not apply, and reachable from the CLI."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import yaml
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from tunesmith.cli.main import main
from tunesmith.kernels.fused import LORA_MLP_CALLS, FusedSwiGLUMLP, fuse_lora_mlps, restore_mlps
from tunesmith.kernels.lora_mlp import lora_parts

HIDDEN, INTER, RANK = 64, 160, 8


def _lora_model(seed: int = 0, **lora) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = Qwen2Config(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    model = get_peft_model(Qwen2ForCausalLM(cfg), LoraConfig(
        r=RANK, lora_alpha=16, target_modules="all-linear", **{"lora_dropout": 0.0, **lora}))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero; make the adapters act
            torch.nn.init.normal_(p, std=0.1)
    return model


def _grads(model, ids) -> tuple[float, dict[str, torch.Tensor]]:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()
                         if p.requires_grad}


@pytest.mark.parametrize("pack,chunks", [(True, 1), (False, 1), (True, 5)])
def test_fused_matches_peft_loss_and_every_adapter_gradient(pack, chunks):
    ref = _lora_model()
    fused = copy.deepcopy(ref)
    assert fuse_lora_mlps(fused, pack=pack, backward_chunks=chunks) == 2
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    LORA_MLP_CALLS.clear()
    loss_ref, grads_ref = _grads(ref, ids)
    loss_fused, grads_fused = _grads(fused, ids)
    # the fused path ran in both layers, packed (gate|up one GEMM) or not
    assert LORA_MLP_CALLS["packed" if pack else "eager"] == 2
    assert LORA_MLP_CALLS["eager" if pack else "packed"] == 0
    assert loss_fused == pytest.approx(loss_ref, rel=1e-6)
    assert grads_ref.keys() == grads_fused.keys()
    for name, g in grads_ref.items():
        torch.testing.assert_close(grads_fused[name], g, rtol=1e-4, atol=1e-6, msg=name)
    # saved adapters keep PEFT's names
    assert set(fused.state_dict()) == set(ref.state_dict())


def _saved_bytes(mlp: torch.nn.Module, x: torch.Tensor) -> int:
    params = {p.untyped_storage().data_ptr() for p in mlp.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = mlp(x)
    y.sum().backward()
    return sum(seen.values())


@pytest.mark.parametrize("pack", [True, False])
def test_backward_keeps_inputs_gate_and_up_only(pack):
    model = _lora_model()
    mlp = model.get_base_model().model.layers[0].mlp
    fused = FusedSwiGLUMLP(copy.deepcopy(mlp), use_liger=False, fuse_lora=True)
    assert fused.pack() if pack else fused.packed_gate_up is None
    x = torch.randn(3, 16, HIDDEN, requires_grad=True)
    tokens, f32 = 3 * 16, 4
    kept = _saved_bytes(fused, x)
    # x, gate, up and the three rank-r products; nothing [tokens, INTER] besides gate and up
    assert kept == tokens * f32 * (HIDDEN + 2 * INTER + 3 * RANK)
    assert _saved_bytes(mlp, x) >= kept + tokens * f32 * INTER  # PEFT keeps h as well


def _layer_saved_bytes(layer: torch.nn.Module, x: torch.Tensor, rotary) -> int:
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr != x.untyped_storage().data_ptr():
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    pos = torch.arange(x.shape[1])[None]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = layer(x, position_embeddings=rotary(x, pos), position_ids=pos)
    (y[0] if isinstance(y, tuple) else y).sum().backward()
    return sum(seen.values())


def test_packed_mlp_runs_the_post_attention_norm_and_keeps_the_residual():
    """The decoder layer's post-attention RMSNorm runs inside the packed function: the layer
    passes the residual through (NormInMLP), backward keeps that residual and a [tokens, 1]
    rstd where it kept the normed x, and every gradient stays PEFT's."""
    ref = _lora_model()
    fused = copy.deepcopy(ref)
    fuse_lora_mlps(fused)
    layer = fused.get_base_model().model.layers[0]
    assert type(layer.post_attention_layernorm).__name__ == "NormInMLP"
    assert layer.post_attention_layernorm.weight is layer.mlp.deferred_norm[0].weight
    x = torch.randn(3, 16, HIDDEN, requires_grad=True)
    rotary = fused.get_base_model().model.rotary_emb
    LORA_MLP_CALLS.clear()
    deferred = _layer_saved_bytes(layer, x, rotary)
    layer.mlp.restore_norm()  # still packed, the norm in the layer again
    assert type(layer.post_attention_layernorm).__name__ == "Qwen2RMSNorm"
    in_layer = _layer_saved_bytes(layer, x, rotary)
    assert LORA_MLP_CALLS["packed"] == 2
    tokens, f32 = 3 * 16, 4
    # in the layer: the norm kept its input (the residual) and rstd, the MLP the normed x
    assert in_layer - deferred == tokens * f32 * HIDDEN


def test_mlp_paths_off_the_packed_function_still_run_the_norm():
    """Adapters disabled (a reference pass of preference training), the MLP's own path
    applies the deferred norm: the same logits as the unfused model."""
    ref = _lora_model()
    fused = copy.deepcopy(ref)
    fuse_lora_mlps(fused)
    ids = torch.randint(0, 128, (2, 8))
    with ref.disable_adapter(), fused.disable_adapter():
        torch.testing.assert_close(fused(input_ids=ids).logits, ref(input_ids=ids).logits)


@pytest.mark.parametrize("change", ["dropout", "dora", "merged", "disabled", "not_lora"])
def test_non_plain_lora_keeps_the_modules_forward(change):
    model = _lora_model(**({"lora_dropout": 0.1} if change == "dropout" else
                           {"use_dora": True} if change == "dora" else {}))
    model.eval()  # dropout off for the comparison (it still makes the layer non-plain)
    mlp = model.get_base_model().model.layers[0].mlp
    if change == "merged":
        mlp.gate_proj.merge()
    if change == "disabled":
        mlp.up_proj.enable_adapters(False)
    if change == "not_lora":
        mlp.down_proj = mlp.down_proj.base_layer
    assert lora_parts(mlp.gate_proj) is None or lora_parts(mlp.up_proj) is None \
        or lora_parts(mlp.down_proj) is None
    wrapped = FusedSwiGLUMLP(mlp, use_liger=False, fuse_lora=True)
    LORA_MLP_CALLS.clear()
    x = torch.randn(2, 5, HIDDEN)
    gate, up = mlp.gate_proj(x), mlp.up_proj(x)
    torch.testing.assert_close(wrapped(x), mlp.down_proj(torch.nn.functional.silu(gate) * up))
    assert LORA_MLP_CALLS["eager"] == 0


class _WidestRows(torch.utils._python_dispatch.TorchDispatchMode):
    """The most rows of any [rows, INTER] tensor an op makes."""

    def __init__(self):
        super().__init__()
        self.rows = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[1] == INTER:
                self.rows = max(self.rows, t.shape[0])
        return out


@pytest.mark.parametrize("chunks", [1, 4])
def test_backward_in_token_blocks_holds_a_block_of_intermediates(chunks):
    """In blocks, the backward's [tokens, I] temporaries (dh, h, d_gate, d_up) are made for
    one block of tokens at a time."""
    model = _lora_model()
    fuse_lora_mlps(model, backward_chunks=chunks)
    mlp = model.get_base_model().model.layers[0].mlp
    out = mlp(torch.randn(2, 24, HIDDEN, requires_grad=True))  # 48 tokens; RANK rows < 12
    with _WidestRows() as widest:
        out.sum().backward()
    assert widest.rows == 48 // chunks


@pytest.mark.parametrize("mode,chunks", [("false", 1), ("selective", 1), ("true", 4),
                                         ("offload", 4)])
def test_recompute_modes_run_the_mlp_backward_in_blocks(mode, chunks):
    from tunesmith.models.acceleration import apply_fused_lora_mlp

    model = _lora_model()
    n, reason = apply_fused_lora_mlp(model, "auto", "lora", "", mode)
    mlps = [layer.mlp for layer in model.get_base_model().model.layers]
    assert n == 2 and [m.backward_chunks for m in mlps] == [chunks, chunks]
    assert ("token blocks" in reason) == (chunks > 1)


def test_traces_as_one_graph():
    fused = copy.deepcopy(_lora_model())
    fuse_lora_mlps(fused)
    mlp = fused.get_base_model().model.layers[0].mlp
    x = torch.randn(2, 8, HIDDEN, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(mlp, backend="aot_eager", fullgraph=True)  # a break would raise
    compiled(x).sum().backward()
    grad = x.grad.clone()
    x.grad = None
    mlp(x).sum().backward()
    torch.testing.assert_close(grad, x.grad)
    torch._dynamo.reset()


def _train(tmp_path, model_dir, data, rc: int = 0, **keys) -> dict:
    cfg = {"model_name_or_path": str(model_dir), "dataset": str(data),
           "output_dir": str(tmp_path / "out"), "overwrite_output_dir": True, "max_steps": 2,
           "per_device_train_batch_size": 2, "cutoff_len": 64, "learning_rate": 1e-3,
           "logging_steps": 1, "save_steps": 0, "plot_loss": False, "finetuning_type": "lora",
           "lora_target": "all", **keys}
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == rc
    return json.loads((tmp_path / "out" / "run_summary.json").read_text()) if rc == 0 else {}


def test_cli_auto_fuses_and_false_does_not(tmp_path, tiny_qwen2_dir, alpaca_file):
    on = _train(tmp_path / "on", tiny_qwen2_dir, alpaca_file)
    off = _train(tmp_path / "off", tiny_qwen2_dir, alpaca_file, fused_lora_mlp="false")
    assert on["speed"]["fused_lora_mlps"] == 2
    assert on["speed"]["fused_lora_mlp_calls"] >= 2 * 2  # layers x steps
    assert on["speed"]["packed_gate_up_calls"] == on["speed"]["fused_lora_mlp_calls"]
    assert off["speed"]["fused_lora_mlps"] == 0 and off["speed"]["fused_lora_mlp_calls"] == 0
    assert on["final_loss"] == pytest.approx(off["final_loss"], rel=1e-4)


def test_cli_true_says_why_it_cannot(tmp_path, tiny_qwen2_dir, alpaca_file, capsys):
    _train(tmp_path, tiny_qwen2_dir, alpaca_file, rc=1, fused_lora_mlp="true", lora_dropout=0.1)
    err = capsys.readouterr().err
    assert "fused_lora_mlp: true cannot be applied" in err and "lora_dropout 0" in err


def test_restore_puts_the_models_own_mlps_back():
    model = _lora_model()
    ids = torch.randint(0, 128, (1, 8))
    before = model(input_ids=ids).logits
    assert fuse_lora_mlps(model) == 2
    assert restore_mlps(model) == 2
    layers = model.get_base_model().model.layers
    assert all(type(layer.mlp).__name__ == "Qwen2MLP" for layer in layers)
    assert all(type(layer.post_attention_layernorm).__name__ == "Qwen2RMSNorm"
               for layer in layers)  # and the norm the packed MLP ran
    assert lora_parts(layers[0].mlp.gate_proj) is not None  # the LoRA layers moved back too
    torch.testing.assert_close(model(input_ids=ids).logits, before)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_packed_weights_are_views_of_their_buffers():
    model = _lora_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert fuse_lora_mlps(model) == 2
    for layer in model.get_base_model().model.layers:
        mlp = layer.mlp
        packed = mlp.packed_gate_up
        gate_w, up_w = mlp.gate_proj.base_layer.weight, mlp.up_proj.base_layer.weight
        # no second copy: both base weights live in the packed buffer
        assert _storage(gate_w) == _storage(up_w) == _storage(packed)
        assert packed.shape == (2 * INTER, HIDDEN + 2 * RANK)
        torch.testing.assert_close(packed[:INTER, HIDDEN:HIDDEN + RANK],
                                   mlp.gate_proj.lora_B["default"].weight.detach())
        assert not packed[:INTER, HIDDEN + RANK:].any()  # the off-diagonal blocks stay zero
        down_w = mlp.down_proj.base_layer.weight  # rows [:HIDDEN] of [HIDDEN + r, INTER]
        assert _storage(down_w) == _storage(mlp.packed_down) and down_w.is_contiguous()
        torch.testing.assert_close(mlp.packed_down[HIDDEN:],
                                   mlp.down_proj.lora_A["default"].weight.detach())
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()  # same parameters, same values
    for name, value in before.items():
        torch.testing.assert_close(after[name].detach(), value, rtol=0, atol=0, msg=name)
    assert "packed_gate_up" not in " ".join(model.state_dict())


def test_packed_path_follows_the_adapters_after_an_optimizer_step():
    ref = _lora_model()
    fused = copy.deepcopy(ref)
    fuse_lora_mlps(fused)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(2))
    for model in (ref, fused):
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
        for _ in range(2):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    # B moved; the packed buffer's B columns must have followed it
    torch.testing.assert_close(fused(input_ids=ids, labels=ids).loss,
                               ref(input_ids=ids, labels=ids).loss, rtol=1e-5, atol=1e-6)


def test_two_passes_then_one_backward():
    """Two forward passes before one backward (chosen and rejected in separate passes):
    the refresh of the second pass must not invalidate the first pass's saved buffer."""
    ref = _lora_model()
    fused = copy.deepcopy(ref)
    fuse_lora_mlps(fused)
    a, b = (torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(s))
            for s in (3, 4))
    grads = []
    for model in (ref, fused):
        (model(input_ids=a, labels=a).loss - model(input_ids=b, labels=b).loss).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_packed_model_merges_and_restores_to_contiguous_weights():
    ref = _lora_model()
    fused = copy.deepcopy(ref)
    fuse_lora_mlps(fused)
    ids = torch.randint(0, 128, (1, 8))
    expected = ref(input_ids=ids).logits
    merged = copy.deepcopy(fused).merge_and_unload()  # PEFT's merge writes the base weights
    torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-5)
    assert restore_mlps(fused) == 2
    for layer in fused.get_base_model().model.layers:
        gate_w, up_w = layer.mlp.gate_proj.base_layer.weight, layer.mlp.up_proj.base_layer.weight
        down_w = layer.mlp.down_proj.base_layer.weight
        assert gate_w.is_contiguous() and up_w.is_contiguous()
        assert len({_storage(gate_w), _storage(up_w), _storage(down_w)}) == 3
        assert down_w.untyped_storage().nbytes() == down_w.numel() * down_w.element_size()
    torch.testing.assert_close(fused(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-6)


def _scale_adapters(model, factor: float) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.mul_(factor)


def test_a_deep_copy_refreshes_its_own_buffers():
    """A copy made after fusing (a frozen reference model, a snapshot) is refreshed from its
    own adapters; the original's buffers follow the original's."""
    ref = _lora_model()
    fused = copy.deepcopy(ref)
    fuse_lora_mlps(fused)
    twin = copy.deepcopy(fused)
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(5))
    for model in (ref, twin):
        _scale_adapters(model, 1.5)
    torch.testing.assert_close(twin(input_ids=ids).logits, ref(input_ids=ids).logits,
                               rtol=1e-4, atol=1e-5)
    base = copy.deepcopy(ref)  # fused still holds the unscaled adapters
    _scale_adapters(base, 1 / 1.5)
    torch.testing.assert_close(fused(input_ids=ids).logits, base(input_ids=ids).logits,
                               rtol=1e-4, atol=1e-5)


def test_mlps_outside_the_refreshed_decoder_stay_unpacked():
    model = _lora_model()
    base = model.get_base_model()
    layers = base.model.layers
    base.get_decoder = lambda: layers[1]  # the hook would never see layer 0's pass
    assert fuse_lora_mlps(model) == 2
    assert layers[0].mlp.packed_gate_up is None and layers[0].mlp.packed_down is None
    assert layers[1].mlp.packed_gate_up is not None
    assert layers[0].mlp.gate_proj.base_layer.weight.is_contiguous()

"""liger-kernel's path on a CPU machine (the package is in the dev extra): the swap selects
it, calls liger's autograd functions with arguments their signatures accept, matches the
reference numerics, and `enable_liger_kernel` reaches it through the CLI. Its Triton
kernels themselves need a GPU (tests/gpu/test_gpu_paths.py): they do not run under
TRITON_INTERPRET=1 (liger 0.8.5 calls .to() on scalar arguments the interpreter passes as
Python floats)."""

from __future__ import annotations

import inspect
import logging

import pytest
import torch
import torch.nn.functional as F

from tiny import build_model
from tunesmith.cli.main import main
from tunesmith.kernels import fused


class _Spy:
    """Stands in for a liger autograd function: records the arguments, computes the
    reference result."""

    def __init__(self, real, reference):
        self.real, self.reference, self.calls = real, reference, []

    def apply(self, *args):
        self.calls.append(args)
        return self.reference(*args)


def test_liger_is_installed_and_selected():
    ops = fused.liger_ops()
    assert ops is not None, "liger-kernel missing: pip install -e '.[dev]'"
    model = build_model("llama").eval()
    assert fused.swap_fused_modules(model, use_liger=True) == 2 * 3 + 1
    swapped = [m for m in model.modules() if isinstance(m, fused.FusedRMSNorm | fused.FusedSwiGLUMLP)]
    assert len(swapped) == 7 and all(m.use_liger for m in swapped)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_liger_calls_match_its_signatures_and_the_reference(arch, monkeypatch):
    real = fused.liger_ops()
    spies = {"rms_norm": _Spy(real["rms_norm"], lambda x, w, eps, *rest:
                               fused.rms_norm_reference(x, w, eps)),
             "silu_mul": _Spy(real["silu_mul"], lambda a, b: F.silu(a) * b)}
    model = build_model(arch).eval()
    ids = torch.randint(3, 300, (2, 10))
    with torch.no_grad():
        ref = model(ids).logits
        fused.swap_fused_modules(model, use_liger=True)
        monkeypatch.setattr(fused, "liger_ops", lambda: spies)
        monkeypatch.setattr(fused, "liger_runs_on", lambda x: True)  # as on a GPU
        out = model(ids).logits
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert len(spies["rms_norm"].calls) == 2 * 2 + 1 and len(spies["silu_mul"].calls) == 2
    for spy in spies.values():
        forward = inspect.signature(spy.real.forward)
        for args in spy.calls:
            bound = forward.bind(None, *args)  # raises if liger's signature moved
            if spy is spies["rms_norm"]:
                assert bound.arguments["casting_mode"] == "llama"
                assert bound.arguments["in_place"] is False


def test_enable_liger_kernel_through_the_cli(tmp_path, tiny_llama_dir, alpaca_file, caplog):
    with caplog.at_level(logging.INFO):
        assert main(["train", f"model_name_or_path={tiny_llama_dir}", f"dataset={alpaca_file}",
                     f"output_dir={tmp_path / 'run'}", "max_steps=1", "save_steps=0",
                     "enable_liger_kernel=true"]) == 0
    assert "fused kernels: 7 module(s) swapped (liger-kernel on GPU tensors)" in caplog.text

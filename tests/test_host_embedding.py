"""gradient_checkpointing: offload keeps a frozen, untied input embedding in host memory:
same outputs and gradients, the staged rows used only for the ids they were gathered for,
and the cases that must keep the table on the device."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from tiny import build_model
from tunesmith.models.acceleration import activation_offload, enable_checkpointing
from tunesmith.models.host_embedding import HostEmbedding, embedding_to_host
from tunesmith.models.neftune import add_neftune


def _lora(tie: bool = False):
    torch.manual_seed(0)
    return get_peft_model(build_model("llama", tie=tie),
                          LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


def test_staged_rows_serve_only_their_own_ids():
    emb = torch.nn.Embedding(50, 8)
    ref = emb.weight.detach().clone()
    host = HostEmbedding(emb, torch.device("cpu"))
    a, b = torch.randint(0, 50, (2, 5)), torch.randint(0, 50, (2, 5))
    host.stage(a, a)
    torch.testing.assert_close(host(a), ref[a], rtol=0, atol=0)
    assert (host.staged_hits, host.host_reads) == (1, 0)
    host.stage(a, a)  # staged for a, called with other ids of the same shape: b's rows
    torch.testing.assert_close(host(b), ref[b], rtol=0, atol=0)
    assert host.staged_hits == 1
    torch.testing.assert_close(host(a), ref[a], rtol=0, atol=0)  # used once only
    assert host.staged_hits == 1


def test_offload_training_on_the_host_table_gives_the_same_gradients():
    ids = torch.randint(3, 300, (2, 12))

    def grads(to_host: bool):
        model = _lora()
        enable_checkpointing(model, "offload")
        host, reason = embedding_to_host(model, "offload") if to_host else (None, "")
        model.train()
        with activation_offload("offload", torch.device("cpu")):
            if host is not None:
                host.stage(ids, ids)
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, host, \
            reason

    ref, _, _ = grads(False)
    got, host, reason = grads(True)
    assert isinstance(host, HostEmbedding) and reason.startswith("in host memory")
    assert host.staged_hits == 1 and host.weight.device.type == "cpu"
    assert ref.keys() == got.keys() and ref
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-6)


def test_the_table_stays_in_host_memory_when_the_model_moves():
    model = _lora()
    host, _ = embedding_to_host(model, "offload")
    model.to("meta")  # a move of the whole model leaves the table alone
    assert host.weight.device.type == "cpu" and host.weight.abs().sum() > 0
    assert model.get_base_model().lm_head.weight.device.type == "meta"


@pytest.mark.parametrize("case,expected", [
    ("mode", "gradient_checkpointing: true"),
    ("tied", "tied to the output head"),
    ("trained", "is trained"),
    ("sharded", "distributed training"),
])
def test_the_table_stays_on_the_device_where_it_must(case, expected):
    model = _lora(tie=case == "tied")
    if case == "trained":
        model.get_base_model().get_input_embeddings().weight.requires_grad_(True)
    host, reason = embedding_to_host(model, "true" if case == "mode" else "offload",
                                     sharded=case == "sharded")
    assert host is None and expected in reason, reason
    assert type(model.get_base_model().get_input_embeddings()) is torch.nn.Embedding


def test_hooks_on_the_embedding_keep_running():
    """NEFTune's noise (a forward hook) applies to the host table's output too."""
    model = _lora()
    add_neftune(model, 5.0)
    host, _ = embedding_to_host(model, "offload")
    ids = torch.randint(3, 300, (1, 6))
    model.train()
    clean = host.weight[ids]
    assert not torch.allclose(host(ids), clean)  # noise added by the moved hook
    model.eval()
    torch.testing.assert_close(host(ids), clean)


def test_the_benchmark_harness_puts_the_table_back():
    from tunesmith.models.host_embedding import embedding_to_device

    model = _lora()
    before = model.get_base_model().get_input_embeddings().weight.detach().clone()
    embedding_to_host(model, "offload")
    assert embedding_to_device(model) and not embedding_to_device(model)
    emb = model.get_base_model().get_input_embeddings()
    assert type(emb) is torch.nn.Embedding and not emb.weight.requires_grad
    torch.testing.assert_close(emb.weight, before, rtol=0, atol=0)

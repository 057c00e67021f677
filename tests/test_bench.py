"""The benchmark's systems compute the same training step: on a tiny CPU model tunesmith's
step and the HF+PEFT peer's give the same losses, padded or packed."""

from __future__ import annotations

import math

import pytest
import torch

from tunesmith.benchmarks.training import Case, run_case
from tunesmith.benchmarks.workloads import build_model


@pytest.mark.parametrize("workload", ["W1", "W2"])
def test_tunesmith_and_peer_agree(tmp_path, workload):
    base = build_model("tiny", torch.device("cpu"), torch.float32)
    common = dict(workload=workload, checkpointing="false", seq_len=128, micro_batch=4)
    ours = run_case(base, Case(system="tunesmith", packed=workload == "W2", **common), 2, 2,
                    tmp_path)
    peer = run_case(base, Case(system="hf+peft", **common), 2, 2, tmp_path)
    assert not ours.error and not peer.error, (ours.error, peer.error)
    assert ours.tokens_per_s > 0 and math.isfinite(ours.final_loss)
    if workload == "W1":  # same batches: same losses, step after step
        assert ours.first_loss == pytest.approx(peer.first_loss, rel=1e-5)
        assert ours.final_loss == pytest.approx(peer.final_loss, rel=1e-4)
    else:  # packing leaves no padding; the peer pads every batch to its longest sample
        assert ours.padding_share < 0.05 < peer.padding_share

"""Per-completion quantities of a preference batch from one trunk forward: summed token
log-probabilities (through the chunked linear path, no full logits) or the last token's
hidden state (reward models)."""

from __future__ import annotations

import torch

from tunesmith.data.preference_batch import PreferenceBatch
from tunesmith.kernels.linear_logprob import chunked_token_logprobs, token_logprobs_reference
from tunesmith.models.loader import split_causal_lm
from tunesmith.train.objective import auto_chunk_rows, trunk_inputs


def trunk_hidden(model: torch.nn.Module, batch: PreferenceBatch) -> torch.Tensor:
    """Final hidden states flattened over the batch: [B*T, H]."""
    trunk, _ = split_causal_lm(model)
    out = trunk(input_ids=batch.input_ids, use_cache=False, **trunk_inputs(batch, trunk))
    hidden = out.last_hidden_state  # [B, T, H]
    return hidden.reshape(-1, hidden.shape[-1])


def completion_logps(model: torch.nn.Module, batch: PreferenceBatch, impl: str = "chunked",
                     chunk_size: int = 0) -> torch.Tensor:
    """Sum of the trained tokens' log-probabilities of every completion: [S] float32."""
    _, head = split_causal_lm(model)
    rows = trunk_hidden(model, batch).index_select(0, batch.target_index)  # [K, H]
    if getattr(head, "bias", None) is not None or impl == "reference":
        if getattr(head, "bias", None) is not None:
            logits = head(rows).float()
            tok = logits.log_softmax(-1).gather(1, batch.target_ids[:, None]).squeeze(1)
        else:
            tok = token_logprobs_reference(rows, head.weight, batch.target_ids)
    else:
        chunk = chunk_size or auto_chunk_rows(head.weight.shape[0])
        tok = chunked_token_logprobs(rows, head.weight, batch.target_ids, chunk)
    sums = torch.zeros(batch.n_seqs, dtype=torch.float32, device=tok.device)
    return sums.index_add(0, batch.seq_index, tok)  # [S]

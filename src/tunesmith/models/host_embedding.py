"""`gradient_checkpointing: offload` keeps a frozen input embedding table in host memory.

The table of a large-vocabulary model is big and idle: Qwen2.5-7B's is 152,064 x 3,584 in
bf16, 1.09 GB of GPU memory that each step reads 8,192 rows of (59 MB). In the memory-first
mode the table stays in host memory instead; the loop hands each micro-batch's token ids to
`HostEmbedding.stage` while they are still on the host, the rows are gathered there into
pinned memory and copied to the GPU on a side stream, and the embedding's forward returns
them. A forward whose ids were not staged (evaluation, generation) reads the ids back and
gathers the same way: slower, never wrong.

Only where it cannot change the results: the table is frozen, not tied to the output head,
a plain `nn.Embedding`, and one process owns the model (DDP, FSDP and DeepSpeed manage
device placement of every parameter themselves)."""

from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger(__name__)


class HostEmbedding(nn.Embedding):
    """An `nn.Embedding` whose table lives in host memory and whose output lands on
    `device`. Moving the model (`.to`, `.cuda`) leaves the table where it is."""

    def __init__(self, source: nn.Embedding, device: torch.device):
        nn.Module.__init__(self)  # no table allocation: the source's is moved below
        self.num_embeddings, self.embedding_dim = source.num_embeddings, source.embedding_dim
        self.padding_idx, self.max_norm = source.padding_idx, source.max_norm
        self.norm_type, self.scale_grad_by_freq = source.norm_type, source.scale_grad_by_freq
        self.sparse = source.sparse
        self.weight = nn.Parameter(source.weight.detach().to("cpu"), requires_grad=False)
        self.device = device
        self.staged_hits = 0  # forwards served from rows gathered before the batch moved
        self.host_reads = 0  # forwards that read device ids back first (evaluation, ...)
        self._staged: tuple[torch.Tensor, torch.Tensor, torch.cuda.Event | None] | None = None
        self._side: torch.cuda.Stream | None = None
        _move_hooks(source, self)  # NEFTune's noise, input-grad hooks keep running

    def _apply(self, fn, recurse=True):  # noqa: ARG002 - the table stays in host memory
        return self

    def _gather(self, host_ids: torch.Tensor) -> torch.Tensor:
        pinned = self.device.type == "cuda"
        out = torch.empty((*host_ids.shape, self.embedding_dim), dtype=self.weight.dtype,
                          pin_memory=pinned)
        torch.index_select(self.weight, 0, host_ids.reshape(-1),
                           out=out.view(-1, self.embedding_dim))
        return out

    def _to_device(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        if self.device.type != "cuda":
            return rows.to(self.device), None
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        self._side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._side):
            moved = rows.to(self.device, non_blocking=True)
        done = torch.cuda.Event()
        done.record(self._side)
        return moved, done

    def stage(self, host_ids: torch.Tensor, device_ids: torch.Tensor) -> None:
        """Gather the rows of `host_ids` now; the forward that receives `device_ids` (the
        same ids on the device, this very tensor) returns them."""
        moved, done = self._to_device(self._gather(host_ids))
        self._staged = (device_ids, moved, done)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        staged, self._staged = self._staged, None
        if staged is not None and staged[0] is input_ids:
            self.staged_hits += 1
            _, rows, done = staged
        else:
            if input_ids.device.type != "cpu":
                self.host_reads += 1
            rows, done = self._to_device(self._gather(input_ids.cpu()))
        if done is not None:  # copied on the side stream: used (and freed) on this one
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(done)
            rows.record_stream(stream)
        return rows


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
               "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")


def _move_hooks(source: nn.Module, target: nn.Module) -> None:
    """The forward hooks registered on `source` (with their flags) now run on `target`."""
    for name in _HOOK_DICTS:
        if hasattr(source, name) and hasattr(target, name):
            getattr(target, name).update(getattr(source, name))


def _base(model: nn.Module) -> nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def host_embedding_blocker(model: nn.Module, checkpointing: str, sharded: bool,
                           vision: bool) -> str:
    """Why the input embedding must stay on the device ("" when it may move to the host)."""
    if checkpointing != "offload":
        return f"gradient_checkpointing: {checkpointing} (only offload parks it)"
    if sharded:
        return "distributed training places every parameter itself"
    if vision:
        return "vision-language model"
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if type(emb) is not nn.Embedding:
        return f"the input embedding is a {type(emb).__name__}, not a plain nn.Embedding"
    if emb.weight.requires_grad:
        return "the input embedding is trained"
    if emb.max_norm is not None:
        return "the embedding renormalises rows (max_norm)"
    if head is not None and head.weight.data_ptr() == emb.weight.data_ptr():
        return "the input embedding is tied to the output head"
    return ""


def embedding_to_host(model: nn.Module, checkpointing: str, sharded: bool = False,
                      vision: bool = False) -> tuple[HostEmbedding | None, str]:
    """Move the frozen input embedding table to host memory where that is safe; returns the
    new module (None when it stayed) and the reason."""
    base = _base(model)
    blocker = host_embedding_blocker(base, checkpointing, sharded, vision)
    if blocker:
        return None, f"on the device: {blocker}"
    emb = base.get_input_embeddings()
    device = emb.weight.device
    host = HostEmbedding(emb, device)
    base.set_input_embeddings(host)
    mb = host.weight.numel() * host.weight.element_size() / 2**20
    log.info("gradient_checkpointing: offload: the frozen input embedding (%.0f MB) is kept "
             "in host memory; each batch's rows are gathered there", mb)
    return host, f"in host memory ({mb:.0f} MB off the {device.type} device)"


def find_host_embedding(model: nn.Module) -> HostEmbedding | None:
    base = _base(model)
    emb = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
    return emb if isinstance(emb, HostEmbedding) else None


def embedding_to_device(model: nn.Module) -> bool:
    """Undo `embedding_to_host` (the benchmark harness shares one base model between
    systems); True when a table moved back."""
    host = find_host_embedding(model)
    if host is None:
        return False
    emb = nn.Embedding(host.num_embeddings, host.embedding_dim, padding_idx=host.padding_idx,
                       device="meta")
    emb.weight = nn.Parameter(host.weight.to(host.device), requires_grad=False)
    _move_hooks(host, emb)
    _base(model).set_input_embeddings(emb)
    return True

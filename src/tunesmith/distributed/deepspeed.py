"""DeepSpeed ZeRO-2/3 (with CPU offload) as a strategy. The only module importing deepspeed.

    deepspeed.initialize(model=LossModule(model), optimizer=tunesmith's AdamW, config)
    per micro-batch:  set_gradient_accumulation_boundary(last); engine(batch);
                      engine.backward(loss, scale_wrt_gas=False)   # the loop normalises
    per step:         engine.step()   (clips with gradient_clipping = max_grad_norm)

The JSON config's "auto" values are filled from the YAML (micro-batch, accumulation,
clipping, bf16/fp16), so one YAML drives every strategy; values that contradict the YAML
are errors. Optimizer and schedule come from the YAML, never from the JSON. Checkpoints
hold DeepSpeed's own sharded state (deepspeed/) next to the gathered trainable weights.
"""

from __future__ import annotations

import json
import logging
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

from tunesmith.config.schema import TrainingConfig
from tunesmith.config.speed import zero3_layers_whole_in
from tunesmith.distributed.context import DistContext
from tunesmith.distributed.strategy import LossModule, Strategy
from tunesmith.errors import ConfigError, TrainingError

log = logging.getLogger(__name__)
ENGINE_DIR, TAG = "deepspeed", "state"
OPTIMIZER_MARKER = {"deepspeed": True}  # optimizer.pt of a DeepSpeed checkpoint
# ZeRO sizes that "auto" sets from the model's hidden size h and parameter count n.
# Buckets of 5e8 elements (DeepSpeed's own reduce default; at most the model) rather than
# the h x h that HF's "auto" picks (12.8M at 7B): on one H200, 12-layer 7B shape, ZeRO-3
# full fine-tuning with layers gathered whole and compiled, 16,534 -> 17,926 tokens/s
# for +1 GB (docs/benchmarks/zero3.md). Parameters below 10 h elements (norms, biases)
# stay unpartitioned.
BUCKET = 500_000_000
SIZED_BY_MODEL = {"reduce_bucket_size": lambda h, n: min(BUCKET, n),
                  "stage3_prefetch_bucket_size": lambda h, n: min(BUCKET, n),
                  "stage3_param_persistence_threshold": lambda h, n: 10 * h}


def import_deepspeed() -> Any:
    try:
        import deepspeed
    except ImportError:
        raise ConfigError("deepspeed: the deepspeed package is not installed; pip install "
                          "'tunesmith[deepspeed]', or remove the deepspeed key to use DDP/FSDP2"
                          ) from None
    return deepspeed


def load_ds_config(cfg: TrainingConfig, ctx: DistContext) -> dict[str, Any]:
    """The DeepSpeed JSON with "auto" values resolved from the YAML."""
    path = Path(cfg.deepspeed)
    try:
        conf = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"deepspeed: {str(path)!r} does not exist; give a DeepSpeed JSON such "
                          "as examples/deepspeed/ds_z3_config.json") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"deepspeed: {path}:{exc.lineno} is not valid JSON: {exc.msg}") from None
    for owned in ("optimizer", "scheduler"):
        if owned in conf:
            raise ConfigError(f"deepspeed: {path} has an {owned!r} section; tunesmith builds the "
                              "optimizer and learning-rate schedule from the YAML (learning_rate, "
                              f"lr_scheduler_type, ...): remove {owned!r} from the JSON")
    bs, accum = cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
    wanted = {"train_micro_batch_size_per_gpu": bs, "gradient_accumulation_steps": accum,
              "train_batch_size": bs * accum * ctx.world_size,
              "gradient_clipping": cfg.max_grad_norm}
    for key, value in wanted.items():
        given = conf.get(key, "auto")
        if given != "auto" and given != value:
            raise ConfigError(f"deepspeed: {path} sets {key}={given!r} but the YAML gives "
                              f"{value!r}; set it to \"auto\" (filled from the YAML)")
        conf[key] = value
    on_gpu = ctx.device.type == "cuda"
    for key, flag in (("bf16", cfg.bf16 and on_gpu), ("fp16", cfg.fp16 and on_gpu)):
        section = conf.setdefault(key, {})
        if section.get("enabled", "auto") == "auto":
            section["enabled"] = flag
    zero = conf.setdefault("zero_optimization", {})
    unknown = [k for k, v in zero.items() if v == "auto" and k not in SIZED_BY_MODEL]
    for key in unknown:
        del zero[key]  # DeepSpeed's own default
    if "offload_optimizer" in zero:
        conf.setdefault("zero_force_ds_cpu_optimizer", False)  # tunesmith's AdamW on the CPU
    conf.setdefault("zero_allow_untested_optimizer", True)
    conf.setdefault("steps_per_print", 10**9)
    return conf


def join_single_rank_group(ctx: DistContext) -> None:
    """DeepSpeed runs inside a process group even in one process (`tunesmith train` with a
    deepspeed key and no launcher, as LLaMA-Factory's single-GPU examples are run): form a
    1-rank group over an in-memory store (no port). DeepSpeed also reads LOCAL_RANK, which a
    launcher would have set, while it trains: it is set to 0 until leave_single_rank_group."""
    import os

    import torch.distributed as dist

    if ctx.world_size > 1:
        return
    if "LOCAL_RANK" not in os.environ:
        os.environ["LOCAL_RANK"] = "0"
        _FORMED["local_rank"] = True
    if dist.is_initialized():
        return
    device_id = None
    if ctx.device.type == "cuda":  # NCCL binds to one numbered device: "cuda" is refused
        index = ctx.device.index
        device_id = torch.device("cuda", torch.cuda.current_device() if index is None else index)
    backend = "nccl" if device_id is not None else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                            device_id=device_id)
    log.info("deepspeed: one process, so a 1-rank %s process group was formed", backend)


_FORMED = {"local_rank": False}  # whether join_single_rank_group set LOCAL_RANK


def leave_single_rank_group() -> None:
    """After the run (weights saved): drop the LOCAL_RANK that join_single_rank_group set, so
    a process that goes on (the Python API, a notebook, the web UI's test server) does not
    hand it to a later launcher, which would read it as "already launched" and start one
    process instead of several. The 1-rank group itself stays for the life of the process:
    DeepSpeed keeps groups cloned from it in module globals, and a second DeepSpeed run in
    the same process fails on a destroyed one; the next run reuses it."""
    import os

    if _FORMED["local_rank"]:
        os.environ.pop("LOCAL_RANK", None)
    _FORMED["local_rank"] = False


def mark_layer_fetch_units(ds: Any, model: torch.nn.Module, zero: dict[str, Any]) -> int:
    """ZeRO-3 gathers each decoder layer's parameters in one go and reduces its gradients
    when the layer's backward ends (DeepSpeed's "leaf module"), instead of hooking every
    Linear and norm inside it: ~12x fewer hooks, fetches and gradient buckets per layer,
    for one layer's weights in memory at a time (what FSDP2 holds too). A JSON that sets
    stage3_module_granularity_threshold chooses DeepSpeed's own grouping (0: none).

    DeepSpeed reduces a leaf's gradients from a full backward hook on the layer, and such
    a hook fires before the layer's own backward when its input needs no gradient (the
    first layer under LoRA, the first trained layer under freeze tuning): the end of
    backward then released the layer's weights before they were used (DeepSpeed 0.19.8,
    2 ranks: "size of tensor a (0) must match"). So a layer that trains anything gets an
    input that requires grad (`_input_requires_grad`), which costs one input gradient.
    Returns how many layers were marked."""
    if not zero3_layers_whole_in(zero):
        return 0
    from tunesmith.distributed.strategy import decoder_layers

    try:
        layers = decoder_layers(model)
    except ConfigError:
        return 0  # no .layers list: DeepSpeed hooks every module, as it does by default
    for layer in layers:
        ds.utils.set_z3_leaf_module(layer, True)
        if any(p.requires_grad for p in layer.parameters()):
            layer.register_forward_pre_hook(_input_requires_grad, with_kwargs=True)
    log.info("deepspeed: ZeRO-3 gathers each of the %d decoder layers whole", len(layers))
    return len(layers)


def _input_requires_grad(layer: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    """A detached copy of the layer's hidden states that requires grad, when grad is on
    and they do not already (see mark_layer_fetch_units); registered before DeepSpeed's
    own hooks, so they see it."""
    if not torch.is_grad_enabled():
        return None
    if args and isinstance(args[0], torch.Tensor) and not args[0].requires_grad:
        return (args[0].detach().requires_grad_(True), *args[1:]), kwargs
    x = kwargs.get("hidden_states")
    if isinstance(x, torch.Tensor) and not x.requires_grad:
        return args, {**kwargs, "hidden_states": x.detach().requires_grad_(True)}
    return None


class DeepSpeedStrategy(Strategy):
    def __init__(self, ctx: DistContext, cfg: TrainingConfig):
        super().__init__("deepspeed", ctx, cfg)
        self.ds = import_deepspeed()
        self.conf = load_ds_config(cfg, ctx)
        self.stage = int(self.conf["zero_optimization"].get("stage", 0))
        self.engine: Any = None
        # decoder layers ZeRO-3 gathers whole (mark_layer_fetch_units); None below stage 3
        self.fetch_units: int | None = 0 if self.stage == 3 else None

    def wrap(self, model: torch.nn.Module, objective: Any) -> None:
        hidden = int(getattr(model.config, "hidden_size", 0) or 0)
        # ds_numel: a parameter ZeRO-3 has already partitioned reports numel() 0
        count = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
        zero = self.conf["zero_optimization"]
        for key, size in SIZED_BY_MODEL.items():
            if zero.get(key) == "auto":
                if hidden:
                    zero[key] = size(hidden, count)
                else:
                    del zero[key]
        self.model, self.inner = model, LossModule(model, objective)
        self.loss_module = self.inner  # replaced by the engine in attach_optimizer
        if self.stage == 3:
            from tunesmith.models.loader import split_causal_lm

            # the loss reads the head's weight outside the head's forward: ZeRO-3 must
            # fetch it for the LossModule's forward and backward
            _, head = split_causal_lm(model)
            self.ds.zero.register_external_parameter(self.inner, head.weight)
            self.fetch_units = mark_layer_fetch_units(self.ds, model, zero)

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        join_single_rank_group(self.ctx)
        self.engine, _, _, _ = self.ds.initialize(model=self.inner, optimizer=optimizer,
                                                  config=self.conf, dist_init_required=False)
        self.loss_module = self.engine

    def micro_context(self, last: bool) -> AbstractContextManager:
        self.engine.set_gradient_accumulation_boundary(last)
        return nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)

    def finish_step(self, optimizer: torch.optim.Optimizer, scaler: Any, max_norm: float,
                    loss_ok: bool) -> tuple[float, bool]:
        if not loss_ok:
            raise TrainingError("non-finite loss under DeepSpeed: its reduced gradients cannot be "
                                "dropped without stepping, so the run stops before the weights "
                                "take it; lower learning_rate, use bf16, or check the data")
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return (float(norm) if norm is not None else float("nan")), self.engine.was_step_applied()

    # ----- state ---------------------------------------------------------------------------
    def _collect(self, only_trainable: bool) -> dict[str, torch.Tensor] | None:
        out: dict[str, torch.Tensor] = {}
        for name, p in self.model.named_parameters():  # type: ignore[union-attr]
            if only_trainable and not p.requires_grad:
                continue
            if self.stage == 3:  # one tensor at a time: never the whole model on one GPU
                with self.ds.zero.GatheredParameters([p], modifier_rank=None):
                    if self.ctx.is_main:
                        out[name] = p.detach().contiguous().cpu().clone()
            elif self.ctx.is_main:
                out[name] = p.detach().contiguous().cpu()
        if not only_trainable and self.ctx.is_main:
            kept = set(self.model.state_dict())  # type: ignore[union-attr]  # persistent only
            for name, b in self.model.named_buffers():  # type: ignore[union-attr]
                if name in kept:
                    out.setdefault(name, b.detach().cpu())
        return out if self.ctx.is_main else None

    def trainable_state(self) -> dict[str, torch.Tensor] | None:
        return self._collect(only_trainable=True)

    def full_state(self) -> dict[str, torch.Tensor] | None:
        return self._collect(only_trainable=False) if self.stage == 3 else None

    def export_state(self, adapter: bool) -> dict[str, torch.Tensor] | None:
        if self.stage != 3:
            return None  # every rank holds whole parameters: the model saves itself
        return self.trainable_state() if adapter else self.full_state()

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict | None:
        return dict(OPTIMIZER_MARKER) if self.ctx.is_main else None  # state: save_engine_state

    def save_engine_state(self, folder: Any) -> None:
        self.engine.save_checkpoint(str(Path(folder) / ENGINE_DIR), tag=TAG, save_latest=False)

    def load_trainable(self, weights: dict[str, torch.Tensor]) -> None:
        """Weights come back with the engine state (load_engine_state), fp32 masters included."""

    def load_optimizer(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Held in the engine state."""

    def load_engine_state(self, path: Any) -> None:
        folder = Path(path) / ENGINE_DIR
        if not folder.is_dir():
            raise TrainingError(f"resume_from_checkpoint: {path} was not written under DeepSpeed "
                                "(no deepspeed/ folder), so it cannot resume a DeepSpeed run; "
                                "resume it with the strategy that wrote it")
        self.engine.load_checkpoint(str(folder), tag=TAG, load_module_strict=False,
                                    load_lr_scheduler_states=False)

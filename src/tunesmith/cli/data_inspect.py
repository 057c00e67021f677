"""`tunesmith data inspect CONFIG_OR_DATASET`: what training would see, before training."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tunesmith.config.loader import load_config
from tunesmith.errors import TunesmithError

DATA_USAGE = "tunesmith data inspect CONFIG.yaml|DATASET [--model M] [--template T] [key=value]"


def cmd_data(args: list[str]) -> int:
    if not args or args[0] != "inspect":
        print(f"usage: {DATA_USAGE}", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog="tunesmith data inspect")
    p.add_argument("target", help="a training YAML, or a dataset name / path / glob")
    p.add_argument("--model", default="", help="tokenizer source (default: the config's model, "
                   "else smollm2-135m-instruct)")
    p.add_argument("--template", default=None)
    p.add_argument("--sample", type=int, default=0, help="index of the sample to show")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    ns = p.parse_intermixed_args(args[1:])
    print(inspect_target(ns))
    return 0


def inspect_target(ns: argparse.Namespace) -> str:
    from tunesmith.data.inspect import describe, highlight_sample
    from tunesmith.data.loading import DataContext, prepare_data
    from tunesmith.data.slot_renderer import make_renderer
    from tunesmith.data.template import load_template_source
    from tunesmith.models.loader import load_tokenizer
    from tunesmith.models.processor import load_vision_settings
    from tunesmith.models.provision import resolve_model_path

    overrides = dict(o.split("=", 1) for o in ns.overrides if "=" in o)
    is_config = Path(ns.target).suffix in (".yaml", ".yml")
    if not is_config:
        overrides["dataset"] = ns.target
    if ns.model:
        overrides["model_name_or_path"] = ns.model
    if ns.template is not None:
        overrides["template"] = ns.template
    cfg = load_config(ns.target if is_config else None, overrides)
    model = cfg.model.model_name_or_path or "smollm2-135m-instruct"
    tokenizer = load_tokenizer(resolve_model_path(model, cfg.model.cache_dir or None))
    name, source = load_template_source(cfg.model.template, tokenizer)
    path = resolve_model_path(model, cfg.model.cache_dir or None)
    vision = load_vision_settings(path, tokenizer, cfg)
    ctx = DataContext(make_renderer(name, source, tokenizer, cfg.template,
                                    media=vision is not None), tokenizer, cfg.training.seed,
                      cfg.finetuning.stage, cfg.training.overwrite_cache, vision, model)
    data = prepare_data(cfg.data, ctx)
    figures = describe(data, cfg.data.cutoff_len)
    if not len(data.train):
        raise TunesmithError("no training samples to inspect")
    index = min(max(ns.sample, 0), len(data.train) - 1)
    color = ns.color == "always" or (ns.color == "auto" and sys.stdout.isatty())
    width = max(len(k) for k in figures)
    lines = [f"dataset(s): {', '.join(cfg.data.dataset)}   template: {name}   "
             f"cutoff_len: {cfg.data.cutoff_len}", ""]
    lines += [f"  {k:<{width}}  {v}" for k, v in figures.items()]
    where = data.train.source(index) if hasattr(data.train, "source") else f"sample {index}"
    mark = "green" if color else "[[ ]]"
    lines += ["", f"sample {index} ({where}); trained tokens in {mark}:", "",
              highlight_sample(data.train[index], tokenizer, color)]
    return "\n".join(lines)

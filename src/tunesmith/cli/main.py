"""`tunesmith <command>`: train | chat | env."""

from __future__ import annotations

import argparse
import sys

from tunesmith.errors import TunesmithError

USAGE = """tunesmith <command> [args]

commands:
  train CONFIG.yaml [key=value ...] [--key value ...]   fine-tune a model
  chat  [--model_name_or_path M] [--adapter_name_or_path A] [--template T] [--prompt TEXT]
  env                                                    versions and devices, for bug reports
  data inspect CONFIG.yaml|DATASET [--model M] [--template T] [key=value ...]
                                                         counts, lengths, truncation, packing, a sample
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    commands = {"train": cmd_train, "chat": cmd_chat, "env": cmd_env, "data": cmd_data}
    if command not in commands:
        print(f"unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        return commands[command](rest) or 0
    except TunesmithError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def cmd_train(args: list[str]) -> int:
    from tunesmith.cli.setup import setup_process
    from tunesmith.config.loader import load_config, parse_cli_args

    if args and args[0] in ("-h", "--help"):
        from tunesmith.cli.help import config_help

        print(config_help())
        return 0
    path, overrides = parse_cli_args(args)
    cfg = load_config(path, overrides)
    setup_process(cfg.training.seed)
    from tunesmith.recipes.sft import run_sft

    run_sft(cfg)
    return 0


def cmd_chat(args: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tunesmith chat")
    p.add_argument("config", nargs="?", help="optional YAML with model_name_or_path etc.")
    p.add_argument("--model_name_or_path", default="")
    p.add_argument("--adapter_name_or_path", default="")
    p.add_argument("--template", default="")
    p.add_argument("--prompt", default=None, help="answer this once and exit")
    p.add_argument("--system", default=None, help="system message")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top_p", type=float, default=1.0)
    p.add_argument("--top_k", type=int, default=0)
    p.add_argument("--max_new_tokens", type=int, default=256)
    p.add_argument("--repetition_penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--trust_remote_code", action="store_true")
    ns = p.parse_args(args)
    from tunesmith.cli.setup import setup_process
    from tunesmith.infer.engine import GenerationParams, HFEngine

    setup_process(ns.seed)
    model, adapters, template = ns.model_name_or_path, ns.adapter_name_or_path, ns.template
    if ns.config:
        from tunesmith.config.loader import read_yaml

        raw = {k: v for k, (v, _) in read_yaml(ns.config).items()}
        model = model or raw.get("model_name_or_path", "")
        adapters = adapters or raw.get("adapter_name_or_path") or ""
        template = template or raw.get("template") or ""
    if not model:
        raise TunesmithError("chat: give --model_name_or_path (or a YAML that sets it)")
    adapter_list = adapters if isinstance(adapters, list) else [
        a for a in str(adapters).split(",") if a]
    engine = HFEngine(model, adapter_list, template, ns.device, ns.trust_remote_code)
    params = GenerationParams(ns.max_new_tokens, ns.temperature, ns.top_p, ns.top_k,
                              ns.repetition_penalty, seed=ns.seed)
    history = [{"role": "system", "content": ns.system}] if ns.system else []
    if ns.prompt is not None:
        _answer(engine, history + [{"role": "user", "content": ns.prompt}], params)
        return 0
    print("chat with the model; 'clear' forgets the history, 'exit' quits")
    while True:
        try:
            text = input("\nuser> ").strip()
        except EOFError:
            return 0
        if text == "exit":
            return 0
        if text == "clear":
            history = history[:1] if ns.system else []
            continue
        if not text:
            continue
        history.append({"role": "user", "content": text})
        history.append({"role": "assistant", "content": _answer(engine, history, params)})


def _answer(engine, messages, params) -> str:
    print("assistant> ", end="", flush=True)
    pieces = []
    for piece in engine.stream(messages, params):
        print(piece, end="", flush=True)
        pieces.append(piece)
    print()
    return "".join(pieces)


def cmd_data(args: list[str]) -> int:
    from tunesmith.cli.data_inspect import cmd_data as run

    return run(args)


def cmd_env(args: list[str]) -> int:
    from tunesmith.cli.env_report import env_report

    print(env_report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

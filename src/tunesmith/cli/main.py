"""`tunesmith <command>`: train | chat | api | eval | env."""

from __future__ import annotations

import sys

from tunesmith.errors import TunesmithError

USAGE = """tunesmith <command> [args]

commands:
  train CONFIG.yaml [key=value ...] [--key value ...]   fine-tune a model
  chat  [CONFIG.yaml] [--model_name_or_path M] [--adapter_name_or_path A] [--prompt TEXT] ...
  api   [CONFIG.yaml] [--model_name_or_path M] [--adapter_name_or_path A] [--port P] ...
                                                         OpenAI-compatible API server
  eval  CONFIG.yaml [key=value ...]                      loss/perplexity, predict (BLEU/ROUGE)
                                                         or a multiple-choice benchmark (task)
  env                                                    versions and devices, for bug reports
  export CONFIG.yaml [key=value ...]                     merge adapters; write an HF folder or GGUF
  bench [--groups main,full,liger] [--out DIR] [--tiny]  GPU training benchmark vs HF+PEFT/Liger
  bench --e2e [--out DIR] [--tiny] [--systems ...]      tunesmith train vs LLaMA-Factory, Unsloth
  webui [--work_dir DIR] [--host H] [--port P] [--auth USER:PASSWORD] [--share]   the web UI
  data inspect CONFIG.yaml|DATASET [--model M] [--template T] [key=value ...]
                                                         counts, lengths, truncation, packing, a sample
Every command takes key=value, --key value and --key=value alike; chat, api and webui also
read their options from a YAML (the command line wins).
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        from tunesmith.cli.launcher_args import move_launcher_args

        argv = move_launcher_args(argv)  # deepspeed's launcher: --local_rank=N before the verb
    except TunesmithError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    commands = {"train": cmd_train, "chat": cmd_chat, "env": cmd_env, "export": cmd_export,
                "bench": cmd_bench, "api": cmd_api, "eval": cmd_eval, "webui": cmd_webui,
                "data": cmd_data}
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
    cfg = load_config(path, overrides)  # checked once, before any process is started
    if (cfg.eval.do_predict or cfg.eval.predict_with_generate) and not cfg.data.dataset:
        from tunesmith.cli.evaluate import cmd_eval  # LF's predict YAMLs: no training data

        return cmd_eval(args)
    from tunesmith.distributed.ray_train import ray_requested

    if ray_requested(cfg):  # use_ray / USE_RAY=1: Ray Train starts the workers
        from tunesmith.cli.train_ray import train_on_ray

        return train_on_ray(cfg)
    from tunesmith.config.environment import distributed_env, launch_env
    from tunesmith.distributed.launch import gpu_count, processes_to_launch, relaunch, run_recorded

    env = launch_env()
    nproc = processes_to_launch(env, gpu_count())
    if nproc:  # one process per GPU (or NPROC_PER_NODE), each running this same command
        return relaunch(env, nproc, ["train", *args])
    rank = distributed_env()["rank"]
    setup_process(cfg.training.seed, rank=rank)
    from tunesmith.recipes.stages import run_stage

    if distributed_env()["world_size"] > 1:
        from tunesmith.distributed.context import shutdown_process_group

        try:  # torchrun's report then names this rank and its error
            run_recorded(lambda: run_stage(cfg))
        except TunesmithError as exc:
            raise TunesmithError(f"rank {rank}: {exc}") from None
        shutdown_process_group()  # a clean exit: no collective threads left at teardown
    else:
        run_stage(cfg)
    return 0


def cmd_chat(args: list[str]) -> int:
    from tunesmith.cli.arguments import parse_verb_args
    from tunesmith.cli.chat_args import chat_parser

    ns = parse_verb_args(chat_parser(), args)
    from tunesmith.cli.setup import setup_process
    from tunesmith.infer.engine import GenerationParams

    setup_process(ns.seed)
    from tunesmith.cli.chat_args import engine_from_args

    engine = engine_from_args(ns)
    params = GenerationParams(ns.max_new_tokens, ns.temperature, ns.top_p, ns.top_k,
                              ns.repetition_penalty, stop=ns.stop, seed=ns.seed)
    if params.check():
        raise TunesmithError("chat: " + "; ".join(params.check()))
    if ns.prompt is not None and not ns.prompt.strip():
        raise TunesmithError("chat: --prompt is empty; give some text to answer")
    history = [{"role": "system", "content": ns.system}] if ns.system else []
    shown = {"images": ns.image} if ns.image else {}
    if ns.prompt is not None:
        _answer(engine, history + [{"role": "user", "content": ns.prompt, **shown}], params)
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
        history.append({"role": "user", "content": text, **shown})
        shown = {}  # the images go with the first message
        history.append({"role": "assistant", "content": _answer(engine, history, params)})


def _answer(engine, messages, params) -> str:
    print("assistant> ", end="", flush=True)
    pieces = []
    for piece in engine.stream(messages, params):
        print(piece, end="", flush=True)
        pieces.append(piece)
    print()
    return "".join(pieces)


def cmd_export(args: list[str]) -> int:
    from tunesmith.cli.setup import setup_process
    from tunesmith.config.loader import load_config, parse_cli_args

    if args and args[0] in ("-h", "--help"):
        from tunesmith.cli.help import config_help

        print(config_help())
        return 0
    path, overrides = parse_cli_args(args)
    cfg = load_config(path, overrides)
    setup_process(cfg.training.seed)
    from tunesmith.recipes.export import run_export

    run_export(cfg)
    return 0


def cmd_bench(args: list[str]) -> int:
    if "--e2e" in args:  # tunesmith train vs llamafactory-cli train, end to end
        from tunesmith.benchmarks.e2e import main as run_e2e

        return run_e2e([a for a in args if a != "--e2e"])
    from tunesmith.benchmarks.report import run_all

    return run_all(args)


def cmd_api(args: list[str]) -> int:
    from tunesmith.cli.api import cmd_api as run_api

    return run_api(args)


def cmd_eval(args: list[str]) -> int:
    from tunesmith.cli.evaluate import cmd_eval as run_eval

    return run_eval(args)


def cmd_webui(args: list[str]) -> int:
    from tunesmith.cli.webui import cmd_webui as run

    return run(args)


def cmd_data(args: list[str]) -> int:
    from tunesmith.cli.data_inspect import cmd_data as run

    return run(args)


def cmd_env(args: list[str]) -> int:
    from tunesmith.cli.env_report import env_report

    print(env_report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

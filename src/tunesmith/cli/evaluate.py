"""`tunesmith eval CONFIG.yaml [key=value ...]`: loss/perplexity, predictions, benchmarks."""

from __future__ import annotations

import json


def cmd_eval(args: list[str]) -> int:
    from tunesmith.cli.setup import setup_process
    from tunesmith.config.loader import load_config, parse_cli_args

    if args and args[0] in ("-h", "--help"):
        from tunesmith.cli.help import config_help

        print("usage: tunesmith eval CONFIG.yaml [key=value ...]\n"
              "  task set: multiple-choice benchmark; predict_with_generate: predictions "
              "scored with BLEU/ROUGE; otherwise: loss and perplexity.\n")
        print(config_help())
        return 0
    path, overrides = parse_cli_args(args)
    cfg = load_config(path, overrides)
    setup_process(cfg.training.seed)
    from tunesmith.evaluation.runner import eval_mode, run_eval

    results = run_eval(cfg)
    shown = {k: v for k, v in results.items() if k not in ("predictions", "subjects")}
    print(f"eval ({eval_mode(cfg)}): {json.dumps(shown, indent=2, ensure_ascii=False)}")
    return 0

"""Arguments that launchers put in front of the verb.

deepspeed's launcher runs each rank as `python -u <entry> --local_rank=N <your args>`, so
`deepspeed --include localhost:0,1 --module tunesmith train cfg.yaml` reaches tunesmith as

    --local_rank=0 train cfg.yaml          ->   train cfg.yaml --local_rank=0

The key then goes through the config loader like any other (`local_rank`, checked against
LOCAL_RANK by train/launcher_env.py).
"""

from __future__ import annotations

from tunesmith.errors import ConfigError

LAUNCHER_FLAG = "--local_rank"


def move_launcher_args(argv: list[str]) -> list[str]:
    """Move a leading `--local_rank=N` / `--local_rank N` behind the verb."""
    front: list[str] = []
    rest = list(argv)
    while rest and (rest[0] == LAUNCHER_FLAG or rest[0].startswith(LAUNCHER_FLAG + "=")):
        flag = rest.pop(0)
        if flag == LAUNCHER_FLAG:
            if not rest or not rest[0].lstrip("-").isdigit():
                raise ConfigError(f"{LAUNCHER_FLAG} needs a number (as deepspeed's launcher "
                                  f"passes {LAUNCHER_FLAG}=0); got {rest[:1] or 'nothing'}")
            flag = f"{flag}={rest.pop(0)}"
        front.append(flag)
    if front and not rest:
        raise ConfigError(f"{' '.join(front)} without a command; e.g. deepspeed ... --module "
                          "tunesmith train cfg.yaml")
    return rest + front

"""tunesmith: fine-tune large language models fast, from one YAML file.

The Python API (tunesmith/api.py) loads on first use, so importing tunesmith does no
work: `tunesmith.train(...)`, `export`, `evaluate`, `chat`, `load`.

`train` and `export` are also the names of subpackages (the loop, the exporters). Python
rebinds a package attribute to a subpackage when that is imported, so this package keeps
the callable in place and the callable hands attribute access on to the subpackage:
`tunesmith.train(cfg)` trains, `tunesmith.train.loop` is still the module.
"""

import sys
import types
from importlib import import_module
from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "chat", "evaluate", "export", "load", "train"]


class _Verb:
    """A callable API function that stands in for the subpackage of the same name."""

    def __init__(self, name: str):
        self._name = name
        self.__doc__ = f"tunesmith.{name}(config, **overrides): see tunesmith.api.{name}."

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(import_module("tunesmith.api"), self._name)(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        return getattr(import_module(f"tunesmith.{self._name}"), attr)

    def __repr__(self) -> str:
        return f"<tunesmith.{self._name}: API function and package>"


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(self.__dict__.get(name), _Verb) and isinstance(value, types.ModuleType):
            return  # importing tunesmith.train keeps tunesmith.train callable
        super().__setattr__(name, value)


train = _Verb("train")
export = _Verb("export")
sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name in ("evaluate", "chat", "load"):
        return getattr(import_module("tunesmith.api"), name)
    raise AttributeError(f"module 'tunesmith' has no attribute {name!r}")

"""Exception types. Each message says what was wrong, where it came from and how to fix it."""

from __future__ import annotations


class TunesmithError(Exception):
    """Base class for errors a user can act on; the CLI prints these without a traceback."""


class ConfigError(TunesmithError):
    """One or more configuration problems, reported together."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        head = "configuration error" if len(self.problems) == 1 else (
            f"{len(self.problems)} configuration errors")
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in self.problems))


class DataError(TunesmithError):
    """Bad dataset input: names the file, line or row and the reason."""


class ModelError(TunesmithError):
    """A model or adapter could not be found, converted or loaded."""


class UnsupportedModelError(ModelError):
    """The model loads, but a fast path (e.g. the continuous batcher) cannot serve it."""


class TrainingError(TunesmithError):
    """Training had to stop (non-finite losses, out of memory, ...)."""


class ExportError(TunesmithError):
    """A model could not be exported (unsupported architecture, tokenizer or base)."""


class StorageError(TunesmithError):
    """A file could not be written or a folder could not be used: the disk is full, or
    another run holds the folder. Names the path and what to do."""

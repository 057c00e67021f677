"""Locations in cached data follow the user's files.

The tokenised cache is keyed by file contents, so the same rows copied to another folder
(or renamed) reuse the cache filled from the first copy. Every location stored in it
(bad rows, dropped samples, sample sources) starts with the path read then; these helpers
rewrite that prefix to the path of this run, so a report always names the file the user
gave.
"""

from __future__ import annotations

from collections.abc import Sequence

# a location is "PATH:LINE", "PATH[row N]" or "FOLDER[split row N]", maybe + " (part K)"
_SEPARATORS = (":", "[")


def location_map(cached: Sequence[str], current: Sequence[str]) -> dict[str, str]:
    """Old path -> new path for the files that moved (the cache lists them in the same
    order, since the cache key holds every file's digest in order)."""
    if len(cached) != len(current):
        return {}
    return {old: new for old, new in zip(cached, current, strict=True) if old != new}


def relocate(where: str, moved: dict[str, str]) -> str:
    """`where` with its file prefix replaced when that file moved."""
    for old, new in moved.items():
        if where.startswith(old) and where[len(old):len(old) + 1] in _SEPARATORS:
            return new + where[len(old):]
    return where


class RelocatedSources:
    """A lazy view of sample locations with moved file prefixes rewritten on access."""

    def __init__(self, sources: Sequence[str], moved: dict[str, str]):
        self.sources, self.moved = sources, moved

    def __getitem__(self, i: int) -> str:
        return relocate(self.sources[i], self.moved)

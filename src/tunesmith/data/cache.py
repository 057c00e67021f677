"""Cache keys for tokenised datasets: a digest of everything that changes the tokens.

key = sha256(format version, file contents, tokenizer, template source, encode options,
             format spec, max_samples, dataset_vars, stage)

Sample order, mixing, the validation split and packing are cheap index operations done
after the cache, so changing them never re-tokenises.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tunesmith.config.environment import cache_root

CACHE_FORMAT_VERSION = 1
_CHUNK = 1 << 22


def file_digest(path: Path) -> str:
    """Digest of a file's bytes (or of every file under a folder, in name order)."""
    h = hashlib.blake2b(digest_size=20)
    paths = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for p in paths:
        h.update(str(p.relative_to(path) if path.is_dir() else p.name).encode())
        with open(p, "rb") as fh:
            while block := fh.read(_CHUNK):
                h.update(block)
    return h.hexdigest()


def tokenizer_digest(tokenizer: Any) -> str:
    """Digest of the tokenizer's vocabulary, merges, normalisation and special tokens."""
    h = hashlib.blake2b(digest_size=20)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:  # slow tokenizer: its vocabulary is what it is
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(type(tokenizer).__name__.encode())
    h.update(json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str).encode())
    return h.hexdigest()


def dataset_cache_key(file_digests: list[str], tokenizer_key: str, template_source: str,
                      settings: dict[str, Any]) -> str:
    payload = json.dumps({"version": CACHE_FORMAT_VERSION, "files": file_digests,
                          "tokenizer": tokenizer_key, "template": template_source,
                          "settings": settings}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def dataset_cache_dir(key: str) -> Path:
    return cache_root() / "datasets" / key

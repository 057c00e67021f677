"""Cache keys for tokenised datasets: a digest of everything that changes the tokens.

key = sha256(format version, file contents, tokenizer, template source, encode options,
             format spec, max_samples, dataset_vars, stage)

Sample order, mixing, the validation split and packing are cheap index operations done
after the cache, so changing them never re-tokenises.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tunesmith.config.environment import cache_root

CACHE_FORMAT_VERSION = 2  # 2: report.json lists the files it was read from
_CHUNK = 1 << 22


def file_digest(path: Path) -> str:
    """Digest of a file's bytes (or of every file under a folder, in name order).

    The digest of a file is remembered next to the cache with the file's size and
    modification time, and computed again only when one of them changes, so a cached
    dataset of any size reopens without reading its source files."""
    memo = cache_root() / "datasets" / "digests" / (
        hashlib.sha1(str(path.resolve()).encode()).hexdigest() + ".json")
    stamp = _stamp(path)
    try:
        saved = json.loads(memo.read_text(encoding="utf-8"))
        if saved["stamp"] == stamp:
            return saved["digest"]
    except (OSError, ValueError, KeyError):
        pass
    digest = _content_digest(path)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"stamp": stamp, "digest": digest}), encoding="utf-8")
        os.replace(tmp, memo)
    except OSError:  # a read-only cache still works, it just hashes again next time
        pass
    return digest


def _stamp(path: Path) -> list[list[Any]]:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [[str(p), st.st_size, st.st_mtime_ns] for p in files for st in [p.stat()]]


def _content_digest(path: Path) -> str:
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

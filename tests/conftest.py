from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny import build_tokenizer, save_tiny_model, write_alpaca  # noqa: E402


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2")


@pytest.fixture(scope="session")
def tiny_vl_dir(tmp_path_factory) -> Path:
    from tiny_vl import save_tiny_qwen2_vl

    return save_tiny_qwen2_vl(tmp_path_factory.mktemp("tiny-qwen2-vl"))


@pytest.fixture
def alpaca_file(tmp_path) -> Path:
    return write_alpaca(tmp_path / "train.json")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    # Tests never touch the user's cache; the slow demo test sets its own.
    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

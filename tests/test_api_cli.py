"""`tunesmith api` as a user starts it: loopback by default, API_KEY honoured, clear errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("API_KEY", None)
    return env | extra


def test_api_command_binds_loopback_and_requires_the_env_key(tiny_llama_dir):
    cmd = [sys.executable, "-m", "tunesmith", "api", "--model_name_or_path",
           str(tiny_llama_dir), "--port", "0", "--enforce_eager", "--kv_cache_fraction", "0.5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(API_KEY="env-key"))
    try:
        line = ""
        for line in proc.stdout:  # the first line that says where it listens
            if "serving" in line:
                break
        match = re.search(r"http://(127\.0\.0\.1):(\d+)/v1 \(API key required\)", line)
        assert match, line
        base = f"http://127.0.0.1:{match.group(2)}/v1"
        assert httpx.get(f"{base}/models", timeout=30).status_code == 401
        client = openai.OpenAI(base_url=base, api_key="env-key", max_retries=0, timeout=30)
        assert [m.id for m in client.models.list().data] == [tiny_llama_dir.name]
        reply = client.chat.completions.create(model=tiny_llama_dir.name, max_tokens=3,
                                               messages=[{"role": "user", "content": "hi"}])
        assert reply.usage.completion_tokens >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_api_command_reports_a_missing_adapter(tiny_llama_dir, tmp_path):
    cmd = [sys.executable, "-m", "tunesmith", "api", "--model_name_or_path",
           str(tiny_llama_dir), "--adapter_name_or_path", str(tmp_path / "gone"), "--port", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 1
    assert "adapter_name_or_path" in done.stderr and "does not exist" in done.stderr


def test_infer_backend_not_installed_is_a_clear_error(tiny_llama_dir, capsys):
    from tunesmith.cli.main import main

    for backend in ("vllm", "sglang"):
        assert main(["api", "--model_name_or_path", str(tiny_llama_dir), "--infer_backend",
                     backend]) == 1
        err = capsys.readouterr().err
        assert f"infer_backend: {backend} is not installed" in err and f"pip install {backend}" in err
    assert main(["api", "--model_name_or_path", str(tiny_llama_dir), "--infer_backend",
                 "tgi"]) == 1
    assert "'tgi' is not a backend" in capsys.readouterr().err
    assert main(["api", "--model_name_or_path", str(tiny_llama_dir), "--kv_cache_fraction",
                 "1.5"]) == 1
    assert "--kv_cache_fraction 1.5 must be in (0, 1]" in capsys.readouterr().err


FAKE_SERVER = """import json, os, sys
args = sys.argv[1:]
template = args[args.index("--chat-template") + 1]
out = {"args": args, "template": open(template).read()}
open(os.environ["FAKE_BACKEND_OUT"], "w").write(json.dumps(out))
"""


def test_infer_backend_hands_over_to_an_installed_engine(tiny_llama_dir, tmp_path,
                                                         monkeypatch):
    import json

    from test_engine import _save_adapter
    from tunesmith.cli.main import main
    from tunesmith.data.template import load_template_source

    fake = tmp_path / "site" / "vllm" / "entrypoints" / "openai"
    fake.mkdir(parents=True)
    for folder in (fake.parents[1], fake.parent, fake):
        (folder / "__init__.py").write_text("")
    (fake / "api_server.py").write_text(FAKE_SERVER)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site") + os.pathsep + SRC)
    monkeypatch.setenv("FAKE_BACKEND_OUT", str(tmp_path / "argv.json"))
    alpaca = load_template_source("alpaca", None)[1]
    adapter = _save_adapter(tmp_path / "my-lora", tiny_llama_dir, alpaca)
    yaml = tmp_path / "serve.yaml"
    yaml.write_text(f"model_name_or_path: {tiny_llama_dir}\nadapter_name_or_path: {adapter}\n"
                    "infer_backend: vllm\n")
    assert main(["api", str(yaml), "--port", "8123", "--max_model_len", "256"]) == 0
    seen = json.loads((tmp_path / "argv.json").read_text())
    args = seen["args"]
    assert args[args.index("--model") + 1] == str(tiny_llama_dir)
    assert args[args.index("--lora-modules") + 1] == f"my-lora={adapter}"
    assert args[args.index("--port") + 1] == "8123"
    assert args[args.index("--max-model-len") + 1] == "256"
    assert seen["template"] == alpaca  # the template the adapter was trained with

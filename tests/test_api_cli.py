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
           str(tiny_llama_dir), "--port", "0"]
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

"""`infer_backend: vllm | sglang`: hand serving to that engine's own OpenAI-compatible server.

tunesmith resolves the model (aliases and GGUF files become a local folder), checks the
adapter and writes the chat template the adapter was trained with, then runs

    python -m vllm.entrypoints.openai.api_server --model DIR ...   (vllm)
    python -m sglang.launch_server --model-path DIR ...             (sglang)

in the foreground with the same host, port, API key, served name and context length.
An engine that is not installed is a clear error naming the package to install.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tunesmith.errors import ConfigError

BACKENDS = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server"}
BACKEND_CHOICES = ("huggingface", *BACKENDS)


@dataclass
class DelegateSpec:
    model: str  # a local folder or hub id (already resolved)
    adapter: str  # one PEFT adapter folder, or ""
    served_name: str
    host: str
    port: int
    api_key: str = ""
    max_model_len: int = 0
    chat_template: str = ""  # Jinja source to serve with ("" : the tokenizer's own)
    trust_remote_code: bool = False


def check_backend(backend: str) -> None:
    """Refuse an unknown or uninstalled backend, naming the fix."""
    if backend not in BACKEND_CHOICES:
        raise ConfigError(f"infer_backend: {backend!r} is not a backend; choose one of "
                          f"{', '.join(BACKEND_CHOICES)}")
    if backend in BACKENDS and importlib.util.find_spec(backend) is None:
        raise ConfigError(f"infer_backend: {backend} is not installed in this Python "
                          f"({sys.executable}); pip install {backend}, or use "
                          "infer_backend: huggingface (tunesmith's own engine)")


def backend_command(backend: str, spec: DelegateSpec, template_file: str = "") -> list[str]:
    """The argument list that starts `backend`'s OpenAI-compatible server for `spec`."""
    if backend == "vllm":
        cmd = ["--model", spec.model, "--served-model-name", spec.served_name]
        if spec.adapter:
            cmd = ["--model", spec.model, "--enable-lora", "--lora-modules",
                   f"{spec.served_name}={spec.adapter}"]
        flags = {"--api-key": spec.api_key, "--max-model-len": spec.max_model_len,
                 "--chat-template": template_file}
    else:
        cmd = ["--model-path", spec.model, "--served-model-name", spec.served_name]
        if spec.adapter:
            cmd += ["--enable-lora", "--lora-paths", f"{spec.served_name}={spec.adapter}"]
        flags = {"--api-key": spec.api_key, "--context-length": spec.max_model_len,
                 "--chat-template": template_file}
    cmd += ["--host", spec.host, "--port", str(spec.port)]
    for flag, value in flags.items():
        if value:
            cmd += [flag, str(value)]
    if spec.trust_remote_code:
        cmd.append("--trust-remote-code")
    return [sys.executable, "-m", BACKENDS[backend], *cmd]


def run_backend(backend: str, spec: DelegateSpec) -> int:
    """Run the backend's server in the foreground; returns its exit code."""
    check_backend(backend)
    with tempfile.TemporaryDirectory(prefix="tunesmith-serve-") as tmp:
        template_file = ""
        if spec.chat_template:
            template_file = str(Path(tmp) / "chat_template.jinja")
            Path(template_file).write_text(spec.chat_template, encoding="utf-8")
        cmd = backend_command(backend, spec, template_file)
        print(f"tunesmith api: handing over to {backend}: {' '.join(cmd[1:4])} ...", flush=True)
        proc = subprocess.Popen(cmd)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            return proc.wait(timeout=60)

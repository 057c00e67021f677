"""`tunesmith api`: serve a (tuned) model with an OpenAI-compatible HTTP API."""

from __future__ import annotations

import argparse
import logging

from tunesmith.errors import ConfigError

log = logging.getLogger(__name__)


def api_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tunesmith api")
    p.add_argument("config", nargs="?", help="optional YAML with model_name_or_path etc.")
    p.add_argument("--model_name_or_path", default="")
    p.add_argument("--adapter_name_or_path", default="")
    p.add_argument("--template", default="")
    p.add_argument("--device", default="auto")
    p.add_argument("--trust_remote_code", action="store_true")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: pick a free one)")
    p.add_argument("--api_key", default="",
                   help="require 'Authorization: Bearer KEY' on every route (or set API_KEY)")
    p.add_argument("--served_model_name", default="",
                   help="model id clients use (default: the adapter's or model's folder name)")
    p.add_argument("--cors_origins", default="",
                   help="comma-separated origins allowed by CORS (default: CORS off)")
    p.add_argument("--max_queue", type=int, default=256, help="requests waiting at most")
    p.add_argument("--max_batch_size", type=int, default=16,
                   help="streams with the same sampling settings generated together at most")
    p.add_argument("--max_model_len", type=int, default=0,
                   help="context length in tokens (0: the model's)")
    p.add_argument("--max_tokens", type=int, default=512,
                   help="completion length when a request gives no max_tokens")
    p.add_argument("--max_request_bytes", type=int, default=10 * 2**20,
                   help="larger request bodies are answered 413 before any parsing or "
                        "tokenisation (default 10 MiB)")
    p.add_argument("--media_dir", default="",
                   help="vision models: folder that local image paths in requests must lie in "
                        "(empty: only data: URLs)")
    p.add_argument("--allow_remote_media", action="store_true",
                   help="vision models: fetch http(s) image URLs of requests")
    p.add_argument("--access_log", action="store_true", help="log one line per request "
                   "(method, path, status; never the body)")
    p.add_argument("--infer_backend", default="", help="huggingface (tunesmith's engine, "
                   "default) | vllm | sglang (that engine's own server, when installed)")
    p.add_argument("--enforce_eager", action="store_true",
                   help="decode without CUDA graphs (GPU; slower, for debugging)")
    p.add_argument("--kv_cache_fraction", type=float, default=0.85,
                   help="share of the free GPU memory the KV cache may take (0..1)")
    return p


def cmd_api(args: list[str]) -> int:
    from tunesmith.cli.arguments import parse_verb_args
    from tunesmith.cli.chat_args import engine_from_args, model_args
    from tunesmith.cli.setup import setup_process
    from tunesmith.config.environment import api_key
    from tunesmith.serve.app import ServerSettings, create_app
    from tunesmith.serve.media import MediaPolicy
    from tunesmith.serve.server import bind_socket, build_server, is_loopback

    ns = parse_verb_args(api_parser(), args)
    if ns.port < 0 or ns.port > 65535:
        raise ConfigError(f"--port {ns.port} is not a TCP port (0..65535)")
    _check_limits(ns)
    setup_process()
    key = ns.api_key or api_key()
    _, _, _, backend = model_args(ns)
    if backend != "huggingface":
        return delegate(ns, key)
    engine = engine_from_args(ns)
    settings = ServerSettings(
        model_name=ns.served_model_name or engine.name, api_key=key,
        cors_origins=[o.strip() for o in ns.cors_origins.split(",") if o.strip()],
        max_queue=ns.max_queue, max_batch=ns.max_batch_size, max_model_len=ns.max_model_len,
        default_max_tokens=ns.max_tokens, cuda_graphs=not ns.enforce_eager,
        kv_cache_fraction=ns.kv_cache_fraction, max_request_bytes=ns.max_request_bytes,
        media=MediaPolicy(ns.media_dir, ns.allow_remote_media))
    if not key and not is_loopback(ns.host):
        log.warning("serving on %s without an API key: anyone who can reach this address can "
                    "use the model; set API_KEY or --api_key", ns.host)
    try:
        sock = bind_socket(ns.host, ns.port)
    except OSError as exc:
        raise ConfigError(f"--host {ns.host} --port {ns.port}: cannot listen there ({exc}); "
                          "choose another port") from None
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"tunesmith api: serving {settings.model_name!r} on http://{shown}:{port}/v1 "
          f"({'API key required' if key else 'no API key'})", flush=True)
    build_server(create_app(engine, settings), access_log=ns.access_log).run(sockets=[sock])
    return 0


def _check_limits(ns: argparse.Namespace) -> None:
    if min(ns.max_queue, ns.max_tokens, ns.max_batch_size, ns.max_request_bytes) < 1 or \
            ns.max_model_len < 0:
        raise ConfigError("--max_queue, --max_tokens, --max_batch_size and "
                          "--max_request_bytes must be >= 1, --max_model_len >= 0")
    if not 0 < ns.kv_cache_fraction <= 1:
        raise ConfigError(f"--kv_cache_fraction {ns.kv_cache_fraction} must be in (0, 1]")


def delegate(ns: argparse.Namespace, key: str) -> int:
    """Serve through vLLM or SGLang (infer_backend), with tunesmith's model resolution."""
    from pathlib import Path

    from tunesmith.adapters.saved import saved_chat_template
    from tunesmith.cli.chat_args import model_args
    from tunesmith.data.template import load_template_source
    from tunesmith.infer.engine import check_adapters
    from tunesmith.models.provision import resolve_model_path
    from tunesmith.serve.backends import DelegateSpec, check_backend, run_backend

    model, adapters, template, backend = model_args(ns)
    check_backend(backend)
    check_adapters(adapters)
    if len(adapters) > 1:
        raise ConfigError(f"infer_backend: {backend} serves one adapter, got {len(adapters)}; "
                          "merge them first (tunesmith export) and serve the merged model")
    trained = saved_chat_template(adapters)
    requested = load_template_source(template, None)[1] if template else ""
    if trained and requested and trained.strip() != requested.strip():
        raise ConfigError(f"template: {template!r} differs from the chat template the adapter "
                          f"{adapters[-1]!r} was trained with; drop template to use its own")
    source = trained or requested
    spec = DelegateSpec(
        model=resolve_model_path(model), adapter=adapters[0] if adapters else "",
        served_name=ns.served_model_name or Path(adapters[-1] if adapters else model).name,
        host=ns.host, port=ns.port, api_key=key, max_model_len=ns.max_model_len,
        chat_template=source, trust_remote_code=ns.trust_remote_code)
    return run_backend(backend, spec)

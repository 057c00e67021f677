"""`tunesmith webui`: serve the web UI (loopback by default, optional login)."""

from __future__ import annotations

import argparse

from tunesmith.errors import ConfigError


def parse_auth(text: str) -> tuple[str, str] | None:
    """`user:password` -> (user, password); empty -> no login."""
    if not text:
        return None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise ConfigError("webui --auth: expected user:password (or set TUNESMITH_WEBUI_AUTH "
                          "the same way)")
    return user, password


def cmd_webui(args: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tunesmith webui")
    p.add_argument("--work_dir", default=".", help="working folder: data/, saves/, exports/ "
                   "and jobs/ live here; every path in the UI must stay inside it")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback "
                   "only; 0.0.0.0 exposes the UI to the network: set --auth then)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--auth", default="", help="user:password required to open the page "
                   "(default: $TUNESMITH_WEBUI_AUTH, else no login)")
    p.add_argument("--share", action="store_true", help="also open a public gradio share link")
    from tunesmith.cli.arguments import parse_verb_args

    ns = parse_verb_args(p, args)
    from tunesmith.cli.setup import setup_process
    from tunesmith.config.environment import webui_auth
    from tunesmith.webui.app import ServerOptions, build_app, launch

    setup_process()
    options = ServerOptions(ns.host, ns.port, parse_auth(ns.auth or webui_auth()), ns.share)
    if options.host not in ("127.0.0.1", "localhost", "::1") and options.auth is None:
        print(f"warning: serving on {options.host} without a login; anyone who can reach "
              "this address can start jobs (use --auth user:password)")
    launch(build_app(ns.work_dir), options)
    return 0

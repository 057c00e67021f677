"""Web UI uploads: traversal names, symlinks (as the upload and as the target), files over
the limit and wrong types are refused, a good file is stored, and nothing is written
outside the working folder."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

LIMIT = 1 << 20


def _tree(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "link"
            for p in sorted(folder.rglob("*")) if p.is_file() or p.is_symlink()}


def _cases(incoming: Path, outside: Path, ws_data: Path) -> list[tuple[str, Path, bool]]:
    """(what, uploaded file path, should be stored)."""
    good = json.dumps([{"instruction": "q", "output": "a"}]).encode()

    def make(name: str, data: bytes = good) -> Path:
        folder = incoming / hashlib.sha1(name.encode()).hexdigest()[:8]
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_bytes(data)
        return path

    secret = outside / "secret.json"
    link = incoming / "links" / "innocent.json"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(secret)
    (ws_data / "planted.json").symlink_to(outside / "target.json")  # a link already there
    huge = make("huge.jsonl", b"")
    os.truncate(huge, LIMIT + 1)
    cases = [("good file", make("good.json"), True)]
    cases += [(f"traversal name {n!r}", make(n), False) for n in (
        "...", "..json", "..\\..\\evil.json", "%2e%2e%2fevil.json", ".hidden.json",
        "evil.json\n", "a" * 200 + ".json")]
    cases += [("symlink as the upload", link, False),
              ("symlink as the target", make("planted.json"), False),
              ("file over the limit", huge, False),
              ("wrong suffix .exe", make("tool.exe", b"MZ\x90\x00"), False),
              ("wrong suffix .png", make("img.png", b"\x89PNG\r\n"), False),
              ("binary inside .json", make("bin.json", b"\x00\x01\x02\xff" * 64), False),
              ("text inside .parquet", make("fake.parquet", b"instruction,output\n"), False),
              ("latin-1 inside .csv", make("old.csv", "é,ü\n".encode("latin-1") * 10), False)]
    return cases


def upload_campaign(work: Path) -> dict[str, Any]:
    from tunesmith.webui.data_tab import DataActions
    from tunesmith.webui.workspace import Workspace

    outside = work / "outside"
    outside.mkdir(parents=True)
    (outside / "secret.json").write_text('[{"instruction": "secret", "output": "x"}]')
    ws = Workspace.create(work / "ws")
    actions = DataActions(ws, max_upload_bytes=LIMIT)
    cases = _cases(work / "incoming", outside, ws.data_dir)
    before_outside = _tree(outside)
    good, notes = 0, []
    for what, path, stored in cases:
        before = set(os.listdir(ws.data_dir))
        message, _ = actions.upload(str(path))
        added = set(os.listdir(ws.data_dir)) - before
        ok = (not message.startswith("**Error**") and len(added) == 1) if stored else (
            message.startswith("**Error**") and not added)
        good += ok
        if not ok:
            notes.append(f"{what}: {message[:160]!r} added={sorted(added)}")
    untouched = _tree(outside) == before_outside and not (outside / "target.json").exists()
    return {"fault": "web UI uploads", "count": len(cases), "ok": good if untouched else 0,
            "how": "traversal names, symlinks (upload and target), a file over the limit, "
                   "wrong suffixes and wrong contents, through the Data tab's upload action",
            "notes": notes[:5] + ([] if untouched else ["a file outside was written"])}

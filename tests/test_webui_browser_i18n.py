"""The web UI for everyone, in headless Chromium: the browser's language picks Chinese or
English and the switch changes every text; a job started from the hardware section runs as
2 processes (gloo on CPU); the page fits a phone's width; the form is keyboard reachable."""

from __future__ import annotations

import json

import pytest

from webui_browser import (
    browser_page,
    choose,
    field,
    make_workspace,
    pick,
    press_until,
    require_chromium,
    screenshot,
    serve,
    set_job_environment,
    wait_text,
)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    require_chromium()
    work = make_workspace(tmp_path_factory.mktemp("webui-i18n"), tiny_llama_dir)
    with pytest.MonkeyPatch.context() as mp:
        set_job_environment(mp, work)
        with serve(work) as url:
            yield work, url


def _tab_names(page) -> list[str]:
    return [t.strip() for t in page.get_by_role("tab").all_inner_texts()]


def test_chinese_browser_gets_chinese_and_the_switch_changes_every_text(server):
    _, url = server
    with browser_page(url, locale="zh-CN") as page:
        page.wait_for_function("[...document.querySelectorAll('[role=tab]')]"
                               ".some(t => t.innerText.includes('训练'))")
        assert _tab_names(page)[:5] == ["数据", "训练", "评估", "对话", "导出"]
        page.get_by_role("tab", name="训练").click()
        wait_text(page, "#train-start", "开始")
        wait_text(page, "#cfg-lora_rank", "LoRA 秩 r")  # a config key's help
        wait_text(page, "#hw-section", "硬件")
        screenshot(page, "train-zh")
        page.locator("#train-preview").click()  # a message from the server, in Chinese
        wait_text(page, "#train-message", "model_name_or_path：未设置")

        page.locator("#lang").get_by_text("English").click()
        page.wait_for_function("[...document.querySelectorAll('[role=tab]')]"
                               ".some(t => t.innerText.includes('Train'))")
        assert _tab_names(page)[:5] == ["Data", "Train", "Evaluate", "Chat", "Export"]
        wait_text(page, "#train-start", "Start")
        wait_text(page, "#cfg-lora_rank", "LoRA rank r.")
        page.locator("#train-preview").click()
        wait_text(page, "#train-message", "not set; pick a model")
        screenshot(page, "train-en")


def test_english_browser_gets_english(server):
    _, url = server
    with browser_page(url, locale="en-US") as page:
        page.get_by_role("tab", name="Train").click()
        wait_text(page, "#train-start", "Start")
        assert "中文" in page.locator("#lang").inner_text()  # the switch offers Chinese


def test_hardware_section_runs_two_processes_with_gloo(server):
    work, url = server
    with browser_page(url, locale="en-US") as page:
        page.get_by_role("tab", name="Train").click()
        pick(page, "cfg-model_name_or_path", "models/tiny")
        pick(page, "cfg-dataset", "data/train.json")
        for key, value in {"max_steps": "4", "logging_steps": "1", "save_steps": "0",
                           "per_device_train_batch_size": "2", "lora_rank": "4",
                           "output_dir": "saves/two-procs"}.items():
            field(page, f"cfg-{key}").fill(value)
        page.locator("#hw-section").get_by_text("Hardware").click()
        field(page, "hw-processes").fill("2")
        choose(page, "hw-strategy", "ddp")
        choose(page, "hw-backend", "gloo")
        press_until(page, "#train-preview",
                    "document.querySelector('#train-cli textarea, #train-cli input')"
                    ".value.startsWith('NPROC_PER_NODE=2 ')")
        wait_text(page, "#train-yaml", "ddp_backend: gloo")
        screenshot(page, "train-hardware")
        page.locator("#train-start").click()
        wait_text(page, "#train-message", "Started job")
        summary = work / "saves" / "two-procs" / "run_summary.json"
        page.wait_for_function(
            "() => (document.querySelector('#train-progress textarea, #train-progress input')"
            "?.value || '').startsWith('finished')", timeout=180_000)
    record = json.loads(summary.read_text())
    assert record["performance"]["world_size"] == 2, record["performance"]
    assert record["performance"]["strategy"] == "ddp"


def test_page_fits_a_phone_and_is_keyboard_reachable(server):
    _, url = server
    with browser_page(url, locale="en-US", width=390, height=844) as page:
        page.get_by_role("tab", name="Train").click()
        page.locator("#train-start").wait_for()
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"the page is {overflow}px wider than a 390px phone"
        screenshot(page, "train-phone")
        # Tab from the language switch reaches the Preview button; Enter presses it.
        page.locator("#lang input").first.focus()
        for _ in range(400):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement?.id") == "train-preview":
                break
        else:
            raise AssertionError("the Preview button is not reachable with Tab")
        page.keyboard.press("Enter")  # the server answers (the form may hold an earlier job)
        page.wait_for_function("(document.querySelector('#train-message')?.innerText || '')"
                               ".trim().length > 0")

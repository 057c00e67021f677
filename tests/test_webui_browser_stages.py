"""Every stage in headless Chromium: the stage picks which keys the form shows (in a Chinese
browser); the Data tab shows a preference pair as prompt + chosen + rejected and media rows as
thumbnails with their token counts; a DPO run started from the page draws its reward curves
next to the loss. One server for the module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tiny_vl import write_mm_dataset
from webui_browser import (
    ARTIFACTS,
    browser_page,
    choose,
    field,
    make_workspace,
    pick,
    require_chromium,
    screenshot,
    serve,
    set_job_environment,
    wait_text,
)

pytestmark = pytest.mark.browser
PREF = Path(__file__).parent / "fixtures" / "lf_pref"


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tiny_vl_dir, tmp_path_factory):
    require_chromium()
    work = make_workspace(tmp_path_factory.mktemp("webui-stages"), tiny_llama_dir)
    shutil.copytree(tiny_vl_dir, work / "models" / "vl")
    data = write_mm_dataset(work / "data")  # writes dataset_info.json with `mm`
    info = json.loads((data / "dataset_info.json").read_text())
    info.update(json.loads((PREF / "dataset_info.json").read_text()))
    (data / "dataset_info.json").write_text(json.dumps(info))
    for name in ("dpo_en_demo.json", "kto_en_demo.json"):
        shutil.copy(PREF / name, data / name)
    with pytest.MonkeyPatch.context() as mp:
        set_job_environment(mp, work)
        with serve(work) as url:
            yield work, url


def _shown(page, *keys: str) -> None:
    for key in keys:
        expect(page.locator(f"#cfg-{key}")).to_be_visible()


def _hidden(page, *keys: str) -> None:
    for key in keys:
        expect(page.locator(f"#cfg-{key}")).to_be_hidden()


def test_each_stage_shows_its_keys_in_a_chinese_browser(server):
    _, url = server
    with browser_page(url, locale="zh-CN") as page:
        page.wait_for_function("[...document.querySelectorAll('[role=tab]')]"
                               ".some(t => t.innerText.includes('训练'))")
        page.get_by_role("tab", name="训练").click()
        _hidden(page, "pref_beta", "kto_chosen_weight")
        expect(page.locator("#section-preference")).to_be_hidden()
        choose(page, "cfg-stage", "dpo")
        _shown(page, "pref_beta", "pref_loss", "simpo_gamma", "ref_model")
        _hidden(page, "kto_chosen_weight", "kto_rejected_weight")
        wait_text(page, "#section-preference", "偏好训练")
        wait_text(page, "#cfg-pref_beta", "向参考模型靠拢的强度")  # the key's help, in Chinese
        ARTIFACTS.mkdir(parents=True, exist_ok=True)  # the section alone: the page is long
        page.locator("#section-preference").screenshot(path=str(ARTIFACTS / "train-dpo-keys-zh.png"))
        choose(page, "cfg-stage", "kto")
        _shown(page, "pref_beta", "kto_chosen_weight", "kto_rejected_weight")
        _hidden(page, "pref_loss", "simpo_gamma")
        choose(page, "cfg-stage", "pt")  # plain text: no prompt to mask, no preference keys
        _hidden(page, "pref_beta", "train_on_prompt")


def test_data_tab_shows_pairs_and_media_with_token_counts(server):
    _, url = server
    with browser_page(url, locale="en-US") as page:
        page.get_by_role("tab", name="Data").click()
        pick(page, "data-dataset", "dpo_en_demo")
        pick(page, "data-model", "models/tiny")
        field(page, "data-samples-shown").fill("1")
        page.locator("#data-preview").click()
        wait_text(page, "#data-samples", "──── rejected ────")
        samples = page.locator("#data-samples").inner_text()
        assert samples.index("── prompt") < samples.index("── chosen") < samples.index(
            "── rejected")
        raw = json.loads((PREF / "dpo_en_demo.json").read_text())[0]
        for answer in (raw["chosen"]["value"], raw["rejected"]["value"]):
            assert answer[:25] in samples
        columns = page.locator("#data-pair-columns")  # the same pair, side by side
        expect(columns.locator("td.chosen")).to_contain_text(raw["chosen"]["value"][:25])
        expect(columns.locator("td.rejected")).to_contain_text(raw["rejected"]["value"][:25])
        chosen_box = columns.locator("td.chosen").bounding_box()
        rejected_box = columns.locator("td.rejected").bounding_box()
        assert rejected_box["x"] > chosen_box["x"] + chosen_box["width"] - 1  # two columns
        screenshot(page, "data-pairs")

        pick(page, "data-dataset", "mm")
        pick(page, "data-model", "models/vl")
        field(page, "data-samples-shown").fill("3")
        page.locator("#data-preview").click()
        wait_text(page, "#data-media-tokens", "total tokens")
        expect(page.locator("#data-media img")).to_have_count(4)  # 1 + 2 images, 1 video
        table = page.locator("#data-media-tokens").inner_text()
        assert "data/mm.json" in table and " + " in table  # two images: tokens of each
        wait_text(page, "#data-media", "tokens")  # captions: row, size, tokens
        screenshot(page, "data-media")


def test_dpo_run_draws_reward_curves_next_to_the_loss(server):
    work, url = server
    with browser_page(url, locale="en-US") as page:
        page.get_by_role("tab", name="Train").click()
        choose(page, "cfg-stage", "dpo")
        pick(page, "cfg-model_name_or_path", "models/tiny")
        pick(page, "cfg-dataset", "dpo_en_demo")
        for key, value in {"max_steps": "4", "logging_steps": "1", "save_steps": "0",
                           "per_device_train_batch_size": "2", "lora_rank": "4",
                           "cutoff_len": "256", "learning_rate": "0.001",
                           "output_dir": "saves/ui-dpo"}.items():
            field(page, f"cfg-{key}").fill(value)
        expect(page.locator("#train-rewards")).to_be_hidden()
        page.locator("#train-start").click()
        wait_text(page, "#train-message", "Started job")
        page.wait_for_function(
            "() => (document.querySelector('#train-progress textarea, #train-progress input')"
            "?.value || '').startsWith('finished')", timeout=120_000)
        expect(page.locator("#train-rewards")).to_be_visible()
        # one line per series: chosen, rejected, margins, accuracies
        page.wait_for_function(
            "() => document.querySelectorAll('#train-rewards .mark-line path').length >= 4")
        for series in ("chosen", "rejected", "margins", "accuracies"):
            wait_text(page, "#train-rewards", series)
        screenshot(page, "train-dpo")
    records = [json.loads(x) for x in
               (work / "saves" / "ui-dpo" / "metrics.jsonl").read_text().splitlines()]
    assert sum("rewards/margins" in r for r in records) == 4


def _answers(page) -> list[str]:
    return page.evaluate("[...document.querySelectorAll('#chat-box [data-testid=bot]')]"
                         ".map(b => b.innerText.trim())")


def _wait_answers(page, n: int) -> list[str]:
    """Wait until the chat holds `n` finished answers (not the loading placeholder)."""
    page.wait_for_function(
        "n => { const b = [...document.querySelectorAll('#chat-box [data-testid=bot]')]"
        ".map(x => x.innerText.trim()); return b.length === n && b.every(t => t.length > 0 "
        "&& !t.includes('Loading content')); }", arg=n, timeout=60_000)
    return _answers(page)


def test_image_chat_in_a_chinese_browser(server):
    """Chat with a vision-language model: the uploaded picture shows in the chat, the
    model answers, and a follow-up question (no new upload) still works with the picture
    kept in the conversation; the tab's own messages are in Chinese."""
    work, url = server
    image = work / "data" / "pics" / "b.jpg"
    with browser_page(url, locale="zh-CN") as page:
        page.get_by_role("tab", name="对话").click()
        pick(page, "chat-model", "models/vl")
        page.locator("#chat-load").click()
        wait_text(page, "#chat-status", "已加载", 60_000)
        page.locator("#chat-image input[type=file]").set_input_files(str(image))
        expect(page.locator("#chat-image img")).to_have_count(1)
        field(page, "chat-max-new").fill("6")
        field(page, "chat-temperature").fill("0")
        field(page, "chat-input").fill("图里是什么？")
        page.locator("#chat-send").click()
        _wait_answers(page, 1)
        expect(page.locator("#chat-box [data-testid=user] img")).to_have_count(1)
        page.locator("#chat-image button[aria-label='Remove Image']").click()
        expect(page.locator("#chat-image img")).to_have_count(0)  # the next question brings none
        field(page, "chat-input").fill("它是什么颜色？")
        page.locator("#chat-send").click()
        answers = _wait_answers(page, 2)
        assert not any("错误" in a or "error" in a for a in answers), answers
        expect(page.locator("#chat-box [data-testid=user] img")).to_have_count(1)  # kept
        screenshot(page, "chat-image-zh")

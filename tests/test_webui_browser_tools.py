"""Evaluate and Export in headless Chromium: the tabs write the YAML of `tunesmith eval` /
`tunesmith export`, run it as a job, and show the scores / the exported files.
"""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from webui_browser import (
    browser_page,
    field,
    make_finished_run,
    make_workspace,
    pick,
    require_chromium,
    screenshot,
    serve,
    set_job_environment,
    wait_for_status,
)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser_tab(tiny_llama_dir, tmp_path_factory):
    require_chromium()
    work = make_workspace(tmp_path_factory.mktemp("webui-tools"), tiny_llama_dir)
    with pytest.MonkeyPatch.context() as mp:
        set_job_environment(mp, work)
        make_finished_run(work)
        with serve(work) as url, browser_page(url) as pg:
            yield pg, work


@pytest.fixture
def page(browser_tab):
    pg, work = browser_tab
    pg.reload()
    return pg, work


def test_evaluate_loss_of_a_finished_run(page):
    pg, work = page
    pg.get_by_role("tab", name="Evaluate").click()
    pick(pg, "eval-run", "saves/done")
    expect(field(pg, "eval-output")).to_have_value("saves/done-eval")  # filled from the run
    pick(pg, "eval-mode", "loss")
    pick(pg, "eval-dataset", "data/train.json")
    field(pg, "eval-output").fill("saves/done-eval")
    pg.locator("#eval-start").click()
    pg.wait_for_function(
        "document.querySelector('#eval-message').innerText.includes('Started job')")
    status = wait_for_status(pg, "eval", 90)
    screenshot(pg, "evaluate-result")
    assert status.startswith("finished"), f"{status}\n{field(pg, 'eval-log').input_value()}"
    results = {p.name: json.loads(p.read_text()) for p in (work / "saves" / "done-eval")
               .glob("*.json")}
    assert any("loss" in json.dumps(r) for r in results.values()), results
    assert "loss" in pg.locator("#eval-results").inner_text()


@pytest.mark.parametrize("fmt, suffix", [("hf", ".safetensors"), ("gguf", ".gguf")])
def test_export_a_finished_run(page, fmt, suffix):
    pg, work = page
    pg.get_by_role("tab", name="Export").click()
    pick(pg, "export-run", "saves/done")
    expect(field(pg, "export-dir")).to_have_value("exports/done")  # filled from the run
    field(pg, "export-dir").fill(f"exports/done-{fmt}")
    field(pg, "export-dir").press("Tab")
    radio = pg.locator("#export-format").get_by_label(fmt, exact=True)
    radio.check()
    expect(field(pg, "export-dir")).to_have_value(f"exports/done-{fmt}")
    expect(radio).to_be_checked()
    pg.locator("#export-start").click()
    pg.wait_for_function(
        "document.querySelector('#export-message').innerText.includes('Started job')")
    # the status shown must be this job's, not the one exported before it
    job_id = re.search(r"Started job (\S+?):", pg.locator("#export-message").inner_text())[1]
    expect(field(pg, "export-job")).to_have_value(job_id)
    out = work / "exports" / f"done-{fmt}"
    for _ in range(480):  # the job's own output (the status box may still show the last job)
        if any(p.suffix == suffix for p in out.rglob("*")):
            break
        pg.wait_for_timeout(250)
    status = wait_for_status(pg, "export", 120)
    screenshot(pg, f"export-{fmt}-result")
    assert status.startswith("finished"), f"{status}\n{field(pg, 'export-log').input_value()}"
    assert any(p.suffix == suffix for p in out.rglob("*")), (
        sorted(out.rglob("*")), field(pg, "export-log").input_value())
    expect(pg.locator("#export-results")).to_contain_text(f"done-{fmt}")

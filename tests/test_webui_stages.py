"""The web UI for every stage, without a browser: each stage's form keys, preference and KTO
rows rendered with the tokens the loss sees, media thumbnails with the token counts training
uses and missing files named by file:line, reward curves of preference runs, and Evaluate /
Export messages in both languages."""

from __future__ import annotations

import json
import shutil
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from tunesmith.config.preference import PreferenceConfig
from tunesmith.config.schema import field_index
from tunesmith.webui.data_tab import DataActions
from tunesmith.webui.form import form_fields
from tunesmith.webui.hardware import Hardware
from tunesmith.webui.jobs import JobRunner
from tunesmith.webui.monitor import read_run
from tunesmith.webui.stage_form import STAGE_KEYS, section_visible, visible
from tunesmith.webui.tool_tabs import ToolActions
from tunesmith.webui.train_tab import HARDWARE_FIELDS, TrainActions
from tunesmith.webui.workspace import Workspace

FIXTURES = Path(__file__).parent / "fixtures" / "lf_pref"


@pytest.fixture
def ws(tmp_path) -> Workspace:
    work = Workspace.create(tmp_path / "work")
    shutil.rmtree(work.data_dir)
    shutil.copytree(FIXTURES, work.data_dir)
    return work


def test_each_stage_shows_its_keys():
    assert set(STAGE_KEYS) <= set(field_index())
    assert {f.name for f in fields(PreferenceConfig)} <= set(STAGE_KEYS)  # none forgotten
    assert visible("pref_beta", "dpo") and visible("pref_beta", "kto")
    assert not visible("pref_beta", "sft") and not visible("pref_loss", "kto")
    assert visible("kto_chosen_weight", "kto") and not visible("kto_chosen_weight", "dpo")
    assert not visible("train_on_prompt", "pt") and visible("train_on_prompt", "sft")
    assert visible("learning_rate", "rm")
    assert not section_visible("preference", "sft") and section_visible("preference", "dpo")
    assert not section_visible("preference", "rm")


def _form(actions: TrainActions, **values) -> tuple:
    specs = {s.key: s for s in form_fields()}
    form = [values.get(k, specs[k].default) for k in actions.keys]
    hw = Hardware()
    return (*form, *[getattr(hw, f) for f in HARDWARE_FIELDS], "en")


def test_a_hidden_key_goes_to_the_job_at_its_default(ws):
    actions = TrainActions(ws, JobRunner(ws), [s.key for s in form_fields()])
    base = dict(model_name_or_path="tiny", dataset=["dpo_en_demo"], output_dir="saves/r",
                pref_beta=0.5, kto_chosen_weight=2.0)
    dpo = yaml.safe_load(actions.preview(*_form(actions, stage="dpo", **base))[0])
    assert dpo["stage"] == "dpo" and dpo["pref_beta"] == 0.5
    assert "kto_chosen_weight" not in dpo  # a kto key typed earlier, hidden for dpo
    sft = yaml.safe_load(actions.preview(*_form(actions, **{**base, "stage": "sft",
                                                            "dataset": ["identity"]}))[0])
    assert "pref_beta" not in sft and "stage" not in sft
    for stage, dataset, said in (
            ("kto", "dpo_en_demo", "holds preference pairs (ranking: true); stage kto needs"),
            ("dpo", "kto_en_demo", "has kto_tag labels"),
            ("ppo", "dpo_en_demo", "reward_model: not set; stage ppo needs the reward "
                                   "model"),
            ("ppo", "dpo_en_demo", "stage ppo needs plain examples")):
        refused = actions.preview(*_form(actions, **{**base, "stage": stage,
                                                     "dataset": [dataset]}))
        assert refused[0] == "" and said in refused[2], (stage, refused[2])
    clash = actions.preview(*_form(actions, **base, stage="dpo", pref_loss="ipo",
                                   dpo_label_smoothing=0.1))
    assert "dpo_label_smoothing: 0.1 applies to pref_loss sigmoid only" in clash[2]
    updates = actions.stage_view("kto")
    shown = dict(zip([k for k in STAGE_KEYS if k in actions.keys], updates, strict=False))
    assert shown["kto_chosen_weight"]["visible"] and not shown["pref_loss"]["visible"]
    assert updates[-2]["visible"] and not updates[-1]["visible"]  # preference, ppo sections
    ppo = dict(zip([k for k in STAGE_KEYS if k in actions.keys], actions.stage_view("ppo"),
                   strict=False))
    assert ppo["ppo_epochs"]["visible"] and not ppo["pref_beta"]["visible"]


def test_pairs_show_prompt_chosen_and_rejected_and_kto_rows_their_label(ws, tiny_llama_dir):
    shutil.copytree(tiny_llama_dir, ws.root / "models" / "tiny")
    actions = DataActions(ws)
    figures, pieces, bad, thumbs, _, pairs = actions.preview("dpo_en_demo", "models/tiny", "",
                                                             2048, 1, "en")
    assert "| preference pairs | 16 |" in figures
    raw = json.loads((FIXTURES / "dpo_en_demo.json").read_text())[0]
    labelled = {label: "".join(t for t, k in pieces if k == label) for label in
                ("chosen", "rejected")}
    assert raw["chosen"]["value"][:30] in labelled["chosen"]
    assert raw["rejected"]["value"][:30] in labelled["rejected"]
    whole = "".join(t for t, _ in pieces)
    question = raw["conversations"][0]["value"][:30]
    assert whole.count(question) == 1  # the shared prompt, once
    assert whole.index("── prompt") < whole.index("── chosen") < whole.index("── rejected")
    assert bad == "" and not thumbs["visible"]
    # side by side: one table, the prompt across it, chosen | rejected in their own cells
    import html as html_lib
    import re

    assert pairs["visible"] and pairs["value"].count("<table") == 1
    cells = {c: html_lib.unescape(re.sub("<[^>]+>", "", v)) for c, v in re.findall(
        r'<td class="(chosen|rejected)"[^>]*>(.*?)</td>', pairs["value"], flags=re.S)}
    assert raw["chosen"]["value"][:30] in cells["chosen"]
    assert raw["rejected"]["value"][:30] in cells["rejected"]
    assert raw["rejected"]["value"][:30] not in cells["chosen"]
    assert "<mark>" in pairs["value"]  # the trained tokens are marked

    figures, pieces, _, _, _, pairs = actions.preview("kto_en_demo", "models/tiny", "", 2048, 3,
                                                      "zh")
    assert not pairs["visible"]  # KTO rows are single answers
    rows = json.loads((FIXTURES / "kto_en_demo.json").read_text())
    good = sum(r["label"] for r in rows)
    assert f"| kto desirable | {good} |" in figures and good < len(rows)
    rows = rows[:3]
    labels = [k for _, k in pieces if k in ("desirable", "undesirable")]
    assert labels == ["desirable" if r["label"] else "undesirable" for r in rows]
    assert "kto_tag：false（不期望的回答）" in "".join(t for t, _ in pieces)
    assert "data/kto_en_demo.json:" in pieces[0][0]  # the row's place, workspace-relative


def test_media_rows_show_thumbnails_and_the_token_counts_training_uses(tmp_path,
                                                                      tiny_vl_dir):
    from tiny_vl import build_vl_tokenizer, write_mm_dataset
    from tunesmith.config.schema import DataConfig
    from tunesmith.data.loading import DataContext, prepare_data
    from tunesmith.data.template import ChatRenderer, load_template_source
    from tunesmith.models.processor import read_vision_settings

    ws = Workspace.create(tmp_path / "work")
    write_mm_dataset(ws.data_dir)
    shutil.copytree(tiny_vl_dir, ws.root / "models" / "vl")
    actions = DataActions(ws)
    _, _, bad, thumbs, table, _ = actions.preview("mm", "models/vl", "qwen", 2048, 3, "en")
    thumbs = thumbs["value"]
    assert bad == "" and len(thumbs) == 4  # a.png; a.png and b.jpg; the video
    # what training stores for the same rows
    tok = build_vl_tokenizer()
    vision = read_vision_settings(tiny_vl_dir, tok, media_dirs=(str(ws.data_dir),))
    name, source = load_template_source("qwen", tok)
    ctx = DataContext(ChatRenderer(name, source, tok), tok, 42, "sft", False, vision, "vl")
    data = prepare_data(DataConfig(dataset=["mm"], dataset_dir=str(ws.data_dir),
                                   preprocessing_num_workers=1, val_size=0), ctx)
    lengths = sorted(len(s) for s in data.train)  # 4 rows: 3 with media, 1 text only
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:]]
    totals = sorted(int(r[4]) for r in rows)
    assert len(totals) == 3 and all(totals.count(n) <= lengths.count(n) for n in totals)
    image_tokens = [int(n) for n in rows[1][2].split("+")]
    assert len(image_tokens) == 2 and all(n > 0 for n in image_tokens)
    assert thumbs[2][1].startswith(f"{image_tokens[1]} tokens · image 2 ")
    assert int(rows[1][3]) + sum(image_tokens) == int(rows[1][4])

    (ws.data_dir / "pics" / "b.jpg").unlink()
    _, _, bad, thumbs, _, _ = actions.preview("mm", "models/vl", "qwen", 2048, 3, "en")
    assert "data/mm.json:1: media file 'pics/b.jpg' not found" in bad
    assert len(thumbs["value"]) == 2


def test_reward_curves_of_a_preference_run(ws):
    out = ws.saves_dir / "dpo"
    out.mkdir(parents=True)
    lines = [{"step": s, "loss": 0.7 - 0.1 * s, "total_steps": 2, "rewards/chosen": 0.1 * s,
              "rewards/rejected": -0.1 * s, "rewards/margins": 0.2 * s,
              "rewards/accuracies": 0.5 + 0.25 * s, "kl": 0.0} for s in (1, 2)]
    lines.append({"step": 2, "eval_loss": 0.6, "eval_rewards/accuracies": 0.9})
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    view = read_run(out)
    assert [(r["series"], r["value"]) for r in view.rewards[:5]] == [
        ("chosen", 0.1), ("rejected", -0.1), ("margins", 0.2), ("accuracies", 0.75), ("kl", 0)]
    assert view.rewards[-1] == {"step": 2, "value": 0.9, "series": "eval accuracies"}
    runner = JobRunner(ws)
    job = runner.launch("train", {"model_name_or_path": "missing", "output_dir": "saves/dpo"},
                        output_dir=str(out))
    actions = TrainActions(ws, runner, [s.key for s in form_fields()])
    shown = actions.watch(job.id)
    assert shown[3]["visible"] and len(shown[3]["value"]) == 11
    (out / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    assert not actions.watch(job.id)[3]["visible"]  # an SFT run: no reward plot
    ppo = {"step": 1, "loss": 0.1, "reward": 0.6, "kl": 0.2, "policy_loss": -0.01}
    (out / "metrics.jsonl").write_text(json.dumps(ppo) + "\n")
    assert [(r["series"], r["value"]) for r in read_run(out).rewards] == [("kl", 0.2),
                                                                         ("reward", 0.6)]


def test_evaluate_and_export_messages_follow_the_language(ws):
    runner = JobRunner(ws)
    evaluate, export = ToolActions(ws, runner, "eval"), ToolActions(ws, runner, "export")
    assert evaluate.watch(None, "zh")[0] == "还没有评估任务。"
    assert export.watch(None, "en")[0] == "No export job yet."
    job = runner.launch("export", {"model_name_or_path": "missing", "export_dir": "exports/x"},
                        output_dir=str(ws.root / "exports" / "x"))
    line, _, _ = export.watch(job.id, "zh")
    assert line.startswith(("running: 任务", "failed: 任务")) and "输出 exports/x" in line

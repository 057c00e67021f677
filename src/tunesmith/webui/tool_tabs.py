"""The Evaluate and Export tabs: a config written from a few fields, run as a job.

Both commands come from their own modules (`tunesmith eval`, `tunesmith export`); the UI
only writes their YAML and runs them through the job runner, like training. The keys
written are gathered here (EVAL_KEYS, export_config) so they can follow those commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gradio as gr

from tunesmith.errors import ConfigError, TunesmithError
from tunesmith.webui.data_view import dataset_choices
from tunesmith.webui.i18n import Translator, text
from tunesmith.webui.jobs import RUNNING, JobRunner, command_text, tail_text
from tunesmith.webui.runs import base_of, finished_runs, model_choices
from tunesmith.webui.workspace import Workspace, check_paths

EVAL_MODES = ("loss", "predict", "benchmark")
# mode -> the form fields it writes (besides model, adapter and output folder)
EVAL_KEYS = {"loss": ("eval_dataset", "dataset_dir", "cutoff_len", "max_samples"),
             "predict": ("eval_dataset", "dataset_dir", "cutoff_len", "max_samples",
                         "max_new_tokens"),
             "benchmark": ("task", "task_dir", "n_shot", "max_samples")}
EXPORT_FORMATS = ("hf", "gguf")
GGUF_TYPES = ("f16", "bf16", "q8_0")


def eval_config(ws: Workspace, run: str, mode: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The YAML of `tunesmith eval` for a run (or checkpoint) and a mode."""
    if mode not in EVAL_MODES:
        raise ConfigError(f"eval_mode: {mode!r} is not one of {', '.join(EVAL_MODES)}")
    model, adapters = base_of(ws, run)
    cfg: dict[str, Any] = {"model_name_or_path": model}
    if adapters:
        cfg["adapter_name_or_path"] = adapters
    # `tunesmith eval` picks its mode from the keys: task -> benchmark,
    # predict_with_generate -> predict, otherwise loss and perplexity
    if mode == "predict":
        cfg["predict_with_generate"] = True
    for key in EVAL_KEYS[mode]:
        value = fields.get(key)
        if value not in (None, "", []):
            cfg[key] = int(value) if isinstance(value, float) and value.is_integer() else value
    cfg["output_dir"] = fields["output_dir"]
    if mode == "benchmark":
        cfg["save_dir"] = fields["output_dir"]
    return cfg


def export_config(ws: Workspace, run: str, export_dir: str, export_format: str,
                  gguf_type: str, export_size: float) -> dict[str, Any]:
    """The YAML of `tunesmith export` for a run (or checkpoint)."""
    if export_format not in EXPORT_FORMATS:
        raise ConfigError(f"export_format: {export_format!r} is not one of hf, gguf")
    if export_format == "gguf" and gguf_type not in GGUF_TYPES:
        raise ConfigError(f"gguf_type: {gguf_type!r} is not one of {', '.join(GGUF_TYPES)}")
    model, adapters = base_of(ws, run)
    cfg: dict[str, Any] = {"model_name_or_path": model}
    if adapters:
        cfg["adapter_name_or_path"] = adapters
    cfg.update(export_dir=export_dir, export_size=int(export_size), export_format=export_format)
    if export_format == "gguf":
        cfg["gguf_type"] = gguf_type
    return cfg


class ToolActions:
    """Launch and watch the jobs of one command (eval or export)."""

    def __init__(self, ws: Workspace, runner: JobRunner, command: str):
        self.ws, self.runner, self.command = ws, runner, command

    def launch(self, cfg: dict[str, Any], out_key: str, lang: str = "en") -> tuple[str, Any]:
        known = set(dataset_choices(self.ws.data_dir)) | set(model_choices(self.ws))
        problems = check_paths(self.ws, cfg, known)
        if problems:
            raise ConfigError(problems)
        out = self.ws.inside(str(cfg[out_key]), out_key)
        job = self.runner.launch(self.command, cfg, output_dir=str(out))
        return (text("train.started", lang, id=job.id,
                     command=command_text(self.command, job.config)),
                gr.update(choices=[j.id for j in self.runner.list(self.command)], value=job.id))

    def watch(self, job_id: str | None, lang: str = "en") -> tuple[str, str, str]:
        """(status line, log tail, results) of a job. The line starts with the status word
        in English in every language (the browser tests and scripts read it)."""
        if not job_id:
            return (text("tools.no_eval_job", lang) if self.command == "eval"
                    else text("tools.no_export_job", lang)), "", ""
        try:
            job = self.runner.get(job_id)
        except TunesmithError as exc:
            return str(exc), "", ""
        status = self.runner.status(job)
        line = text("tools.status_line", lang, status=status, id=job.id,
                    output=self.ws.relative(Path(job.output_dir)))
        results = "" if status == RUNNING else self._results(Path(job.output_dir), lang)
        return line, tail_text(job.log_path, lines=20), results

    def _results(self, out: Path, lang: str) -> str:
        if not out.is_dir():
            return text("tools.no_output_folder", lang)
        if self.command == "eval":
            found = {p.name: _read_json(p) for p in sorted(out.glob("*.json"))}
            return (json.dumps(found, indent=1, ensure_ascii=False)[:20000] if found
                    else text("tools.no_results_file", lang))
        files = sorted(p for p in out.rglob("*") if p.is_file())
        return f"{out}\n" + "\n".join(f"  {p.relative_to(out)}  {p.stat().st_size / 2**20:.2f} MiB"
                                      for p in files)

    def jobs(self) -> Any:
        latest = self.runner.latest(self.command)
        return gr.update(choices=[j.id for j in self.runner.list(self.command)],
                         value=latest.id if latest else None)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        return f"({path.name}: {exc})"


def _job_panel(prefix: str, tr: Translator) -> tuple[Any, Any, Any, Any]:
    job_box = tr(gr.Dropdown, label="@job.job", choices=[], value=None, elem_id=f"{prefix}-job")
    status = tr(gr.Textbox, label="@job.status", elem_id=f"{prefix}-status")
    log_box = tr(gr.Textbox, label="@job.log", lines=8, max_lines=8, elem_id=f"{prefix}-log")
    results = tr(gr.Code, label="@job.results", language="json", elem_id=f"{prefix}-results")
    return job_box, status, log_box, results


def _error(exc: Exception | str, lang: str) -> str:
    return f"**{text('common.error', lang)}**: {exc}"


def build_eval_tab(ws: Workspace, runner: JobRunner, tr: Translator, lang: Any
                   ) -> dict[str, Any]:
    actions = ToolActions(ws, runner, "eval")
    with gr.Row():
        run = tr(gr.Dropdown, finished_runs(ws), value=None, label="@tools.run",
                 allow_custom_value=True, elem_id="eval-run")
        mode = tr(gr.Dropdown, list(EVAL_MODES), value="loss", label="eval_mode",
                  info="@eval.mode_info", elem_id="eval-mode")
        out = tr(gr.Textbox, label="output_dir", info="@field:output_dir", value="saves/eval",
                 elem_id="eval-output")
    with gr.Row():
        data = gr.Dropdown(dataset_choices(ws.data_dir), value=[], multiselect=True,
                           label="eval_dataset",
                           allow_custom_value=True, elem_id="eval-dataset")
        cutoff = tr(gr.Number, 2048, precision=0, minimum=8, label="cutoff_len",
                    info="@field:cutoff_len")
        max_samples = tr(gr.Number, 0, precision=0, minimum=0, label="max_samples",
                         info="@field:max_samples")
        max_new = tr(gr.Number, 128, precision=0, minimum=1, label="max_new_tokens",
                     info="@field:max_new_tokens")
    with gr.Row():
        task = tr(gr.Textbox, label="task", info="@eval.task_info", placeholder="mmlu_test")
        task_dir = tr(gr.Textbox, label="task_dir", info="@field:task_dir",
                      value="data/evaluation")
        n_shot = tr(gr.Number, 5, precision=0, minimum=0, label="n_shot", info="@field:n_shot")
    start = tr(gr.Button, value="@eval.start", variant="primary", elem_id="eval-start")
    message = gr.Markdown(elem_id="eval-message")
    job_box, status, log_box, results = _job_panel("eval", tr)

    def start_eval(run_v, mode_v, out_v, data_v, cutoff_v, max_s, max_n, task_v, task_dir_v,
                   n_shot_v, lang_v):
        fields = {"eval_dataset": data_v, "dataset_dir": "data", "cutoff_len": cutoff_v,
                  "max_samples": max_s, "max_new_tokens": max_n, "task": task_v,
                  "task_dir": task_dir_v, "n_shot": n_shot_v, "output_dir": out_v}
        try:
            if not run_v:
                raise ConfigError(text("tools.pick_run", lang_v))
            return actions.launch(eval_config(ws, run_v, mode_v, fields), "output_dir", lang_v)
        except TunesmithError as exc:
            return _error(exc, lang_v), gr.skip()

    run.focus(lambda: gr.update(choices=finished_runs(ws)), None, run)
    run.change(lambda r: f"{r}-eval" if r else gr.skip(), run, out)
    start.click(start_eval, [run, mode, out, data, cutoff, max_samples, max_new, task, task_dir,
                             n_shot, lang], [message, job_box])
    gr.Timer(1.0).tick(actions.watch, [job_box, lang], [status, log_box, results],
                       show_progress="hidden")
    return {"run": run, "job_box": job_box, "jobs": actions.jobs}


def build_export_tab(ws: Workspace, runner: JobRunner, tr: Translator, lang: Any
                     ) -> dict[str, Any]:
    actions = ToolActions(ws, runner, "export")
    with gr.Row():
        run = tr(gr.Dropdown, finished_runs(ws), value=None, label="@tools.run",
                 allow_custom_value=True, elem_id="export-run")
        out = tr(gr.Textbox, label="export_dir", info="@field:export_dir", value="exports/model",
                 elem_id="export-dir")
    with gr.Row():
        fmt = tr(gr.Radio, list(EXPORT_FORMATS), value="hf", label="export_format",
                 info="@field:export_format", elem_id="export-format")
        gtype = tr(gr.Dropdown, list(GGUF_TYPES), value="f16", label="gguf_type",
                   info="@field:gguf_type", elem_id="export-gguf-type")
        size = tr(gr.Number, 5, precision=0, minimum=1, label="export_size",
                  info="@field:export_size")
    start = tr(gr.Button, value="@export.start", variant="primary", elem_id="export-start")
    message = gr.Markdown(elem_id="export-message")
    job_box, status, log_box, results = _job_panel("export", tr)

    def start_export(run_v, out_v, fmt_v, gtype_v, size_v, lang_v):
        try:
            if not run_v:
                raise ConfigError(text("tools.pick_run", lang_v))
            return actions.launch(export_config(ws, run_v, out_v, fmt_v, gtype_v, size_v),
                                  "export_dir", lang_v)
        except TunesmithError as exc:
            return _error(exc, lang_v), gr.skip()

    run.focus(lambda: gr.update(choices=finished_runs(ws)), None, run)
    run.change(lambda r: f"exports/{Path(r).name}" if r else gr.skip(), run, out)
    start.click(start_export, [run, out, fmt, gtype, size, lang], [message, job_box])
    gr.Timer(1.0).tick(actions.watch, [job_box, lang], [status, log_box, results],
                       show_progress="hidden")
    return {"run": run, "job_box": job_box, "jobs": actions.jobs}

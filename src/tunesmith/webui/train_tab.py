"""The Train tab: the schema-generated form, Start / Stop / Resume, and the live view."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd
import yaml

from tunesmith.config.schema import SECTIONS
from tunesmith.data.template import builtin_template_names
from tunesmith.errors import ConfigError, TunesmithError
from tunesmith.webui.data_view import dataset_choices
from tunesmith.webui.form import FieldSpec, config_yaml, form_fields, form_to_config, widget_value
from tunesmith.webui.jobs import RUNNING, JobRunner, command_text, tail_text
from tunesmith.webui.monitor import RunView, figures_text, progress_text, read_run
from tunesmith.webui.runs import model_choices
from tunesmith.webui.workspace import Workspace, check_paths

MULTISELECT_KEYS = ("dataset", "eval_dataset")  # lists shown as a multi-select of datasets
SECTION_TITLES = {"model": "Model", "data": "Data", "finetuning": "Method",
                  "training": "Training", "preference": "Preference (dpo, kto, rm)"}


def _widget(spec: FieldSpec, ws: Workspace) -> gr.components.Component:
    """One form widget for one config key; the key is its label, the help its info."""
    common = dict(label=spec.key, info=spec.help, elem_id=f"cfg-{spec.key}")
    if spec.key == "model_name_or_path":
        return gr.Dropdown(model_choices(ws), value=None, allow_custom_value=True, **common)
    if spec.key == "template":
        return gr.Dropdown([""] + builtin_template_names(), value="", allow_custom_value=True,
                           **common)
    if spec.key in MULTISELECT_KEYS:
        return gr.Dropdown(dataset_choices(ws.data_dir), value=[], multiselect=True,
                           allow_custom_value=True, **common)
    if spec.key == "output_dir":
        return gr.Textbox(value=lambda: time.strftime("saves/run-%Y%m%d-%H%M%S"), **common)
    if spec.kind == "bool":
        return gr.Checkbox(value=spec.default, **common)
    if spec.choices:
        return gr.Dropdown(list(spec.choices), value=spec.default, **common)
    if spec.kind in ("int", "float"):
        return gr.Number(value=spec.default, precision=0 if spec.kind == "int" else None,
                         minimum=spec.minimum, maximum=spec.maximum, step=None if
                         spec.kind == "float" else 1, **common)
    return gr.Textbox(value=widget_value(spec, spec.default), **common)


def build_form(ws: Workspace) -> dict[str, gr.components.Component]:
    """Every config key as a widget, grouped by schema section; advanced keys folded."""
    specs = form_fields()
    widgets: dict[str, gr.components.Component] = {}
    for section in SECTIONS:
        mine = [s for s in specs if s.section == section]
        with gr.Accordion(SECTION_TITLES.get(section, section), open=True):
            _place(widgets, [s for s in mine if not s.advanced], ws)
            advanced = [s for s in mine if s.advanced]
            if advanced:
                with gr.Accordion(f"{SECTION_TITLES.get(section, section)}: advanced",
                                  open=False):
                    _place(widgets, advanced, ws)
    return widgets


def _place(widgets: dict, specs: list[FieldSpec], ws: Workspace, per_row: int = 2) -> None:
    for i in range(0, len(specs), per_row):
        with gr.Row():
            for spec in specs[i:i + per_row]:
                widgets[spec.key] = _widget(spec, ws)


class TrainActions:
    """The handlers of the Train tab (plain methods, so tests can call them directly)."""

    def __init__(self, ws: Workspace, runner: JobRunner, keys: list[str]):
        self.ws, self.runner, self.keys = ws, runner, keys

    def _prepare(self, values: tuple) -> tuple[dict[str, Any], Any]:
        changed, cfg = form_to_config(dict(zip(self.keys, values, strict=True)))
        known = set(dataset_choices(self.ws.data_dir)) | set(model_choices(self.ws))
        problems = check_paths(self.ws, cfg.to_flat(), known)
        if not cfg.model.model_name_or_path:
            problems.append("model_name_or_path: not set; pick a model")
        if not cfg.data.dataset:
            problems.append("dataset: not set; pick at least one dataset")
        if not cfg.training.output_dir:
            problems.append("output_dir: not set; e.g. saves/my-run")
        if problems:
            raise ConfigError(problems)
        return changed, cfg

    def preview(self, *values: Any) -> tuple[str, str, str]:
        try:
            changed, _ = self._prepare(values)
        except TunesmithError as exc:
            return "", "", _error(exc)
        yaml_path = self.ws.jobs_dir / "<new job>" / "train.yaml"
        return config_yaml(changed), command_text("train", yaml_path), "Preview ready."

    def start(self, *values: Any) -> tuple[str, Any]:
        try:
            changed, cfg = self._prepare(values)
            out = self.ws.inside(cfg.training.output_dir, "output_dir")
            _check_output_dir(out, cfg)
            running = [j for j in self.runner.list("train") if self.runner.status(j) == RUNNING]
            if running:
                raise TunesmithError(f"training job {running[0].id} is still running; stop it "
                                     "or wait for it to finish")
            job = self.runner.launch("train", changed, output_dir=str(out))
        except TunesmithError as exc:
            return _error(exc), gr.skip()
        return (f"Started job `{job.id}`: `{command_text('train', job.config)}`",
                self.job_choices(job.id))

    def resume(self, *values: Any) -> tuple[str, Any, str]:
        values_d = dict(zip(self.keys, values, strict=True))
        values_d["resume_from_checkpoint"] = "auto"
        message, jobs = self.start(*[values_d[k] for k in self.keys])
        return message, jobs, "auto"

    def stop(self, job_id: str | None) -> str:
        if not job_id:
            return "No job selected."
        try:
            return self.runner.stop(job_id)
        except TunesmithError as exc:
            return _error(exc)

    def form_of_job(self, job_id: str | None) -> list[Any]:
        """The form as it was when a job started (its YAML; other keys at defaults), so a
        reopened page can stop, resume or rerun it."""
        if not job_id:
            return [gr.skip() for _ in self.keys]
        try:
            saved = yaml.safe_load(Path(self.runner.get(job_id).config).read_text()) or {}
        except (TunesmithError, OSError, yaml.YAMLError):
            return [gr.skip() for _ in self.keys]
        specs = {s.key: s for s in form_fields()}
        values = []
        for key in self.keys:
            value = saved.get(key, specs[key].default)
            values.append(list(value) if key in MULTISELECT_KEYS else
                          widget_value(specs[key], value))
        return values

    def job_choices(self, selected: str | None = None) -> Any:
        jobs = self.runner.list("train")
        latest = self.runner.latest("train")
        value = selected or (latest.id if latest else None)
        return gr.update(choices=[j.id for j in jobs], value=value)

    def watch(self, job_id: str | None, shown: str = "") -> tuple[str, str, Any, str, str]:
        """Progress, figures, loss curve, log tail of a job, and the key of the curve now
        shown (the timer calls this; an unchanged curve is not sent again)."""
        if not job_id:
            return "No training job yet.", figures_text(RunView()), None, "", ""
        try:
            job = self.runner.get(job_id)
        except TunesmithError as exc:
            return _error(exc), "", None, "", ""
        view = read_run(Path(job.output_dir))
        key = f"{job_id}:{len(view.curve)}"
        curve = (pd.DataFrame(view.curve) if view.curve else None) if key != shown else (
            gr.skip())
        return (progress_text(view, self.runner.status(job)), figures_text(view), curve,
                tail_text(job.log_path, lines=25), key)


def _check_output_dir(out: Path, cfg: Any) -> None:
    t = cfg.training
    if out.is_dir() and any(out.iterdir()) and not (t.resume_from_checkpoint
                                                   or t.overwrite_output_dir):
        raise TunesmithError(f"output_dir: {t.output_dir!r} exists and is not empty; pick "
                             "another folder, tick overwrite_output_dir, or press Resume")


def _error(exc: Exception) -> str:
    return "**Error**\n\n```\n" + str(exc) + "\n```"


def build_train_tab(ws: Workspace, runner: JobRunner) -> dict[str, Any]:
    """Lay out the tab and wire its events; returns what the app wires on page load."""
    with gr.Row():
        with gr.Column(scale=3):
            widgets = build_form(ws)
        with gr.Column(scale=2):
            with gr.Row():
                preview_btn = gr.Button("Preview command", elem_id="train-preview")
                start_btn = gr.Button("Start", variant="primary", elem_id="train-start")
            with gr.Row():
                resume_btn = gr.Button("Resume", elem_id="train-resume")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="train-stop")
            message = gr.Markdown(elem_id="train-message")
            job_box = gr.Dropdown(label="job", choices=[], value=None, elem_id="train-job")
            progress = gr.Textbox(label="progress", elem_id="train-progress")
            figures = gr.Markdown(elem_id="train-figures")
            plot = gr.LinePlot(x="step", y="loss", color="series", title="loss",
                               elem_id="train-plot")
            log_box = gr.Textbox(label="log", lines=10, max_lines=10, elem_id="train-log")
            with gr.Accordion("Command preview", open=True):
                yaml_box = gr.Code(language="yaml", label="train.yaml", elem_id="train-yaml")
                cli_box = gr.Textbox(label="command", elem_id="train-cli")
    keys = list(widgets)
    actions = TrainActions(ws, runner, keys)
    inputs = [widgets[k] for k in keys]
    timer = gr.Timer(1.0)

    preview_btn.click(actions.preview, inputs, [yaml_box, cli_box, message])
    start_btn.click(actions.start, inputs, [message, job_box])
    resume_btn.click(actions.resume, inputs,
                     [message, job_box, widgets["resume_from_checkpoint"]])
    stop_btn.click(actions.stop, job_box, message)
    for key in ("dataset", "eval_dataset"):
        widgets[key].focus(lambda: gr.update(choices=dataset_choices(ws.data_dir)), None,
                           widgets[key])
    shown = gr.State("")  # which curve this page shows, so an unchanged one is not resent
    watch_out = [progress, figures, plot, log_box, shown]
    timer.tick(actions.watch, [job_box, shown], watch_out, show_progress="hidden")
    job_box.change(actions.watch, job_box, watch_out, show_progress="hidden")
    job_box.input(actions.form_of_job, job_box, inputs)  # picking a job shows its config
    return {"job_box": job_box, "job_choices": actions.job_choices,
            "form_of_job": actions.form_of_job, "inputs": inputs}

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
from tunesmith.webui.hardware import (
    DDP_BACKENDS,
    DEEPSPEED_STAGES,
    FSDP_SHARDING,
    STRATEGIES,
    Hardware,
    hardware_settings,
)
from tunesmith.webui.i18n import Translator, text
from tunesmith.webui.jobs import RUNNING, JobRunner, command_text, tail_text
from tunesmith.webui.model_hint import propose_template
from tunesmith.webui.monitor import RunView, figures_text, progress_text, read_run
from tunesmith.webui.presets import PRESET_CHOICES, preset_values
from tunesmith.webui.runs import model_choices
from tunesmith.webui.stage_form import (
    STAGE_KEYS,
    STAGE_SECTIONS,
    section_visible,
    stage_defaults,
    stage_problems,
    visible,
)
from tunesmith.webui.workspace import Workspace, check_paths

MULTISELECT_KEYS = ("dataset", "eval_dataset")  # lists shown as a multi-select of datasets


def _widget(spec: FieldSpec, ws: Workspace, tr: Translator) -> gr.components.Component:
    """One form widget for one config key; the key is its label, the help its info."""
    common = dict(label=spec.key, info=f"@field:{spec.key}", elem_id=f"cfg-{spec.key}",
                  min_width=240, visible=visible(spec.key, "sft"))
    if spec.key == "model_name_or_path":
        return tr(gr.Dropdown, model_choices(ws), value=None, allow_custom_value=True,
                  **common)
    if spec.key == "template":  # searchable: type to filter every built-in name
        return tr(gr.Dropdown, [""] + builtin_template_names(), value="",
                  allow_custom_value=True, filterable=True, **common)
    if spec.key in MULTISELECT_KEYS:
        return tr(gr.Dropdown, dataset_choices(ws.data_dir), value=[], multiselect=True,
                  allow_custom_value=True, **common)
    if spec.key == "output_dir":
        return tr(gr.Textbox, value=lambda: time.strftime("saves/run-%Y%m%d-%H%M%S"), **common)
    if spec.kind == "bool":
        return tr(gr.Checkbox, value=spec.default, **common)
    if spec.choices:
        return tr(gr.Dropdown, list(spec.choices), value=spec.default, **common)
    if spec.kind in ("int", "float"):
        return tr(gr.Number, value=spec.default, precision=0 if spec.kind == "int" else None,
                  minimum=spec.minimum, maximum=spec.maximum, step=None if
                  spec.kind == "float" else 1, **common)
    return tr(gr.Textbox, value=widget_value(spec, spec.default), **common)


def build_form(ws: Workspace, tr: Translator, accordions: dict[str, Any] | None = None
               ) -> dict[str, gr.components.Component]:
    """Every config key as a widget, grouped by schema section; advanced keys folded.
    `accordions` receives the sections whose keys belong to some stages only."""
    specs = form_fields()
    widgets: dict[str, gr.components.Component] = {}
    for section in SECTIONS:
        mine = [s for s in specs if s.section == section]
        with tr(gr.Accordion, label=f"@section.{section}", open=True,
                visible=section_visible(section, "sft"), elem_id=f"section-{section}") as box:
            if section in STAGE_SECTIONS and accordions is not None:
                accordions[section] = box
            _place(widgets, [s for s in mine if not s.advanced], ws, tr)
            advanced = [s for s in mine if s.advanced]
            if advanced:
                with tr(gr.Accordion, label=f"@section.{section}.advanced", open=False):
                    _place(widgets, advanced, ws, tr)
    return widgets


def _place(widgets: dict, specs: list[FieldSpec], ws: Workspace, tr: Translator,
           per_row: int = 2) -> None:
    for i in range(0, len(specs), per_row):
        with gr.Row():
            for spec in specs[i:i + per_row]:
                widgets[spec.key] = _widget(spec, ws, tr)


HARDWARE_FIELDS = ("processes", "devices", "strategy", "fsdp_sharding", "offload",
                   "deepspeed_stage", "ddp_backend")


class TrainActions:
    """The handlers of the Train tab (plain methods, so tests can call them directly).

    Handlers take the form's values in `keys` order, then the hardware section's values in
    HARDWARE_FIELDS order, then the page language."""

    def __init__(self, ws: Workspace, runner: JobRunner, keys: list[str]):
        self.ws, self.runner, self.keys = ws, runner, keys

    def _split(self, values: tuple) -> tuple[dict[str, Any], Hardware, str]:
        n = len(self.keys)
        form = dict(zip(self.keys, values[:n], strict=True))
        hw_values = dict(zip(HARDWARE_FIELDS, values[n:n + len(HARDWARE_FIELDS)], strict=True))
        hw = Hardware(**{k: v for k, v in hw_values.items() if v is not None})
        lang = values[n + len(HARDWARE_FIELDS)] if len(values) > n + len(HARDWARE_FIELDS) \
            else "en"
        return form, hw, lang

    def _prepare(self, values: tuple) -> tuple[dict[str, Any], Any, dict[str, str], str]:
        form, hw, lang = self._split(values)
        problems: list[str] = []
        try:
            hw_keys, env = hardware_settings(hw, self.ws)
        except ConfigError as exc:
            hw_keys, env = {}, {}
            problems += exc.problems
        form.update({k: v for k, v in hw_keys.items() if k in form})
        changed, cfg = form_to_config(stage_defaults(form, {s.key: s for s in form_fields()}))
        problems += stage_problems(cfg, self.ws.root, lang)
        known = set(dataset_choices(self.ws.data_dir)) | set(model_choices(self.ws))
        problems += check_paths(self.ws, cfg.to_flat(), known)
        for key in ("model_name_or_path", "dataset", "output_dir"):
            if not cfg.to_flat()[key]:
                problems.append(text(f"train.missing.{key}", lang))
        if problems:
            raise ConfigError(problems)
        return changed, cfg, env, lang

    def preview(self, *values: Any) -> tuple[str, str, str]:
        lang = self._split(values)[2]
        try:
            changed, _, env, lang = self._prepare(values)
        except TunesmithError as exc:
            return "", "", _error(exc, lang)
        yaml_path = self.ws.jobs_dir / "<new job>" / "train.yaml"
        return (config_yaml(changed), command_text("train", yaml_path, env),
                text("train.preview_ready", lang))

    def start(self, *values: Any) -> tuple[str, Any]:
        lang = self._split(values)[2]
        try:
            changed, cfg, env, lang = self._prepare(values)
            out = self.ws.inside(cfg.training.output_dir, "output_dir")
            _check_output_dir(out, cfg)
            running = [j for j in self.runner.list("train") if self.runner.status(j) == RUNNING]
            if running:
                raise TunesmithError(text("train.still_running", lang, id=running[0].id))
            job = self.runner.launch("train", changed, output_dir=str(out), env=env)
        except TunesmithError as exc:
            return _error(exc, lang), gr.skip()
        return (text("train.started", lang, id=job.id,
                     command=command_text("train", job.config, env)),
                self.job_choices(job.id))

    def resume(self, *values: Any) -> tuple[str, Any, str]:
        values_l = list(values)
        values_l[self.keys.index("resume_from_checkpoint")] = "auto"
        message, jobs = self.start(*values_l)
        return message, jobs, "auto"

    def stop(self, job_id: str | None, lang: str = "en") -> str:
        if not job_id:
            return text("train.no_job_selected", lang)
        try:
            job = self.runner.get(job_id)
            if self.runner.status(job) != RUNNING:
                return text("train.not_running", lang, id=job_id,
                            status=text(f"status.{self.runner.status(job)}", lang))
            self.runner.stop(job_id)
        except TunesmithError as exc:
            return _error(exc, lang)
        return text("train.stop_requested", lang, id=job_id)

    def stage_view(self, stage: str | None) -> list[Any]:
        """Show the chosen stage's keys, hide the rest (widgets of STAGE_KEYS in order, then
        the stage-only sections)."""
        stage = stage or "sft"
        return ([gr.update(visible=visible(k, stage)) for k in STAGE_KEYS if k in self.keys]
                + [gr.update(visible=section_visible(s, stage)) for s in STAGE_SECTIONS])

    def apply_preset(self, name: str) -> list[Any]:
        """The levers a preset sets (others untouched)."""
        return [gr.skip() if v is None else v for v in preset_values(name, self.keys)]

    def propose_template(self, model: str | None, lang: str = "en") -> tuple[Any, str]:
        """Propose the chosen model's template (a local folder of the workspace)."""
        folder = self.ws.root / model if model else None
        if folder is None or not folder.is_dir():
            return gr.skip(), ""
        name, why = propose_template(folder)
        return name, text(f"train.template_hint.{why}", lang, template=name)

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

    def watch(self, job_id: str | None, shown: str = "", lang: str = "en"
              ) -> tuple[str, str, Any, Any, str, str]:
        """Progress, figures, loss curve, reward curves (preference runs; hidden otherwise),
        log tail of a job, and the key of the curves now shown (the timer calls this;
        unchanged curves are not sent again)."""
        if not job_id:
            return (text("train.no_job_yet", lang), figures_text(RunView(), lang), None,
                    gr.update(visible=False), "", "")
        try:
            job = self.runner.get(job_id)
        except TunesmithError as exc:
            return _error(exc, lang), "", None, gr.update(visible=False), "", ""
        view = read_run(Path(job.output_dir))
        key = f"{job_id}:{len(view.curve)}:{len(view.rewards)}:{lang}"
        if key == shown:
            curve, rewards = gr.skip(), gr.skip()
        else:
            curve = pd.DataFrame(view.curve) if view.curve else None
            rewards = gr.update(value=pd.DataFrame(view.rewards) if view.rewards else None,
                                visible=bool(view.rewards))
        return (progress_text(view, self.runner.status(job), lang), figures_text(view, lang),
                curve, rewards, tail_text(job.log_path, lines=25), key)


def _check_output_dir(out: Path, cfg: Any) -> None:
    t = cfg.training
    if out.is_dir() and any(out.iterdir()) and not (t.resume_from_checkpoint
                                                   or t.overwrite_output_dir):
        raise TunesmithError(f"output_dir: {t.output_dir!r} exists and is not empty; pick "
                             "another folder, tick overwrite_output_dir, or press Resume")


def _error(exc: Exception, lang: str = "en") -> str:
    return f"**{text('common.error', lang)}**\n\n```\n" + str(exc) + "\n```"


def _hardware_section(tr: Translator) -> list[Any]:
    """The hardware widgets, in HARDWARE_FIELDS order."""
    with tr(gr.Accordion, label="@section.hardware", open=False, elem_id="hw-section"):
        with gr.Row():
            processes = tr(gr.Number, 1, precision=0, minimum=1, maximum=64,
                           label="@hw.processes", info="@hw.processes_info",
                           elem_id="hw-processes", min_width=200)
            devices = tr(gr.Textbox, "", label="@hw.devices", info="@hw.devices_info",
                         placeholder="0,1", elem_id="hw-devices", min_width=200)
        with gr.Row():
            strategy = tr(gr.Dropdown, list(STRATEGIES), value="single", label="@hw.strategy",
                          info="@hw.strategy_info", elem_id="hw-strategy", min_width=200)
            backend = tr(gr.Dropdown, list(DDP_BACKENDS), value="auto", label="ddp_backend",
                         info="@field:ddp_backend", elem_id="hw-backend", min_width=200)
        with gr.Row():
            sharding = tr(gr.Dropdown, list(FSDP_SHARDING), value="full_shard",
                          label="@hw.fsdp_sharding", info="@hw.fsdp_sharding_info",
                          elem_id="hw-fsdp-sharding", min_width=200)
            stage = tr(gr.Dropdown, list(DEEPSPEED_STAGES), value=3, label="@hw.ds_stage",
                       info="@hw.ds_stage_info", elem_id="hw-ds-stage", min_width=200)
            offload = tr(gr.Checkbox, False, label="@hw.offload", info="@hw.offload_info",
                         elem_id="hw-offload", min_width=200)
    return [processes, devices, strategy, sharding, offload, stage, backend]


def build_train_tab(ws: Workspace, runner: JobRunner, tr: Translator, lang: Any
                    ) -> dict[str, Any]:
    """Lay out the tab and wire its events; returns what the app wires on page load."""
    with gr.Row():
        with gr.Column(scale=3, min_width=300):
            preset = tr(gr.Dropdown, list(PRESET_CHOICES), value="custom",
                        label="@train.preset", info="@train.preset_info",
                        elem_id="train-preset")
            accordions: dict[str, Any] = {}
            widgets = build_form(ws, tr, accordions)
            hardware = _hardware_section(tr)
        with gr.Column(scale=2, min_width=300):
            with gr.Row():
                preview_btn = tr(gr.Button, value="@train.preview", elem_id="train-preview")
                start_btn = tr(gr.Button, value="@train.start", variant="primary",
                               elem_id="train-start")
            with gr.Row():
                resume_btn = tr(gr.Button, value="@train.resume", elem_id="train-resume")
                stop_btn = tr(gr.Button, value="@train.stop", variant="stop",
                              elem_id="train-stop")
            message = gr.Markdown(elem_id="train-message")
            template_hint = gr.Markdown(elem_id="train-template-hint")
            job_box = tr(gr.Dropdown, label="@job.job", choices=[], value=None,
                         elem_id="train-job")
            progress = tr(gr.Textbox, label="@train.progress", elem_id="train-progress")
            figures = gr.Markdown(elem_id="train-figures")
            with gr.Row():
                plot = gr.LinePlot(x="step", y="loss", color="series", title="loss",
                                   elem_id="train-plot", min_width=260)
                # dpo / kto / rm runs: rewards/chosen, rejected, margins, accuracies
                rewards = gr.LinePlot(x="step", y="value", color="series", title="rewards",
                                      elem_id="train-rewards", visible=False, min_width=260)
            log_box = tr(gr.Textbox, label="@job.log", lines=10, max_lines=10,
                         elem_id="train-log")
            with tr(gr.Accordion, label="@train.command_preview", open=True):
                yaml_box = gr.Code(language="yaml", label="train.yaml", elem_id="train-yaml")
                cli_box = tr(gr.Textbox, label="@train.command", elem_id="train-cli")
    keys = list(widgets)
    actions = TrainActions(ws, runner, keys)
    inputs = [widgets[k] for k in keys]
    all_in = inputs + hardware + [lang]
    timer = gr.Timer(1.0)

    preview_btn.click(actions.preview, all_in, [yaml_box, cli_box, message])
    start_btn.click(actions.start, all_in, [message, job_box])
    resume_btn.click(actions.resume, all_in,
                     [message, job_box, widgets["resume_from_checkpoint"]])
    stop_btn.click(actions.stop, [job_box, lang], message)
    preset.input(actions.apply_preset, preset, inputs)
    widgets["stage"].change(actions.stage_view, widgets["stage"],
                            [widgets[k] for k in STAGE_KEYS if k in widgets]
                            + [accordions[s] for s in STAGE_SECTIONS], show_progress="hidden")
    widgets["model_name_or_path"].change(actions.propose_template,
                                         [widgets["model_name_or_path"], lang],
                                         [widgets["template"], template_hint])
    for key in ("dataset", "eval_dataset"):
        widgets[key].focus(lambda: gr.update(choices=dataset_choices(ws.data_dir)), None,
                           widgets[key])
    shown = gr.State("")  # which curve this page shows, so an unchanged one is not resent
    watch_out = [progress, figures, plot, rewards, log_box, shown]
    timer.tick(actions.watch, [job_box, shown, lang], watch_out, show_progress="hidden")
    job_box.change(actions.watch, [job_box, gr.State(""), lang], watch_out,
                   show_progress="hidden")
    job_box.input(actions.form_of_job, job_box, inputs)  # picking a job shows its config
    return {"job_box": job_box, "job_choices": actions.job_choices,
            "form_of_job": actions.form_of_job, "inputs": inputs}

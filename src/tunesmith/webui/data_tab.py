"""The Data tab: pick or upload a dataset, see it rendered as training will see it."""

from __future__ import annotations

from typing import Any

import gradio as gr

from tunesmith.config.schema import DataConfig
from tunesmith.data.readers import FILE_SUFFIXES as DATA_FILE_SUFFIXES
from tunesmith.data.template import builtin_template_names
from tunesmith.errors import TunesmithError
from tunesmith.webui.data_view import Highlighted, dataset_choices, inspect_dataset
from tunesmith.webui.i18n import Translator, text
from tunesmith.webui.preview_rows import COLORS, media_table, pairs_html
from tunesmith.webui.runs import model_choices
from tunesmith.webui.uploads import MAX_UPLOAD_BYTES, store_upload
from tunesmith.webui.workspace import Workspace, check_paths


def _separator(lang: str) -> Highlighted:
    return [(text("data.next_sample", lang), None)]


class DataActions:
    def __init__(self, ws: Workspace, max_upload_bytes: int = MAX_UPLOAD_BYTES):
        self.ws, self.max_upload_bytes = ws, max_upload_bytes

    def upload(self, file_path: str | None, lang: str = "en") -> tuple[str, Any]:
        """Copy an uploaded file into the data folder (plain name, data suffix only)."""
        if not file_path:
            return "", gr.skip()
        try:
            name = store_upload(self.ws, file_path, self.max_upload_bytes)
        except TunesmithError as exc:
            return _error(exc, lang), gr.skip()
        choice = f"{self.ws.data_dir.name}/{name}"
        return (text("data.stored", lang, name=choice),
                gr.update(choices=dataset_choices(self.ws.data_dir), value=choice))

    def preview(self, dataset: str | None, model: str | None, template: str,
                cutoff_len: float, n_samples: float, lang: str = "en"
                ) -> tuple[str, Highlighted, str, Any, str, Any]:
        """(figures, samples, bad rows and media errors, thumbnails, media token table,
        preference pairs side by side)."""
        known = set(dataset_choices(self.ws.data_dir))
        problems = check_paths(self.ws, {"dataset": [dataset or ""],
                                         "model_name_or_path": model or ""},
                               known | set(model_choices(self.ws)))
        if not dataset or not model:
            problems.append(text("data.pick_dataset_and_model", lang))
        if problems:
            return (_error("; ".join(problems), lang), [], "", gr.update(visible=False), "",
                    gr.update(visible=False))
        local_model = self.ws.root / model
        name = dataset if "/" not in dataset and not (self.ws.root / dataset).exists() else str(
            self.ws.inside(dataset, "dataset"))
        cfg = DataConfig(dataset_dir=str(self.ws.data_dir), cutoff_len=int(cutoff_len),
                         on_bad_row="skip")
        try:
            view = inspect_dataset(name, cfg, str(local_model) if local_model.exists()
                                   else model, template or "", int(n_samples), lang)
        except TunesmithError as exc:
            return (_error(exc, lang), [], "", gr.update(visible=False), "",
                    gr.update(visible=False))
        samples: Highlighted = []
        for i, sample in enumerate(view.samples):
            samples += (_separator(lang) if i else []) + sample
        problems = "\n".join([view.bad_rows, *view.media.errors]).strip()
        short = self._short
        thumbs = [(img, short(c)) for img, c in view.media.thumbnails]
        return (_figures_table(view.figures), [(short(t), k) for t, k in samples],
                short(problems), gr.update(value=thumbs or None, visible=bool(thumbs)),
                short(media_table(view.media, lang)),
                gr.update(value=short(pairs_html(view.pairs, lang)), visible=bool(view.pairs)))

    def _short(self, s: str) -> str:
        """Places inside the working folder as the user names them (data/x.json:3)."""
        return s.replace(f"{self.ws.root}/", "")


def _error(problem: Any, lang: str) -> str:
    return f"**{text('common.error', lang)}**: {problem}"


def _figures_table(figures: dict[str, Any]) -> str:
    rows = "\n".join(f"| {k.replace('_', ' ')} | {v} |" for k, v in figures.items())
    return "| figure | value |\n|---|---|\n" + rows


def build_data_tab(ws: Workspace, tr: Translator, lang: Any) -> dict[str, Any]:
    actions = DataActions(ws)
    with gr.Row():
        dataset = tr(gr.Dropdown, dataset_choices(ws.data_dir), value=None,
                     label="@data.dataset", info="@data.dataset_info",
                     allow_custom_value=True, elem_id="data-dataset")
        upload = tr(gr.File, label="@data.upload", file_types=list(DATA_FILE_SUFFIXES),
                    elem_id="data-upload")
    with gr.Row():
        model = tr(gr.Dropdown, model_choices(ws), value=None, allow_custom_value=True,
                   label="@data.model", elem_id="data-model")
        template = tr(gr.Dropdown, [""] + builtin_template_names(), value="",
                      label="@data.template", info="@data.template_info",
                      allow_custom_value=True, filterable=True, elem_id="data-template")
        cutoff = gr.Number(2048, precision=0, minimum=8, label="cutoff_len")
        n_samples = tr(gr.Number, 3, precision=0, minimum=1, maximum=20,
                       label="@data.samples_shown", elem_id="data-samples-shown")
    preview_btn = tr(gr.Button, value="@data.preview", variant="primary",
                     elem_id="data-preview")
    message = gr.Markdown(elem_id="data-message")
    with gr.Row():
        figures = gr.Markdown(elem_id="data-figures")
        bad_rows = tr(gr.Textbox, label="@data.bad_rows", lines=6, elem_id="data-bad-rows")
    samples = tr(gr.HighlightedText, label="@data.samples", color_map=COLORS,
                 show_legend=True, elem_id="data-samples")
    pair_columns = gr.HTML(elem_id="data-pair-columns", visible=False)
    with gr.Row():
        thumbs = tr(gr.Gallery, label="@data.media", columns=4, height="auto",
                    elem_id="data-media", min_width=240, visible=False)
        media_tokens = gr.Markdown(elem_id="data-media-tokens", min_height=0)
    dataset.focus(lambda: gr.update(choices=dataset_choices(ws.data_dir)), None, dataset)
    upload.upload(actions.upload, [upload, lang], [message, dataset])
    preview_btn.click(actions.preview, [dataset, model, template, cutoff, n_samples, lang],
                      [figures, samples, bad_rows, thumbs, media_tokens, pair_columns])
    return {"dataset": dataset}

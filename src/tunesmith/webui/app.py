"""`tunesmith webui`: the page, its tabs, and the server launch.

    Data | Train | Evaluate | Chat | Export
                 |
                 v  YAML in WORK/jobs/<id>/  ->  python -m tunesmith <command> <yaml>
                                                (own session: survives the browser and the UI)
    Language switch (English | 中文, the browser's language first) -> every label and help
    Train tab timer  <-  WORK/saves/<run>/metrics.jsonl + WORK/jobs/<id>/output.log
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunesmith.errors import ConfigError


def require_gradio() -> None:
    """Raise a ConfigError naming the extra when gradio is not installed."""
    try:
        import gradio  # noqa: F401
        import pandas  # noqa: F401
    except ImportError:
        raise ConfigError("webui: gradio is not installed; pip install 'tunesmith[webui]'"
                          ) from None


@dataclass
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 7860
    auth: tuple[str, str] | None = None
    share: bool = False


def build_app(work_dir: str) -> Any:
    """The gradio Blocks of the web UI working in `work_dir` (created if missing)."""
    require_gradio()
    import gradio as gr

    from tunesmith.webui.chat_tab import EngineSlot, build_chat_tab
    from tunesmith.webui.data_tab import build_data_tab
    from tunesmith.webui.i18n import BROWSER_LANGUAGE_JS, DEFAULT_LANGUAGE, LANGUAGES, Translator
    from tunesmith.webui.jobs import JobRunner
    from tunesmith.webui.tool_tabs import build_eval_tab, build_export_tab
    from tunesmith.webui.train_tab import build_train_tab
    from tunesmith.webui.workspace import Workspace

    ws = Workspace.create(work_dir)
    runner = JobRunner(ws)
    tr = Translator()
    with gr.Blocks(title="tunesmith", analytics_enabled=False) as app:
        with gr.Row(equal_height=True):
            gr.Markdown(f"## tunesmith · `{ws.root}`")
            lang = gr.Radio(list(LANGUAGES), value=DEFAULT_LANGUAGE, label="Language / 语言",
                            elem_id="lang", scale=0, min_width=180)
        with gr.Tabs():
            with tr(gr.Tab, label="@tab.data", id="data", elem_id="tab-data"):
                build_data_tab(ws, tr, lang)
            with tr(gr.Tab, label="@tab.train", id="train", elem_id="tab-train"):
                train = build_train_tab(ws, runner, tr, lang)
            with tr(gr.Tab, label="@tab.eval", id="eval", elem_id="tab-eval"):
                evaluate = build_eval_tab(ws, runner, tr, lang)
            with tr(gr.Tab, label="@tab.chat", id="chat", elem_id="tab-chat"):
                build_chat_tab(ws, EngineSlot(), tr, lang)
            with tr(gr.Tab, label="@tab.export", id="export", elem_id="tab-export"):
                export = build_export_tab(ws, runner, tr, lang)

        # The switch sends every translated component its text; on load the browser's
        # language sets the switch.
        lang.change(tr.updates, lang, tr.components(), show_progress="hidden")
        # Choices of dropdowns refresh when they get focus; on load only the jobs are
        # picked, so a reopened page shows the running (or latest) job of each kind.
        app.load(None, None, lang, js=BROWSER_LANGUAGE_JS).then(
            lambda: (train["job_choices"](), evaluate["jobs"](), export["jobs"]()), None,
            [train["job_box"], evaluate["job_box"], export["job_box"]]).then(
            train["form_of_job"], train["job_box"], train["inputs"])
    return app


def launch(app: Any, options: ServerOptions, *, block: bool = True) -> Any:
    """Serve the app; loopback only unless `options.host` says otherwise, no share link
    unless asked."""
    return app.launch(server_name=options.host, server_port=options.port, auth=options.auth,
                      share=options.share, prevent_thread_lock=not block, quiet=not block,
                      show_error=True, footer_links=[])

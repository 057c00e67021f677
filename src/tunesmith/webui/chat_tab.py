"""The Chat tab: load a base model (+ the adapter of a run), chat with streaming."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import gradio as gr

from tunesmith.errors import TunesmithError
from tunesmith.infer.engine import GenerationParams, HFEngine
from tunesmith.webui.i18n import Translator
from tunesmith.webui.i18n import text as say  # `text` is the message in respond()
from tunesmith.webui.runs import base_of, finished_runs, model_choices
from tunesmith.webui.workspace import Workspace, check_paths


class EngineSlot:
    """The one loaded engine of the web UI (a model is large: one at a time)."""

    def __init__(self) -> None:
        self.engine: HFEngine | None = None
        self.description = ""
        self.lock = threading.Lock()


class ChatActions:
    def __init__(self, ws: Workspace, slot: EngineSlot):
        self.ws, self.slot = ws, slot

    def pick_run(self, run: str | None) -> tuple[Any, str]:
        """Fill the model and adapter fields from a finished run or checkpoint."""
        if not run:
            return gr.skip(), ""
        try:
            model, adapters = base_of(self.ws, run)
        except TunesmithError as exc:
            return gr.skip(), str(exc)
        return gr.update(value=model), ", ".join(adapters)

    def load(self, model: str | None, adapters: str, template: str,
             trust_remote_code: bool, lang: str = "en") -> str:
        adapter_list = [a.strip() for a in (adapters or "").split(",") if a.strip()]
        flat = {"model_name_or_path": model or "", "adapter_name_or_path": adapter_list}
        problems = check_paths(self.ws, flat, set(model_choices(self.ws)))
        if not model:
            problems.append(say("chat.pick_model", lang))
        error = f"**{say('common.error', lang)}**: "
        if problems:
            return error + "; ".join(problems)
        local = self.ws.root / model
        model_arg = str(local) if local.exists() else model
        paths = [str(self.ws.inside(a, "adapter_name_or_path")) for a in adapter_list]
        with self.slot.lock:
            self.slot.engine = None  # free the previous model first
            try:
                self.slot.engine = HFEngine(model_arg, paths, template or "", "auto",
                                            trust_remote_code)
            except TunesmithError as exc:
                return error + str(exc)
            self.slot.description = model + (f" + {', '.join(adapter_list)}" if adapter_list
                                             else "")
        return say("chat.loaded", lang, model=self.slot.description)

    def respond(self, text: str, history: list[dict], system: str, temperature: float,
                top_p: float, top_k: float, max_new_tokens: float, repetition_penalty: float,
                seed: float | None = None, image: str | None = None, lang: str = "en"
                ) -> Iterator[tuple[list[dict], str]]:
        """Stream the answer into the chat history. `image`: an uploaded file shown with
        this message (vision-language models; a text model answers with the error)."""
        history = list(history or [])
        engine = self.slot.engine
        if not text.strip():
            yield history, ""
            return
        if engine is None:
            history += [{"role": "user", "content": text},
                        {"role": "assistant", "content": say("chat.load_first", lang)}]
            yield history, ""
            return
        shown = {"images": [image]} if image else {}
        messages = ([{"role": "system", "content": system}] if system.strip() else []) + [
            _turn(m) for m in history] + [{"role": "user", "content": text, **shown}]
        params = GenerationParams(int(max_new_tokens), float(temperature), float(top_p),
                                  int(top_k), float(repetition_penalty),
                                  seed=None if seed is None or seed < 0 else int(seed))
        asked: Any = [{"path": image}, text] if image else text  # the image stays in the chat
        history += [{"role": "user", "content": asked}, {"role": "assistant", "content": ""}]
        try:
            for piece in engine.stream(messages, params):
                history[-1]["content"] += piece
                yield history, ""
        except TunesmithError as exc:  # e.g. an image given to a text-only model
            history[-1]["content"] = say("chat.error", lang, error=exc)
        yield history, ""


def _turn(message: dict) -> dict:
    """A chat-history message as the engine reads it: its text, and the images shown in it
    (so a later question still sees the picture of an earlier one)."""
    turn = {"role": message["role"], "content": _text(message["content"])}
    images = _images(message["content"])
    return {**turn, "images": images} if images else turn


def _images(content: Any) -> list[str]:
    """Paths of the image parts of a message (Gradio hands them back as file parts)."""
    if not isinstance(content, list):
        return []
    found = []
    for part in content:
        if isinstance(part, dict) and isinstance(part.get("file"), dict):
            found.append(part["file"]["path"])
        elif isinstance(part, dict) and "path" in part:
            found.append(part["path"])
    return found


def _text(content: Any) -> str:
    """Gradio may hand back message content as a list of parts; keep the text."""
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def build_chat_tab(ws: Workspace, slot: EngineSlot, tr: Translator, lang: Any
                   ) -> dict[str, Any]:
    actions = ChatActions(ws, slot)
    with gr.Row():
        run_box = tr(gr.Dropdown, finished_runs(ws), value=None, allow_custom_value=True,
                     label="@chat.run", info="@chat.run_info", elem_id="chat-run")
        model_box = gr.Dropdown(model_choices(ws), value=None, allow_custom_value=True,
                                label="model_name_or_path", elem_id="chat-model")
        adapter_box = tr(gr.Textbox, label="adapter_name_or_path", info="@chat.adapter_info",
                         elem_id="chat-adapter")
    with gr.Row():
        template_box = tr(gr.Textbox, label="template", info="@chat.template_info",
                          elem_id="chat-template")
        trust_box = tr(gr.Checkbox, False, label="trust_remote_code", info="@chat.trust_info")
        load_btn = tr(gr.Button, value="@chat.load", variant="primary", elem_id="chat-load")
    status = gr.Markdown(elem_id="chat-status")
    with gr.Row():
        with gr.Column(scale=3, min_width=280):
            chatbot = tr(gr.Chatbot, label="@chat.chat", elem_id="chat-box", height=360)
            prompt = tr(gr.Textbox, label="@chat.message", placeholder="@chat.placeholder",
                        elem_id="chat-input")
            image = tr(gr.Image, type="filepath", label="@chat.image", elem_id="chat-image",
                       height=160)
            with gr.Row():
                send = tr(gr.Button, value="@chat.send", variant="primary", elem_id="chat-send")
                clear = tr(gr.Button, value="@chat.clear", elem_id="chat-clear")
        with gr.Column(scale=1, min_width=240):
            system = tr(gr.Textbox, label="@chat.system", lines=2)
            temperature = tr(gr.Slider, 0, 2, value=0.7, step=0.05, label="temperature",
                             info="@chat.greedy_info", elem_id="chat-temperature")
            top_p = gr.Slider(0.05, 1, value=1.0, step=0.05, label="top_p")
            top_k = tr(gr.Slider, 0, 200, value=0, step=1, label="top_k", info="@common.zero_off")
            max_new = gr.Slider(1, 4096, value=256, step=1, label="max_new_tokens",
                                elem_id="chat-max-new")
            rep = gr.Slider(1.0, 2.0, value=1.0, step=0.05, label="repetition_penalty")
            seed = tr(gr.Number, -1, precision=0, label="seed", info="@chat.seed_info",
                      elem_id="chat-seed")
    run_box.focus(lambda: gr.update(choices=finished_runs(ws)), None, run_box)
    run_box.change(actions.pick_run, run_box, [model_box, adapter_box])
    load_btn.click(actions.load, [model_box, adapter_box, template_box, trust_box, lang], status)
    chat_in = [prompt, chatbot, system, temperature, top_p, top_k, max_new, rep, seed, image,
               lang]
    send.click(actions.respond, chat_in, [chatbot, prompt])
    prompt.submit(actions.respond, chat_in, [chatbot, prompt])
    clear.click(lambda: ([], ""), None, [chatbot, prompt])
    return {"run_box": run_box, "model_box": model_box}

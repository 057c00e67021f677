"""Images through the OpenAI-compatible API (`tunesmith api` as a user starts it): data:
URLs answer like the engine; local paths only inside --media_dir; remote URLs are not
fetched unless --allow_remote_media; a text-only model refuses images."""

from __future__ import annotations

import base64
import re
import subprocess
import sys

import httpx
import openai
import pytest

from test_api_cli import _env
from tiny_vl import write_image
from tunesmith.infer.engine import GenerationParams, HFEngine

pytestmark = pytest.mark.slow


def _parts(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "Who is this?"}]}]


def test_api_takes_image_url_parts(tiny_vl_dir, tmp_path):
    allowed = tmp_path / "allowed"
    image = write_image(allowed / "a.png")
    outside = write_image(tmp_path / "b.png")
    data_url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    cmd = [sys.executable, "-m", "tunesmith", "api", "--model_name_or_path", str(tiny_vl_dir),
           "--port", "0", "--device", "cpu", "--media_dir", str(allowed)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env())
    try:
        line = ""
        for line in proc.stdout:
            if "serving" in line:
                break
        port = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line).group(1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                               max_retries=0, timeout=60)
        name = tiny_vl_dir.name

        def ask(url: str) -> str:
            r = client.chat.completions.create(model=name, messages=_parts(url), max_tokens=4,
                                               temperature=0)
            return r.choices[0].message.content

        engine = HFEngine(str(tiny_vl_dir), device="cpu")
        local = [{"role": "user", "content": "<image>Who is this?", "images": [str(image)]}]
        expected = engine.generate(local, GenerationParams(4, temperature=0))
        assert ask(data_url) == expected
        assert ask(str(image)) == expected and ask("a.png") == expected
        for url, why in ((str(outside), "not a file inside the server's --media_dir"),
                         ("https://example.com/a.png", "--allow_remote_media"),
                         ("data:image/png;base64,!!!", "not valid base64")):
            with pytest.raises(openai.BadRequestError, match=re.escape(why)):
                ask(url)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_text_model_refuses_images(tiny_llama_dir, tmp_path):
    from server_thread import running_server
    from tunesmith.serve.app import ServerSettings, create_app

    image = write_image(tmp_path / "a.png")
    url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    with running_server(create_app(HFEngine(str(tiny_llama_dir)), ServerSettings("t"))) as base:
        r = httpx.post(f"{base}/chat/completions", json={"model": "t", "messages": _parts(url)},
                       timeout=60)
    assert r.status_code == 400 and "reads text only" in r.json()["error"]["message"]


def test_webui_chat_answers_with_an_uploaded_image(tiny_vl_dir, tiny_llama_dir, tmp_path):
    from tunesmith.webui.chat_tab import ChatActions, EngineSlot
    from tunesmith.webui.workspace import Workspace

    image = write_image(tmp_path / "up.png")
    slot = EngineSlot()
    actions = ChatActions(Workspace(tmp_path), slot)
    slot.engine = HFEngine(str(tiny_vl_dir), device="cpu")
    *_, (history, _) = actions.respond("Who is this?", [], "", 0.0, 1.0, 0, 4, 1.0, 0,
                                       str(image))
    local = [{"role": "user", "content": "Who is this?", "images": [str(image)]}]
    assert history[-1]["content"] == slot.engine.generate(local, GenerationParams(4, 0.0))
    slot.engine = HFEngine(str(tiny_llama_dir), device="cpu")
    *_, (history, _) = actions.respond("Who?", [], "", 0.0, 1.0, 0, 4, 1.0, 0, str(image))
    assert "text-only" in history[-1]["content"]


def test_webui_chat_keeps_an_earlier_image_for_later_questions(tmp_path):
    """The picture of turn 1 stays in the chat and in what the engine reads at turn 2, both
    from our own history and from the file parts Gradio hands back."""
    from tunesmith.webui.chat_tab import ChatActions, EngineSlot
    from tunesmith.webui.workspace import Workspace

    class Recorder:
        def __init__(self):
            self.seen = []

        def stream(self, messages, params):
            self.seen.append(messages)
            yield "ok"

    image = str(write_image(tmp_path / "up.png"))
    slot = EngineSlot()
    slot.engine = Recorder()
    actions = ChatActions(Workspace(tmp_path), slot)
    *_, (history, _) = actions.respond("What is this?", [], "", 0.0, 1.0, 0, 4, 1.0, 0, image)
    assert history[0]["content"] == [{"path": image}, "What is this?"]
    from_gradio = [{"role": "user", "content": [{"type": "file", "file": {"path": image}},
                                                {"type": "text", "text": "What is this?"}]},
                   {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
    for earlier in (history, from_gradio):
        list(actions.respond("And its colour?", earlier, "", 0.0, 1.0, 0, 4, 1.0, 0, None))
        first, last = slot.engine.seen[-1][0], slot.engine.seen[-1][-1]
        assert first == {"role": "user", "content": "What is this?", "images": [image]}
        assert last == {"role": "user", "content": "And its colour?"}

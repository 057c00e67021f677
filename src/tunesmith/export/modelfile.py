"""An Ollama `Modelfile` beside the GGUF file.

Ollama's TEMPLATE is a Go template, not Jinja, so a chat template cannot be translated in
general. Instead the training template is *recognised by what it renders*: a probe
conversation is rendered with it and compared with the output of each known family
(ChatML, Llama 3). A match gets the family's Go template, stop tokens and, when the Jinja
template inserts a default system prompt, a SYSTEM line. Anything else gets no TEMPLATE, and
Ollama picks a template from the `tokenizer.chat_template` stored in the GGUF.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunesmith.export.merge import MergedModel


@dataclass(frozen=True)
class ChatFamily:
    name: str
    turn: str  # one message, {role} and {content} filled in
    generation_prompt: str
    go_template: str
    stops: tuple[str, ...]


FAMILIES = (
    ChatFamily(
        name="chatml",
        turn="<|im_start|>{role}\n{content}<|im_end|>\n",
        generation_prompt="<|im_start|>assistant\n",
        go_template=("{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n"
                     "{{ end }}<|im_start|>assistant\n"),
        stops=("<|im_end|>", "<|im_start|>"),
    ),
    ChatFamily(
        name="llama3",
        turn="<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>",
        generation_prompt="<|start_header_id|>assistant<|end_header_id|>\n\n",
        go_template=("{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n"
                     "{{ .Content }}<|eot_id|>{{ end }}<|start_header_id|>assistant"
                     "<|end_header_id|>\n\n"),
        stops=("<|eot_id|>", "<|start_header_id|>"),
    ),
)

PROBE = [{"role": "user", "content": "U1"}, {"role": "assistant", "content": "A1"},
         {"role": "user", "content": "U2"}]


def _render(tokenizer: Any, template: str, messages: list[dict[str, str]]) -> str | None:
    try:
        return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                             add_generation_prompt=True)
    except Exception:  # any template error just means "not this family"
        return None


def match_family(tokenizer: Any, template: str) -> tuple[ChatFamily, str] | None:
    """(family, default system prompt or "") when the template renders like a known family."""
    if not template:
        return None
    rendered = _render(tokenizer, template, PROBE)
    with_system = _render(tokenizer, template, [{"role": "system", "content": "S1"}] + PROBE)
    if rendered is None or with_system is None:
        return None
    bos = tokenizer.bos_token or ""
    for fam in FAMILIES:
        for strip in ("", bos):  # a template may or may not write the BOS token itself
            plain, system = (r.removeprefix(strip) if strip else r
                             for r in (rendered, with_system))
            found = _default_system(fam, plain, system)
            if found is not None:
                return fam, found
    return None


def _default_system(fam: ChatFamily, plain: str, system: str) -> str | None:
    """The default system prompt ("" for none) if the renderings fit `fam`, else None."""
    body = "".join(fam.turn.format(**m) for m in PROBE) + fam.generation_prompt
    if not (plain.endswith(body) and system.endswith(
            fam.turn.format(role="system", content="S1") + body)):
        return None
    prefix = plain[: len(plain) - len(body)]
    if system[: len(system) - len(body)] != fam.turn.format(role="system", content="S1"):
        return None  # something besides the system turn precedes the conversation
    if prefix == "":
        return ""
    head, tail = fam.turn.split("{content}")
    head = head.format(role="system")
    if prefix.startswith(head) and prefix.endswith(tail):
        return prefix[len(head): len(prefix) - len(tail)]
    return None


def render_modelfile(merged: MergedModel, gguf_name: str) -> str:
    lines = ["# Ollama Modelfile written by tunesmith: ollama create NAME -f Modelfile",
             f"FROM ./{gguf_name}"]
    found = match_family(merged.tokenizer, merged.template_source)
    stops: list[str] = []
    if found is None:
        lines.append("# The chat template is not one tunesmith can translate to Ollama's Go "
                     "template; Ollama chooses one from the tokenizer.chat_template in the GGUF.")
    else:
        fam, system = found
        lines.append(f'TEMPLATE """{fam.go_template}"""')
        if system:
            lines.append(f'SYSTEM """{system}"""')
        stops += fam.stops
    eos = merged.tokenizer.eos_token
    if eos and eos not in stops:
        stops.append(eos)
    lines += [f'PARAMETER stop "{s}"' for s in stops]
    return "\n".join(lines) + "\n"


def write_modelfile(merged: MergedModel, gguf_path: Path) -> Path:
    path = gguf_path.parent / "Modelfile"
    path.write_text(render_modelfile(merged, gguf_path.name), encoding="utf-8")
    return path

"""Encode conversations with a slot template, token for token as LLaMA-Factory does.

    conversation --to_turns--> (system, tools, [(role, content)]) with roles user |
        assistant | function | observation alternating prompt / answer
    each message --slots--> elements: text pieces, tokens by name, bos / eos
    all text pieces of a batch --one batched tokeniser call--> ids (each piece on its own)
    messages --pairs--> [(prompt ids, answer ids)] (+ empty thought for reasoning templates)
    pairs --build_sample--> input ids + labels (per turn; LLaMA-Factory's truncation)

Elements are tokenised per piece, not as one text, because that is what decides the ids
(a SentencePiece tokenizer adds a word-start marker to every piece, and no merge crosses a
piece boundary).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunesmith.data.conversation import Conversation
from tunesmith.data.slot_template import Slot, SlotTemplate
from tunesmith.data.tool_formats import get_tool_format, today_text

IGNORE_INDEX = -100
Element = str | dict[str, str]
Pair = tuple[list[int], list[int]]
ROLE_OF = {"user": "user", "tool": "observation", "assistant": "assistant"}


@dataclass
class Turns:
    system: str
    tools: str  # the tools column as text ("" when none), as LLaMA-Factory passes it
    messages: list[tuple[str, str]]  # (role, content); role user|assistant|function|observation


def to_turns(conv: Conversation) -> Turns:
    """A Conversation in LLaMA-Factory's terms: the system prompt apart, function calls as
    `function` messages holding their JSON, tool results as `observation` messages."""
    msgs = conv.messages
    system = msgs[0].content if msgs and msgs[0].role == "system" else ""
    out: list[tuple[str, str]] = []
    for m in msgs[1:] if system or (msgs and msgs[0].role == "system") else msgs:
        if m.role == "assistant" and m.tool_calls:
            out.append(("function", m.content + _calls_json(m.tool_calls)))
        else:
            out.append((ROLE_OF[m.role], m.content))
    tools = conv.extra.get("tools_raw")
    if tools is None:
        tools = json.dumps(conv.tools, ensure_ascii=False) if conv.tools else ""
    return Turns(system, tools, out)


def _calls_json(calls: list[dict[str, Any]]) -> str:
    objs = []
    for c in calls:
        fn = c.get("function", c)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        objs.append({"name": fn.get("name"), "arguments": args})
    return json.dumps(objs[0] if len(objs) == 1 else objs, ensure_ascii=False)


def _fill(slots: list[Slot], **values: str) -> list[Element]:
    """Replace each {{name}} once per text slot, in the order the values are given."""
    out: list[Element] = []
    for slot in slots:
        if isinstance(slot, str):
            for name, value in values.items():
                slot = slot.replace("{{" + name + "}}", value, 1)
        out.append(slot)
    return out


def remove_thought(t: SlotTemplate, content: str) -> str:
    open_, close = (re.escape(w) for w in t.thought_words)
    return re.sub(f"{open_}(.*?){close}", "", content, flags=re.DOTALL).lstrip("\n")


def empty_thought(t: SlotTemplate) -> str:
    if t.kind == "reasoning_close_only":
        return t.thought_words[1]
    return t.thought_words[0] + t.thought_words[1]


class SlotEncoder:
    """Encodes conversations with one slot template and one tokenizer."""

    def __init__(self, template: SlotTemplate, tokenizer: Any, today: str | None = None):
        self.t, self.tokenizer = template, tokenizer
        self.today = today or today_text()
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        self._tools = get_tool_format(template.tool_format) if template.tool_format else None
        self._calls = get_tool_format(template.function_tool_format)
        self._token_ids: dict[str, int] = {}
        self._thought_ids: list[int] | None = None
        self._fast: Any = False  # a FastBPE, None when unavailable, False before the first use

    # ---- messages -> elements ------------------------------------------------------------
    def _system_text(self, system: str, tools: str) -> str:
        tool_text = ""
        if tools:
            schemas = json.loads(tools)
            if self.t.tools_slots is not None:
                first = _fill(self.t.tools_slots, content=tools)[0]
                tool_text = first if isinstance(first, str) else ""
            elif schemas and self._tools is not None:
                tool_text = self._tools.describe(schemas, self.today)
            if not system and self.t.tool_text_lstrip:
                tool_text = tool_text.lstrip("\n")
        return system + tool_text

    def _function_text(self, content: str, with_words: bool) -> str:
        t = self.t
        head, json_part = "", content
        if with_words:
            open_, close = (re.escape(w) for w in t.tool_call_words)
            call = re.search(f"{open_}(.*?){close}", content, re.DOTALL)
            if call is not None:
                head, json_part = content.replace(call.group(0), ""), call.group(1)
            else:
                o2, c2 = (re.escape(w) for w in t.thought_words)
                thought = re.search(f"{o2}(.*?){c2}", content, re.DOTALL)
                if thought is not None:
                    head, json_part = thought.group(0), content.replace(thought.group(0), "")
        if not head and not json_part.lstrip().startswith(("{", "[")):
            start = min((i for i in (json_part.find("{"), json_part.find("[")) if i >= 0),
                        default=0)
            head, json_part = json_part[:start], json_part[start:]
        calls = json.loads(json_part)
        calls = calls if isinstance(calls, list) else [calls]
        pairs = [(c["name"], json.dumps(c["arguments"], ensure_ascii=False)) for c in calls]
        return head + self._calls.write_calls(pairs)

    def elements(self, turns: Turns) -> list[list[Element]]:
        """The elements of every message (LLaMA-Factory's per-message formatting)."""
        t, s = self.t, self.t.slots
        system = turns.system or t.default_system
        llama2 = t.kind == "llama2"
        out: list[list[Element]] = []
        for i, (role, content) in enumerate(turns.messages):
            els: list[Element] = []
            lead = ""
            if i == 0:
                els += s["prefix"]
                if system or turns.tools:
                    sys_els = _fill(s["system"], content=self._system_text(system, turns.tools))
                    if llama2:
                        lead = sys_els[0] if isinstance(sys_els[0], str) else ""
                    else:
                        els += sys_els
            if role == "user":
                els += (_fill(s["user"], content=lead + content) if llama2
                        else _fill(s["user"], content=content, idx=str(i // 2)))
            elif role == "assistant":
                els += _fill(s["assistant"], content=content)
            elif role == "observation":
                els += _fill(s["observation"], content=content)
            else:
                els += _fill(s["function"], content=self._function_text(content, not llama2))
            out.append(els)
        return out

    # ---- elements -> ids -----------------------------------------------------------------
    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        if self._fast is False:
            from tunesmith.data.fast_bpe import build_fast_bpe

            self._fast = build_fast_bpe(self.tokenizer)
        if self._fast is not None:
            fast = self._fast.encode_batch(texts)
            if fast is not None:
                return fast
        if self.backend is not None:
            return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]
        return [self.tokenizer.encode(x, add_special_tokens=False) for x in texts]

    def _token_id(self, el: dict[str, str]) -> int | None:
        if "token" in el:
            key = el["token"]
            if key not in self._token_ids:
                self._token_ids[key] = self.tokenizer.convert_tokens_to_ids(key)
            return self._token_ids[key]
        return getattr(self.tokenizer, el["special"] + "_id", None)

    def encode_messages(self, batch: list[list[list[Element]]]) -> list[list[list[int]]]:
        """Elements of messages of conversations -> ids of messages of conversations."""
        texts = [e for conv in batch for msg in conv for e in msg if isinstance(e, str) and e]
        pieces = iter(self._encode_texts(texts))
        out: list[list[list[int]]] = []
        for conv in batch:
            conv_ids = []
            for msg in conv:
                ids: list[int] = []
                for e in msg:
                    if isinstance(e, str):
                        if e:
                            ids += next(pieces)
                    else:
                        tid = self._token_id(e)
                        if tid is not None:
                            ids.append(tid)
                conv_ids.append(ids)
            out.append(conv_ids)
        return out

    # ---- conversations -> pairs ----------------------------------------------------------
    def _thinking_view(self, turns: Turns, discard_history_cot: bool) -> Turns:
        """Reasoning templates: drop thoughts as LLaMA-Factory does before encoding."""
        t = self.t
        msgs = list(turns.messages)
        last = len(msgs) - 1
        for i in range(1, len(msgs), 2):
            if t.enable_thinking is False or (discard_history_cot and i < last - 1):
                msgs[i] = (msgs[i][0], remove_thought(t, msgs[i][1]))
        return Turns(turns.system, turns.tools, msgs)

    def thought_ids(self) -> list[int]:
        if self._thought_ids is None:
            self._thought_ids = self._encode_texts([empty_thought(self.t)])[0]
        return self._thought_ids

    def encode_pairs(self, convs: list[Turns], mask_history: bool = False) -> list[list[Pair]]:
        """(prompt ids, answer ids) of every turn of every conversation."""
        t = self.t
        discard = mask_history and not t.preserve_thinking
        if t.reasoning:
            convs = [self._thinking_view(c, discard) for c in convs]
        encoded = self.encode_messages([self.elements(c) for c in convs])
        out = []
        for turns, msgs in zip(convs, encoded, strict=True):
            if t.reasoning:
                self._add_empty_thoughts(turns, msgs, discard)
            out.append([(msgs[i], msgs[i + 1]) for i in range(0, len(msgs), 2)])
        return out

    def _add_empty_thoughts(self, turns: Turns, msgs: list[list[int]], discard: bool) -> None:
        t = self.t
        n = len(turns.messages)
        for i in ([n - 2] if discard else range(0, n, 2)):
            answer = turns.messages[i + 1][1]
            if t.thought_words[0].strip() in answer or t.thought_words[1].strip() in answer:
                continue
            if t.enable_thinking:
                msgs[i + 1] = self.thought_ids() + msgs[i + 1]  # trained
            else:
                msgs[i] = msgs[i] + self.thought_ids()  # part of the prompt


def infer_seqlen(source_len: int, target_len: int, budget: int) -> tuple[int, int]:
    """How much of one turn's prompt and answer fit a token budget (LLaMA-Factory's rule:
    a short answer is kept whole, else a short prompt, else both shrink in proportion)."""
    if target_len * 2 < budget:
        max_target = budget
    elif source_len * 2 < budget:
        max_target = budget - source_len
    else:
        max_target = int(budget * (target_len / (source_len + target_len)))
    new_target = min(max_target, target_len)
    return min(max(budget - new_target, 0), source_len), new_target


@dataclass
class SampleOptions:
    cutoff_len: int
    train_on_prompt: bool = False
    mask_history: bool = False
    efficient_eos: bool = False
    eos_id: int | None = None


def build_sample(pairs: list[Pair], o: SampleOptions) -> tuple[np.ndarray, np.ndarray, bool]:
    """Input ids and labels of one conversation, turn by turn; returns also whether
    cutoff_len cut into an answer (not only into prompts)."""
    ids: list[int] = []
    labels: list[int] = []
    total = 1 if o.efficient_eos else 0
    answer_cut = False
    order = pairs[::-1] if o.mask_history else pairs
    for k, (src, tgt) in enumerate(order):
        if total >= o.cutoff_len:
            break
        s_len, t_len = infer_seqlen(len(src), len(tgt), o.cutoff_len - total)
        answer_cut |= t_len < len(tgt)
        src, tgt = src[:s_len], tgt[:t_len]
        total += s_len + t_len
        if o.train_on_prompt:
            src_lab = list(src)
        elif o.efficient_eos and k != 0 and s_len:
            src_lab = [o.eos_id] + [IGNORE_INDEX] * (s_len - 1)
        else:
            src_lab = [IGNORE_INDEX] * s_len
        tgt_lab = [IGNORE_INDEX] * t_len if o.mask_history and k != 0 else list(tgt)
        if o.mask_history:
            ids, labels = src + tgt + ids, src_lab + tgt_lab + labels
        else:
            ids, labels = ids + src + tgt, labels + src_lab + tgt_lab
    if o.efficient_eos:
        ids.append(o.eos_id)
        labels.append(o.eos_id)
    return np.asarray(ids, dtype=np.int32), np.asarray(labels, dtype=np.int32), answer_cut

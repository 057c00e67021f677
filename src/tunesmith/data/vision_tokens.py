"""Vision placeholders -> the processor's exact token count, for one conversation.

    "<image>Who is this?"  --grid (t, h, w) of the image-->
    "<|vision_start|>" + "<|image_pad|>" * (t*h*w / merge^2) + "<|vision_end|>Who is this?"

The placeholders are matched to the row's media in order (LLaMA-Factory's rule); a count
that differs is a bad row. Expansion happens before the chat template renders, so the
template and the token placer see ordinary text, and the loss mask then drops every vision
token (encode.py) whatever the train_on_prompt setting.
"""

from __future__ import annotations

from tunesmith.data.conversation import Conversation, Message
from tunesmith.data.formats import RowError
from tunesmith.data.media import MediaItem, load_image, load_video
from tunesmith.models.processor import VisionSettings

IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER = "<image>", "<video>"


def load_media(conv: Conversation, s: VisionSettings) -> list[MediaItem]:
    """Decode the row's media and expand its placeholders in place; returns the items in
    the order their tokens appear in the text. Raises RowError with the reason."""
    _check_counts(conv)
    if conv.videos and s.architecture == "qwen3_vl":
        raise RowError("videos for Qwen3-VL are not supported yet (its per-frame timestamp "
                       "tokens are not generated); use images, or Qwen2-VL / Qwen2.5-VL")
    images = [load_image(v, s) for v in conv.images]
    videos = [load_video(v, s) for v in conv.videos]
    queues = {IMAGE_PLACEHOLDER: list(images), VIDEO_PLACEHOLDER: list(videos)}
    ordered: list[MediaItem] = []
    messages = []
    for m in conv.messages:
        messages.append(Message(m.role, _expand(m.content, queues, ordered, s), m.tool_calls))
    conv.messages = messages
    conv.extra["vision_tokens"] = sum(s.tokens_of(item.grid(s)) for item in ordered)
    return ordered


def _check_counts(conv: Conversation) -> None:
    for tag, media, col in ((IMAGE_PLACEHOLDER, conv.images, "images"),
                            (VIDEO_PLACEHOLDER, conv.videos, "videos")):
        n = sum(m.content.count(tag) for m in conv.messages)
        if n != len(media):
            raise RowError(f"{n} {tag} placeholder(s) in the messages but {len(media)} "
                           f"entr{'y' if len(media) == 1 else 'ies'} in column {col!r}; put one "
                           f"{tag} where each goes")


def _expand(text: str, queues: dict[str, list[MediaItem]], ordered: list[MediaItem],
            s: VisionSettings) -> str:
    out: list[str] = []
    i = 0
    while True:
        hits = [(text.find(tag, i), tag) for tag in queues if text.find(tag, i) >= 0]
        if not hits:
            return "".join(out) + text[i:]
        pos, tag = min(hits)
        item = queues[tag].pop(0)
        ordered.append(item)
        pad = s.image_token if item.kind == "image" else s.video_token
        out += [text[i:pos], s.vision_start, pad * s.tokens_of(item.grid(s)), s.vision_end]
        i = pos + len(tag)

"""Vision data: patches equal transformers' image processor, placeholders expand to the
processor's token count, vision tokens are never trained, bad media are bad rows with
file:line, a cut inside an image is dropped and counted, media come back from the cache."""

from __future__ import annotations

import json

import numpy as np
import pytest

from datahelp import write_jsonl
from tiny_vl import build_vl_tokenizer, write_image, write_mm_dataset
from tunesmith.config.schema import DataConfig
from tunesmith.data.loading import DataContext, prepare_data
from tunesmith.data.media import MediaItem, load_image, patchify
from tunesmith.data.template import ChatRenderer, load_template_source
from tunesmith.errors import DataError
from tunesmith.models.processor import read_vision_settings


@pytest.fixture(scope="module")
def vl_tokenizer():
    return build_vl_tokenizer()


def _prepare(tok, vl_dir, overwrite_cache=False, **keys):
    keys.setdefault("preprocessing_num_workers", 1)
    cfg = DataConfig(**keys)
    vision = read_vision_settings(vl_dir, tok, media_dirs=(cfg.dataset_dir,))
    name, source = load_template_source("qwen", tok)
    ctx = DataContext(ChatRenderer(name, source, tok), tok, 42, "sft", overwrite_cache, vision,
                      str(vl_dir))
    return prepare_data(cfg, ctx), vision


@pytest.mark.parametrize("size", [(60, 40), (97, 131), (300, 20)])
def test_pixels_and_grid_equal_the_image_processor(tiny_vl_dir, tmp_path, size):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    path = write_image(tmp_path / "x.png", size)
    proc = Qwen2VLImageProcessorPil.from_pretrained(tiny_vl_dir)
    vision = read_vision_settings(tiny_vl_dir, build_vl_tokenizer(),
                                  image_max_pixels=10**9, image_min_pixels=1)
    ours = load_image(str(path), vision)
    from PIL import Image

    ref = proc(images=[Image.open(path).convert("RGB")], return_tensors="np")
    assert list(ours.grid(vision)) == ref["image_grid_thw"][0].tolist()
    mine = patchify(MediaItem("image", ours.frames), vision)
    np.testing.assert_allclose(mine, ref["pixel_values"], atol=1e-4)


def test_placeholders_expand_to_the_grid_and_vision_tokens_are_never_trained(
        vl_tokenizer, tiny_vl_dir, tmp_path):
    folder = write_mm_dataset(tmp_path / "data")
    data, vision = _prepare(vl_tokenizer, tiny_vl_dir, dataset=["mm"],
                            dataset_dir=str(folder), train_on_prompt=True)
    assert len(data.train) == 4
    image_id, video_id = vision.media_token_ids
    vision_ids = list(vision.token_ids.values())
    by_media = {}
    for i in range(len(data.train)):
        s = data.train[i]
        assert not np.isin(s.labels, vision_ids).any()  # train_on_prompt trains the rest
        grids = [it.grid(vision) for it in s.media or []]
        n_media = int(np.isin(s.input_ids, [image_id, video_id]).sum())
        assert n_media == sum(vision.tokens_of(g) for g in grids)
        by_media[tuple(it.kind for it in s.media or [])] = grids
    assert by_media[("image", "image")] == [(1, 4, 6), (1, 6, 8)]
    assert by_media[("video",)] == [(2, 4, 4)] and by_media[()] == []


def test_bad_media_are_bad_rows_with_file_and_line(vl_tokenizer, tiny_vl_dir, tmp_path):
    write_image(tmp_path / "ok.png")
    (tmp_path / "broken.png").write_bytes(b"not an image")
    msgs = [{"role": "user", "content": "<image>hi"}, {"role": "assistant", "content": "yo"}]
    two = [{"role": "user", "content": "<image><image>hi"}, msgs[1]]
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"messages": msgs, "images": ["ok.png"]},
        {"messages": msgs, "images": ["missing.png"]},
        {"messages": msgs, "images": ["broken.png"]},
        {"messages": two, "images": ["ok.png"]}])
    with pytest.raises(DataError) as err:
        _prepare(vl_tokenizer, tiny_vl_dir, dataset=[str(path)], dataset_dir=str(tmp_path))
    msg = str(err.value)
    assert msg.startswith("3 bad row(s)")
    assert f"{path}:2: media file 'missing.png' not found" in msg
    assert f"{path}:3: image" in msg and "cannot be decoded" in msg
    assert f"{path}:4: 2 <image> placeholder(s) in the messages but 1 entry" in msg


def test_a_cut_inside_an_image_drops_the_sample_and_counts_it(vl_tokenizer, tiny_vl_dir,
                                                              tmp_path):
    folder = write_mm_dataset(tmp_path / "data")
    data, _ = _prepare(vl_tokenizer, tiny_vl_dir, dataset=["mm"], dataset_dir=str(folder),
                       cutoff_len=40)
    summary = data.report.summary()
    assert summary["dropped_vision_cut"] >= 1
    assert len(data.train) == 4 - summary["dropped_vision_cut"]
    for i in range(len(data.train)):
        assert len(data.train[i]) <= 40


def test_media_come_back_from_the_cache(vl_tokenizer, tiny_vl_dir, tmp_path):
    folder = write_mm_dataset(tmp_path / "data")
    first, _ = _prepare(vl_tokenizer, tiny_vl_dir, dataset=["mm"], dataset_dir=str(folder))
    again, _ = _prepare(vl_tokenizer, tiny_vl_dir, dataset=["mm"], dataset_dir=str(folder))
    assert again.report.cache_hits == 1 and first.report.cache_misses == 1
    for i in range(len(first.train)):
        a, b = first.train[i], again.train[i]
        assert np.array_equal(a.input_ids, b.input_ids)
        for x, y in zip(a.media or [], b.media or [], strict=True):
            assert x.kind == y.kind and np.array_equal(x.frames, y.frames)
    assert json.loads(json.dumps(first.report.summary()))["samples"] == 4


def test_data_inspect_reads_media_rows_with_a_vision_model(tiny_vl_dir, tmp_path, capsys):
    from tunesmith.cli.main import main

    folder = write_mm_dataset(tmp_path / "data")
    rc = main(["data", "inspect", "mm", "--model", str(tiny_vl_dir), "--color", "never",
               f"dataset_dir={folder}", "template=qwen"])
    out = capsys.readouterr().out
    assert rc == 0 and "<|image_pad|>" in out

"""HFEngine: batching, streaming, stop strings, seeds, adapters and templates, chat CLI."""

from __future__ import annotations

import threading

import pytest
import torch

from tunesmith.cli.main import main
from tunesmith.errors import ConfigError, ModelError
from tunesmith.infer.engine import GenerationParams, HFEngine
from tunesmith.infer.streaming import TextAssembler, find_stop, partial_stop_len

GREEDY = GenerationParams(max_new_tokens=12, temperature=0)
CONVS = [[{"role": "user", "content": "hi"}],
         [{"role": "user", "content": "Who are you? Tell me about the quick brown fox."}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir) -> HFEngine:
    return HFEngine(str(tiny_llama_dir))


def test_left_padded_batch_equals_one_by_one(engine):
    batch = engine.generate_texts(CONVS, GREEDY)
    assert len({len(engine.encode_chat(c)) for c in CONVS}) == 3  # padding really happens
    for conv, got in zip(CONVS, batch, strict=True):
        alone = engine.generate_texts([conv], GREEDY)[0]
        assert got == alone
        assert got.text == engine.generate(conv, GREEDY)
        assert got.prompt_tokens == len(engine.encode_chat(conv))


def test_stream_reports_tokens_and_finish_reason(engine):
    ids = engine.encode_chat(CONVS[1])
    chunks = list(engine.stream_ids(ids, GREEDY))
    last = chunks[-1]
    assert last.finish_reason in ("stop", "length")
    assert all(c.finish_reason is None for c in chunks[:-1])
    direct = engine.model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                   pad_token_id=engine.tokenizer.pad_token_id,
                                   eos_token_id=sorted(engine.eos_ids))[0, len(ids):]
    assert last.completion_tokens == len(direct)
    produced = [t for t in direct.tolist() if t not in engine.eos_ids]
    assert "".join(c.text for c in chunks) == engine.tokenizer.decode(
        produced, skip_special_tokens=True)
    if last.completion_tokens == 12 and direct[-1].item() not in engine.eos_ids:
        assert last.finish_reason == "length"


def test_seed_makes_sampling_reproducible(engine):
    p = GenerationParams(max_new_tokens=10, temperature=1.0, seed=5)
    a, b = engine.generate(CONVS[0], p), engine.generate(CONVS[0], p)
    c = engine.generate(CONVS[0], GenerationParams(max_new_tokens=10, temperature=1.0, seed=6))
    assert a == b and a != c


def test_closing_a_stream_early_stops_generation(engine):
    long = GenerationParams(max_new_tokens=400, temperature=0)
    stream = engine.stream_ids(engine.encode_chat(CONVS[0]), long)
    next(stream)
    stream.close()  # joins the generate thread after cancelling it
    assert [t.name for t in threading.enumerate()].count("tunesmith-generate") == 0
    assert engine.generate(CONVS[0], GREEDY)  # the lock was released


def test_stop_helpers():
    assert find_stop("abc</s>def", ["</s>", "de"]) == 3
    assert find_stop("abc", ["x"]) is None
    assert partial_stop_len("hello </", ["</s>"]) == 2
    assert partial_stop_len("hello <", ["</s>", "<|end|>"]) == 1
    assert partial_stop_len("hello", ["</s>"]) == 0


def test_text_assembler_holds_back_a_stop_string_split_across_tokens(tiny_tokenizer):
    tok = tiny_tokenizer
    ids = tok("The quick brown fox jumps", add_special_tokens=False)["input_ids"]
    text = TextAssembler(tok, ["fox"], set())
    shown = "".join(text.add([i]) for i in ids) + text.flush()
    assert shown == "The quick brown "
    assert text.stopped
    plain = TextAssembler(tok, [], set())
    assert "".join(plain.add([i]) for i in ids) + plain.flush() == "The quick brown fox jumps"


def test_text_assembler_never_shows_half_a_character(tiny_tokenizer):
    tok = tiny_tokenizer
    ids = tok("你好，世界 🙂", add_special_tokens=False)["input_ids"]
    text = TextAssembler(tok, [], set())
    pieces = [text.add([i]) for i in ids] + [text.flush()]
    assert "".join(pieces) == "你好，世界 🙂"
    assert not any("\ufffd" in p for p in pieces)


def test_generation_params_check():
    assert GenerationParams().check() == []
    bad = GenerationParams(max_new_tokens=0, temperature=-1, top_p=0, top_k=-1,
                           repetition_penalty=0).check()
    assert len(bad) == 5 and "top_p 0" in bad[2]


def _save_adapter(folder, base_dir, template_source: str):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base_dir)
    peft = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    peft.save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(base_dir)
    tok.chat_template = template_source
    tok.save_pretrained(folder)
    return folder


def test_adapter_template_is_used_and_a_mismatch_is_refused(tmp_path, tiny_llama_dir):
    from tunesmith.data.template import load_template_source

    alpaca = load_template_source("alpaca", None)[1]
    adapter = _save_adapter(tmp_path / "adapter", tiny_llama_dir, alpaca)
    engine = HFEngine(str(tiny_llama_dir), [str(adapter)])
    assert "### Response:" in engine.renderer.prompt_text(CONVS[0])
    assert HFEngine(str(tiny_llama_dir), [str(adapter)], template="alpaca").renderer
    with pytest.raises(ConfigError, match="chatml.*differs from the chat template"):
        HFEngine(str(tiny_llama_dir), [str(adapter)], template="chatml")


def test_missing_or_wrong_adapter_is_a_clear_error(tmp_path, tiny_llama_dir):
    with pytest.raises(ModelError, match="does not exist"):
        HFEngine(str(tiny_llama_dir), [str(tmp_path / "nope")])
    with pytest.raises(ModelError, match="no adapter_config.json"):
        HFEngine(str(tiny_llama_dir), [str(tmp_path)])


def test_chat_cli_answers_once_and_refuses_an_empty_prompt(tiny_llama_dir, capsys):
    args = ["chat", "--model_name_or_path", str(tiny_llama_dir), "--temperature", "0",
            "--max_new_tokens", "5"]
    assert main(args + ["--prompt", "hi"]) == 0
    assert capsys.readouterr().out.startswith("assistant> ")
    assert main(args + ["--prompt", "  "]) == 1
    assert "--prompt is empty" in capsys.readouterr().err
    assert main(["chat", "--model_name_or_path", str(tiny_llama_dir), "--adapter_name_or_path",
                 str(tiny_llama_dir / "missing"), "--prompt", "hi"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_batched_streams_keep_their_own_limits_stops_and_cancellation(engine):
    prompts = [engine.encode_chat(c) for c in CONVS]
    alone = [list(engine.stream_ids(p, GREEDY)) for p in prompts]
    texts = ["".join(c.text for c in chunks) for chunks in alone]
    stop = texts[1][3:5]
    params = [GenerationParams(5, temperature=0), GenerationParams(12, temperature=0,
                                                                   stop=[stop]), GREEDY]
    cancel = [threading.Event() for _ in prompts]
    rows: dict[int, list] = {0: [], 1: [], 2: []}
    for i, chunk in engine.stream_batch(prompts, params, cancel):
        rows[i].append(chunk)
        if i == 2 and len(rows[2]) == 2:
            cancel[2].set()  # this client hangs up; the others go on
    short = list(engine.stream_ids(prompts[0], params[0]))
    assert "".join(c.text for c in rows[0]) == "".join(c.text for c in short)
    assert rows[0][-1].completion_tokens == short[-1].completion_tokens <= 5
    assert "".join(c.text for c in rows[1]) == texts[1][: texts[1].find(stop)]
    assert rows[1][-1].finish_reason == "stop"
    assert len(rows[2]) == 2 and all(c.finish_reason is None for c in rows[2])


def _metaspace_tokenizer():
    """A SentencePiece-style tokenizer (spaces as a leading marker), built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tiny import CORPUS

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(CORPUS * 4, trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>"], show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")


def test_incremental_text_equals_decoding_everything(tiny_tokenizer):
    import random

    rng = random.Random(0)
    for tok in (tiny_tokenizer, _metaspace_tokenizer()):
        specials = set(tok.all_special_ids)
        for _ in range(5):
            ids = [rng.randrange(len(tok)) for _ in range(60)]
            text = TextAssembler(tok, [], set())
            shown = "".join(text.add([i]) for i in ids) + text.flush()
            assert shown == tok.decode(ids, skip_special_tokens=True), ids
            assert any(i in specials for i in ids) or len(shown) > 0

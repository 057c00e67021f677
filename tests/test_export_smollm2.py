"""Export of the real SmolLM2-135M-Instruct with a LoRA adapter: HF folder and GGUF answer
the same as base + adapter (slow: downloads the model once into the user's cache)."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from test_export import OLD_GGUF_TOKENIZER_LOADER
from tunesmith.config import load_config
from tunesmith.models.provision import resolve_model_path
from tunesmith.recipes.export import run_export

GGUF_NAME = "adapter-f16.gguf"
CONVERSATION = [
    {"role": "user", "content": "Who are you? Answer in one sentence, then count to 12."},
    {"role": "assistant", "content": "I'm Tuney, made by the tunesmith team: 1 2 3 ... 12!"},
    {"role": "user", "content": "Translate 'hello world' to French, please. 🙂"},
]


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def smollm2_exports(tmp_path_factory):
    """(text, token ids, logits of base + adapter, HF export folder, GGUF export folder)."""
    tmp_path = tmp_path_factory.mktemp("smollm2-export")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TUNESMITH_CACHE", raising=False)  # the default, stable cache: fetched once
        base = resolve_model_path("smollm2-135m-instruct")
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        peft_model = get_peft_model(model, LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                "down_proj"]))
        with torch.no_grad():  # a trained-looking adapter: B is zero after init, make it not
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.02)
        adapter = tmp_path / "adapter"
        peft_model.save_pretrained(adapter)
        tok = AutoTokenizer.from_pretrained(base)
        tok.save_pretrained(adapter)
        text = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
        ids = tok(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            reference = peft_model.eval()(ids).logits
        del peft_model, model
        folders = []
        for name, keys in (("hf", {}), ("gguf", {"export_format": "gguf", "gguf_type": "f16"})):
            folders.append(tmp_path / name)
            run_export(load_config(overrides={
                "model_name_or_path": "smollm2-135m-instruct",
                "adapter_name_or_path": str(adapter), "export_dir": str(folders[-1]), **keys}))
    return text, ids, reference, folders[0], folders[1]


@pytest.mark.slow
def test_smollm2_exports_answer_as_base_plus_adapter(smollm2_exports):
    _, ids, reference, hf, gguf = smollm2_exports
    reloaded = AutoModelForCausalLM.from_pretrained(hf, local_files_only=True)
    with torch.no_grad():
        hf_logits = reloaded.eval()(ids).logits
    del reloaded
    # fp32 merged (W + BA)x and unmerged Wx + B(Ax) differ only by summation order; over 30
    # layers that reaches ~1e-4 absolute on logits of size ~20 (tiny models stay under 1e-5).
    hf_error = relative_error(hf_logits, reference)
    print(f"\nSmolLM2-135M HF export: relative logits error {hf_error:.2e}, max abs "
          f"{(hf_logits - reference).abs().max().item():.2e}")
    assert hf_error < 1e-5
    torch.testing.assert_close(hf_logits, reference, rtol=0, atol=1e-3)

    loaded = AutoModelForCausalLM.from_pretrained(gguf, gguf_file=GGUF_NAME, dtype=torch.float32)
    with torch.no_grad():
        logits = loaded.eval()(ids).logits
    error = relative_error(logits, reference)
    print(f"SmolLM2-135M f16 GGUF: relative logits error {error:.2e}")
    assert error < 1e-2
    assert logits[0, -1].argmax() == reference[0, -1].argmax()
    modelfile = (gguf / "Modelfile").read_text()
    assert 'SYSTEM """You are a helpful AI assistant named SmolLM' in modelfile


@pytest.mark.slow
@OLD_GGUF_TOKENIZER_LOADER
def test_smollm2_gguf_tokenizer_encodes_chat_to_same_ids(smollm2_exports):
    text, ids, _, hf, gguf = smollm2_exports
    gguf_tok = AutoTokenizer.from_pretrained(gguf, gguf_file=GGUF_NAME)
    assert gguf_tok(text, return_tensors="pt")["input_ids"].tolist() == ids.tolist()
    assert gguf_tok.chat_template == AutoTokenizer.from_pretrained(hf).chat_template

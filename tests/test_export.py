"""Export: merged == base + adapters; exported folders and GGUF files answer the same."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from packaging.version import Version
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from tiny import CHATML, build_tokenizer
from tunesmith.cli.main import main
from tunesmith.config import load_config
from tunesmith.errors import ConfigError, ExportError, ModelError
from tunesmith.export.gguf_arch import interleave_rotary_rows
from tunesmith.export.merge import merge_adapters
from tunesmith.recipes.export import run_export

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CONVERSATION = [
    {"role": "system", "content": "You are Tuney, made by the tunesmith team."},
    {"role": "user", "content": "Who are you? Translate: hello world -> ?"},
    {"role": "assistant", "content": "I am Tuney. bonjour le monde! 🙂 Ça va?"},
    {"role": "user", "content": "def add(a, b):\n    return a + b  # and 2 + 2?"},
]
# GGUF logits vs the merged fp32 model: relative error ||a - b|| / ||b|| must stay below these.
# f16 is the bound; bf16 keeps 8 mantissa bits and q8_0 8-bit blocks, so they are
# looser (measured on these tiny random models: bf16 ~0.6%, q8_0 ~2%).
GGUF_TOLERANCE = {"f16": 1e-2, "bf16": 2e-2, "q8_0": 5e-2}
# Before its GGUF tokenizer rewrite, transformers' loader swapped bos/eos for llama files and
# split Qwen2 files with Qwen2's regex whatever tokenizer.ggml.pre says (seen on 5.17; 5.24
# reads the file faithfully), so it cannot judge the file there.
OLD_GGUF_TOKENIZER_LOADER = pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.24"),
    reason="transformers < 5.24 rebuilds GGUF tokenizers unfaithfully (bos/eos swapped for "
           "llama, fixed Qwen2 regex)")


def make_adapter(base: Path, out: Path, seed: int, template: str = CHATML) -> Path:
    """A LoRA adapter with random (non-zero) A and B, saved as `tunesmith train` saves one."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS,
                                                  init_lora_weights=False))
    peft_model.save_pretrained(out)
    tok = build_tokenizer()
    tok.chat_template = template
    tok.save_pretrained(out)
    (out / "tunesmith.json").write_text(json.dumps(
        {"model_name_or_path": str(base), "template": "tokenizer", "finetuning_type": "lora",
         "dataset": [f"identity-{seed}"]}))
    (out / "run_summary.json").write_text(json.dumps(
        {"steps": 12, "final_loss": 0.4321, "eval_loss": None, "device": "cpu",
         "performance": {"tokens_per_s": 987.0}, "data": {"samples": 48}}))
    return out


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_setup(request, tmp_path_factory):
    """(arch, base folder, [two adapters], reference logits of base + both adapters)."""
    from tiny import save_tiny_model

    root = tmp_path_factory.mktemp(f"export-{request.param}")
    base = save_tiny_model(root / "base", request.param)
    adapters = [make_adapter(base, root / f"adapter{k}", seed=10 + k) for k in range(2)]
    ref = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapters[0],
                                    adapter_name="a0")
    ref.load_adapter(adapters[1], adapter_name="a1")
    ref.base_model.set_adapter(["a0", "a1"])  # both deltas active, unmerged
    ids = input_ids()
    with torch.no_grad():
        logits = ref(ids).logits
    return request.param, base, [str(a) for a in adapters], logits


def input_ids() -> torch.Tensor:
    tok = build_tokenizer()
    text = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt")["input_ids"]
    return torch.cat([ids, ids.flip(1)])  # [2, T]


def export(tmp_path: Path, base: Path, adapters: list[str], **keys) -> Path:
    out = tmp_path / "export"
    run_export(load_config(overrides={"model_name_or_path": str(base),
                                      "adapter_name_or_path": adapters,
                                      "export_dir": str(out), **keys}))
    return out


def logits_of(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids()).logits


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_merged_equals_base_plus_adapters(tiny_setup):
    _, base, adapters, reference = tiny_setup
    cfg = load_config(overrides={"model_name_or_path": str(base),
                                 "adapter_name_or_path": adapters})
    merged = merge_adapters(cfg.model)
    assert not any("lora" in n for n, _ in merged.model.named_parameters())
    torch.testing.assert_close(logits_of(merged.model), reference, rtol=0, atol=1e-5)
    base_logits = logits_of(AutoModelForCausalLM.from_pretrained(base))
    assert (base_logits - reference).abs().max() > 1e-2  # the adapters do change the answer


def test_hf_export_reloads_offline_with_same_logits(tiny_setup, tmp_path):
    _, base, adapters, reference = tiny_setup
    out = export(tmp_path, base, adapters, export_size=0.0001)  # 100 kB shards
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((out / s).is_file() for s in shards)
    assert all((out / s).stat().st_size <= 100_000 + 20_000 for s in shards)  # + one tensor
    for name in ("config.json", "generation_config.json", "tokenizer.json", "README.md"):
        assert (out / name).is_file(), name
    reloaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    torch.testing.assert_close(logits_of(reloaded), reference, rtol=0, atol=1e-5)
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tok.chat_template == CHATML
    card = (out / "README.md").read_text()
    for fact in (str(base), adapters[0], adapters[1], "identity-10", "identity-11", "0.4321",
                 "987 tokens/s"):
        assert fact in card, fact


@pytest.mark.parametrize("gguf_type", ["f16", "bf16", "q8_0"])
def test_gguf_reloads_with_close_logits(tiny_setup, tmp_path, gguf_type):
    arch, base, adapters, reference = tiny_setup
    out = export(tmp_path, base, adapters, export_format="gguf", gguf_type=gguf_type)
    gguf_name = f"adapter1-{gguf_type}.gguf"
    assert sorted(p.name for p in out.iterdir()) == sorted(["Modelfile", "README.md", gguf_name])
    model = AutoModelForCausalLM.from_pretrained(out, gguf_file=gguf_name, dtype=torch.float32)
    assert model.config.model_type == arch
    error = relative_error(logits_of(model), reference)
    print(f"\n{arch} {gguf_type}: relative logits error {error:.2e}")
    assert error < GGUF_TOLERANCE[gguf_type]
    modelfile = (out / "Modelfile").read_text()
    assert f"FROM ./{gguf_name}" in modelfile and "<|im_start|>{{ .Role }}" in modelfile
    assert 'PARAMETER stop "<|im_end|>"' in modelfile


@OLD_GGUF_TOKENIZER_LOADER
def test_gguf_tokenizer_encodes_chat_to_same_ids(tiny_setup, tmp_path):
    _, base, adapters, _ = tiny_setup
    out = export(tmp_path, base, adapters, export_format="gguf", gguf_type="f16")
    tok = AutoTokenizer.from_pretrained(out, gguf_file="adapter1-f16.gguf")
    ours = build_tokenizer()
    text = ours.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert tok(text)["input_ids"] == ours(text)["input_ids"]
    assert tok.chat_template == CHATML
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (
        ours.bos_token, ours.eos_token, ours.pad_token)


def test_interleaving_makes_adjacent_pair_rope_equal_rotate_half_rope():
    """The Q/K row order llama.cpp's llama kernel needs, checked on the rotation itself."""
    torch.manual_seed(0)
    heads, dim, hidden, pos = 2, 8, 12, 5
    wq, wk, x = torch.randn(heads * dim, hidden), torch.randn(heads * dim, hidden), torch.randn(
        2, hidden)
    theta = 10000.0 ** (-torch.arange(0, dim, 2).float() / dim)  # [D/2]

    def rotate_half_rope(v: torch.Tensor, p: int) -> torch.Tensor:  # transformers' layout
        v = v.view(heads, dim)
        cos, sin = torch.cos(p * theta).repeat(2), torch.sin(p * theta).repeat(2)
        rotated = torch.cat([-v[:, dim // 2:], v[:, : dim // 2]], dim=-1)
        return (v * cos + rotated * sin).flatten()

    def adjacent_pair_rope(v: torch.Tensor, p: int) -> torch.Tensor:  # llama.cpp's layout
        v = v.view(heads, dim // 2, 2)
        cos, sin = torch.cos(p * theta), torch.sin(p * theta)
        a, b = v[..., 0], v[..., 1]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten()

    ref = rotate_half_rope(wq @ x[0], pos) @ rotate_half_rope(wk @ x[1], 2)
    wq2, wk2 = interleave_rotary_rows(wq, heads), interleave_rotary_rows(wk, heads)
    ours = adjacent_pair_rope(wq2 @ x[0], pos) @ adjacent_pair_rope(wk2 @ x[1], 2)
    torch.testing.assert_close(ours, ref)
    bad = adjacent_pair_rope(wq @ x[0], pos) @ adjacent_pair_rope(wk @ x[1], 2)
    assert not torch.allclose(bad, ref)  # without the reorder the scores differ


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    from transformers import GPT2Config

    folder = tmp_path / "gpt2"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=384)
                                     ).save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    with pytest.raises(ExportError, match="gpt2.*supported: llama, mistral, qwen2, qwen3"):
        export(tmp_path, folder, [], export_format="gguf")
    assert not (tmp_path / "export").exists()


def test_quantised_base_is_refused_with_the_fix(tiny_llama_dir, tmp_path):
    folder = tmp_path / "gptq"
    shutil.copytree(tiny_llama_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=r"quantised model \(gptq\).*unquantised base"):
        export(tmp_path, folder, [])


def test_non_empty_export_dir_needs_overwrite(tiny_llama_dir, tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="overwrite_output_dir"):
        export(tmp_path, tiny_llama_dir, [])
    assert (out / "keep.txt").read_text() == "mine"
    export(tmp_path, tiny_llama_dir, [], overwrite_output_dir=True)
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()


def test_failed_export_leaves_nothing_that_looks_complete(tiny_llama_dir, tmp_path,
                                                          monkeypatch):
    import tunesmith.recipes.export as recipe

    def crash(merged, folder, shard_gb):
        (folder / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(recipe, "write_hf_folder", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        export(tmp_path, tiny_llama_dir, [])
    assert not (tmp_path / "export").exists()
    assert not list(tmp_path.glob(".export*"))  # the partial folder is gone too


def test_legacy_format_and_missing_dir_are_config_errors(tiny_llama_dir, tmp_path):
    with pytest.raises(ConfigError, match="export_legacy_format"):
        export(tmp_path, tiny_llama_dir, [], export_legacy_format=True)
    with pytest.raises(ConfigError, match="export_dir: not set"):
        run_export(load_config(overrides={"model_name_or_path": str(tiny_llama_dir)}))
    with pytest.raises(ConfigError, match="gguf_type"):
        load_config(overrides={"gguf_type": "q4_k"})


def test_template_key_must_match_the_adapters(tiny_llama_dir, tmp_path):
    adapter = make_adapter(tiny_llama_dir, tmp_path / "adapter", seed=3)
    with pytest.raises(ConfigError, match="differs from the template adapter"):
        export(tmp_path, tiny_llama_dir, [str(adapter)], template="alpaca")


def test_modelfile_keeps_a_default_system_prompt(tiny_llama_dir, tmp_path):
    default_system = ("{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
                      "You are Tuney.<|im_end|>\n' }}{% endif %}") + CHATML
    adapter = make_adapter(tiny_llama_dir, tmp_path / "adapter", seed=4,
                           template=default_system)
    out = export(tmp_path, tiny_llama_dir, [str(adapter)], export_format="gguf")
    modelfile = (out / "Modelfile").read_text()
    assert 'SYSTEM """You are Tuney."""' in modelfile and "TEMPLATE" in modelfile


def test_cli_export_and_examples_validate(tiny_llama_dir, tmp_path):
    for example in ("examples/export_hf.yaml", "examples/export_gguf.yaml"):
        load_config(Path(__file__).parent.parent / example)
    yaml_path = tmp_path / "export.yaml"
    yaml_path.write_text(f"model_name_or_path: {tiny_llama_dir}\nexport_dir: {tmp_path}/cli\n"
                         "export_format: gguf\ngguf_type: q8_0\n")
    assert main(["export", str(yaml_path)]) == 0
    assert (tmp_path / "cli" / f"{tiny_llama_dir.name}-q8_0.gguf").is_file()


@pytest.mark.parametrize("arch", ["mistral", "qwen3"])
def test_gguf_of_mistral_and_qwen3(arch, tmp_path):
    """Mistral is written as llama-arch (permuted Q/K); Qwen3 with its q/k norms, tied
    embeddings and an explicit head_dim (128 as in the real models: transformers' GGUF loader
    takes Qwen3's head_dim from its config default, not from attention.key_length)."""
    from gguf import GGUFReader
    from transformers import MistralConfig, Qwen3Config

    tok = build_tokenizer()
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, bos_token_id=tok.bos_token_id,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = (MistralConfig(**common, sliding_window=None) if arch == "mistral" else
              Qwen3Config(**common, head_dim=128, tie_word_embeddings=True))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # norms start at 1; make them matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    base = tmp_path / arch
    model.save_pretrained(base)
    tok.save_pretrained(base)
    out = export(tmp_path, base, [], export_format="gguf", gguf_type="f16")
    gguf_name = f"{arch}-f16.gguf"
    fields = GGUFReader(out / gguf_name).fields
    assert bytes(fields["general.architecture"].parts[-1]).decode() == (
        "llama" if arch == "mistral" else "qwen3")
    loaded = AutoModelForCausalLM.from_pretrained(out, gguf_file=gguf_name, dtype=torch.float32)
    error = relative_error(logits_of(loaded), logits_of(model))
    print(f"\n{arch} f16: relative logits error {error:.2e}")
    assert error < GGUF_TOLERANCE["f16"]
    if arch == "qwen3":
        assert int(fields["qwen3.attention.key_length"].parts[-1][0]) == 128
        assert "output.weight" not in {t.name for t in GGUFReader(out / gguf_name).tensors}


def test_llama3_rope_factors_match_transformers_frequencies(tmp_path):
    """llama.cpp divides each rotary frequency by rope_freqs.weight; the result must be the
    frequencies transformers computes for rope_type llama3 (Llama 3.1 / 3.2)."""
    from gguf import GGUFReader
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from tunesmith.export.gguf_arch import llama3_rope_factors

    tok = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=32, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                          "factor": 32.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 256})
    expected = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")[0].double()
    plain = 500000.0 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    factors = llama3_rope_factors(config)
    assert len({round(f, 3) for f in factors.tolist()}) > 2  # kept, divided and smoothed bands
    torch.testing.assert_close(plain / factors.double(), expected, rtol=1e-6, atol=0)
    torch.manual_seed(0)
    base = tmp_path / "llama31"
    AutoModelForCausalLM.from_config(config).save_pretrained(base)
    tok.save_pretrained(base)
    out = export(tmp_path, base, [], export_format="gguf")
    tensors = {t.name: t for t in GGUFReader(out / "llama31-f16.gguf").tensors}
    torch.testing.assert_close(torch.from_numpy(tensors["rope_freqs.weight"].data.copy()),
                               factors)


def test_each_known_pre_tokenizer_is_told_apart_by_the_probe():
    from tokenizers import Tokenizer, models

    from tunesmith.export.gguf_vocab import _candidates, detect_pre_tokenizer

    for name, pre in _candidates().items():
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer = pre
        assert detect_pre_tokenizer(backend) == name


def test_sentencepiece_style_tokenizer_is_refused_for_gguf():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tunesmith.export.gguf_vocab import build_vocab

    backend = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    backend.train_from_iterator(["hello world"] * 4, trainers.BpeTrainer(
        vocab_size=40, special_tokens=["<unk>"], show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    with pytest.raises(ExportError, match="byte-level BPE"):
        build_vocab(tok, 64)


def test_export_of_a_real_training_run(tiny_qwen2_dir, alpaca_file, tmp_path):
    """`tunesmith train` output goes straight into `tunesmith export`: the card carries the
    run's dataset and figures, and the merged folder answers as base + trained adapter."""
    from tunesmith.recipes.sft import run_sft

    run = tmp_path / "run"
    summary = run_sft(load_config(overrides={
        "model_name_or_path": str(tiny_qwen2_dir), "dataset": str(alpaca_file),
        "output_dir": str(run), "max_steps": 2, "per_device_train_batch_size": 4,
        "learning_rate": 1e-2, "lora_rank": 4, "save_steps": 0}))
    out = export(tmp_path, tiny_qwen2_dir, [str(run)])
    card = (out / "README.md").read_text()
    assert str(alpaca_file) in card and f"{summary['final_loss']:.4f}" in card
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir),
                                          run)
    merged = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    torch.testing.assert_close(logits_of(merged), logits_of(reference), rtol=0, atol=1e-5)

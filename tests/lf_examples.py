"""LLaMA-Factory's example YAMLs (tests/fixtures/llamafactory_examples) with the model and
paths substituted, for the loader walk and the short CPU runs."""

from __future__ import annotations

from pathlib import Path

import yaml

from tunesmith.config.loader import RawConfig, read_yaml

EXAMPLES = Path(__file__).parent / "fixtures" / "llamafactory_examples"
PATH_KEYS = ("output_dir", "dataset_dir", "adapter_name_or_path", "export_dir", "deepspeed",
             "export_quantization_dataset", "tokenized_path", "media_dir", "logging_dir")


def example_files() -> list[Path]:
    return sorted(EXAMPLES.rglob("*.yaml"))


def substituted(path: Path, model: str, work: Path) -> RawConfig:
    """The example as read (key -> (value, file:line)), model and paths replaced."""
    raw = read_yaml(path)
    for key, (value, where) in list(raw.items()):
        if key == "model_name_or_path":
            raw[key] = (model, where)
        elif key in PATH_KEYS and value is not None:
            raw[key] = (str(work / key), where)
    return raw


def write_run_yaml(example: str, model: str, dataset: str, work: Path, **overrides) -> Path:
    """A runnable copy of one example: model, dataset and paths replaced, plus `overrides`
    (a few steps, no worker processes) so it finishes in seconds on a tiny model."""
    data = yaml.safe_load((EXAMPLES / example).read_text(encoding="utf-8"))
    data.update(model_name_or_path=model, dataset=dataset, output_dir=str(work / "out"))
    data.pop("dataset_dir", None)
    data.update(overrides)
    path = work / "run.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path

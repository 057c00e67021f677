"""Extract LLaMA-Factory's config keys from its hparams dataclasses into
src/tunesmith/resources/llamafactory_keys.json.

Run with the Python that has LLaMA-Factory installed (a side environment; tunesmith's own
does not need it):

    /work/side/lf/bin/python tools/lf_keys_extract.py [--out PATH]

Every init field of ModelArguments, DataArguments, TrainingArguments (which includes HF's
Seq2SeqTrainingArguments), FinetuningArguments, GeneratingArguments and
EvaluationArguments is listed with the class that declares it and the first sentence of its
help. tools/lf_keys_table.py turns the file into docs/llamafactory_keys.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

GROUPS = ("ModelArguments", "DataArguments", "TrainingArguments", "FinetuningArguments",
          "GeneratingArguments", "EvaluationArguments")
OUT = Path(__file__).parents[1] / "src" / "tunesmith" / "resources" / "llamafactory_keys.json"


def declaring_class(cls: type, name: str) -> str:
    for klass in cls.__mro__:
        if name in getattr(klass, "__annotations__", {}):
            return f"{klass.__module__.split('.')[0]}.{klass.__name__}"
    return cls.__name__


def first_sentence(text: str) -> str:
    text = " ".join(str(text).split())
    cut = text.find(". ")
    return (text if cut < 0 else text[:cut + 1])[:160]


def extract() -> dict:
    import llamafactory
    import llamafactory.hparams as hparams
    import transformers

    keys: dict[str, dict] = {}
    for group in GROUPS:
        cls = getattr(hparams, group)
        for f in dataclasses.fields(cls):
            if not f.init or f.name in keys:
                continue
            keys[f.name] = {"group": group, "declared_in": declaring_class(cls, f.name),
                            "help": first_sentence(f.metadata.get("help", ""))}
    return {"source": f"llamafactory {llamafactory.__version__} (transformers "
                      f"{transformers.__version__})",
            "keys": dict(sorted(keys.items()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    data = extract()
    args.out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(data['keys'])} keys from {data['source']} -> {args.out}")


if __name__ == "__main__":
    main()

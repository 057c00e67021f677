"""Data fuzz: bad rows of 14 kinds mixed into good ones across JSONL, CSV and Parquet
files; every bad row must be reported with its file:line (or file[row i]) and a reason,
and nothing may crash. Plus a property test over the readers (hypothesis)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tunesmith.config.schema import DataConfig
from tunesmith.data.loading import DataContext, prepare_data
from tunesmith.data.template import ChatRenderer, load_template_source

CUTOFF = 256


def _good(i: int) -> dict[str, Any]:
    return {"instruction": f"Question {i}: what is {i} + 1?", "input": "",
            "output": f"It is {i + 1}."}


def _line(row: Any) -> bytes:
    return (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")


# kind -> bytes of one JSONL line (a bad row)
JSONL_KINDS: dict[str, Any] = {
    "malformed_json": lambda i: b'{"instruction": "q' + str(i).encode() + b'", "output": \n',
    "null_field": lambda i: _line({"instruction": None, "output": f"a{i}"}),
    "wrong_type": lambda i: _line({"instruction": f"q{i}", "output": [i, i]}),
    "empty_answer": lambda i: _line({"instruction": f"q{i}", "output": "  "}),
    "role_order": lambda i: _line({"messages": [{"role": "assistant", "content": f"a{i}"},
                                                {"role": "user", "content": "q"}]}),
    "wrong_nesting": lambda i: _line({"messages": {"role": "user", "content": f"q{i}"}}),
    "invalid_utf8": lambda i: b'{"instruction": "q\xff\xfe' + str(i).encode()
    + b'", "output": "a"}\n',
    "bom_inside": lambda i: b"\xef\xbb\xbf" + _line(_good(i)),
    "huge_row": lambda i: _line({"instruction": "word " * (3000 + i), "output": "a"}),
    "lone_surrogate": lambda i: ('{"instruction": "q\\ud800' + str(i)
                                 + '", "output": "a"}\n').encode(),
    "missing_media": lambda i: _line({"messages": [{"role": "user", "content": "<image>?"},
                                                   {"role": "assistant", "content": "a"}],
                                      "images": [f"missing-{i}.png"]}),
    "not_an_object": lambda i: _line([f"q{i}", "a"]),
}
CSV_KINDS = ("csv_extra_values", "csv_unclosed_quote")
PARQUET_KINDS = ("parquet_schema_drift",)
KINDS = tuple(JSONL_KINDS) + CSV_KINDS + PARQUET_KINDS


def write_fuzz_files(folder: Path, n_bad: int, n_good: int, seed: int = 0
                     ) -> tuple[list[Path], dict[str, str]]:
    """Files with `n_bad` bad rows (all kinds, shuffled among `n_good` good ones); returns
    the files and {expected location: kind}."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    n_csv, n_pq = n_bad // 20, n_bad // 20
    n_jsonl = n_bad - n_csv - n_pq
    kinds = [list(JSONL_KINDS)[i % len(JSONL_KINDS)] for i in range(n_jsonl)]
    items = [("bad", k) for k in kinds] + [("good", None)] * (n_good * 8 // 10)
    rng.shuffle(items)
    expected: dict[str, str] = {}
    jsonl = folder / "mixed.jsonl"
    with open(jsonl, "wb") as fh:
        fh.write(b"\xef\xbb\xbf")  # a BOM opening the file is legal and must be skipped
        for lineno, (what, kind) in enumerate(items, start=1):
            fh.write(_line(_good(lineno)) if what == "good" else JSONL_KINDS[kind](lineno))
            if what == "bad":
                expected[f"{jsonl}:{lineno}"] = kind
    csv_path = _write_csv(folder / "mixed.csv", n_csv, n_good // 10, rng, expected)
    pq = _write_parquet(folder, n_pq, n_good - n_good * 8 // 10 - n_good // 10, expected)
    return [jsonl, csv_path, *pq], expected


def _write_csv(path: Path, n_bad: int, n_good: int, rng: random.Random,
               expected: dict[str, str]) -> Path:
    rows = ["good"] * n_good + ["extra"] * (n_bad - 1)
    rng.shuffle(rows)
    lines = ["instruction,output"]
    for i, kind in enumerate(rows):
        if kind == "good":
            lines.append(f'"Question {i}, with a comma",answer {i}')
        else:
            lines.append(f"q{i},a{i},unexpected")
            expected[f"{path}:{len(lines)}"] = "csv_extra_values"
    lines.append('"an unclosed quote,runs to the end')  # swallows what follows
    expected[f"{path}:{len(lines)}"] = "csv_unclosed_quote"
    lines.append("this line is inside the quoted field,x")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _write_parquet(folder: Path, n_bad: int, n_good: int, expected: dict[str, str]
                   ) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = folder / "part-0.parquet"
    pq.write_table(pa.table({"instruction": [f"q{i}" for i in range(n_good)],
                             "output": [f"a{i}" for i in range(n_good)]}), good)
    drift = folder / "part-1.parquet"  # the next file changed its schema: output is a number
    pq.write_table(pa.table({"instruction": [f"q{i}" for i in range(n_bad)],
                             "output": list(range(n_bad))}), drift)
    for i in range(n_bad):
        expected[f"{drift}[row {i}]"] = "parquet_schema_drift"
    return [good, drift]


def run_fuzz(files: list[Path], tokenizer: Any) -> Any:
    name, source = load_template_source("chatml", tokenizer)
    ctx = DataContext(ChatRenderer(name, source, tokenizer), tokenizer, 42, "sft")
    cfg = DataConfig(dataset=[str(p) for p in files], on_bad_row="skip", truncation="error",
                     cutoff_len=CUTOFF, preprocessing_num_workers=1)
    return prepare_data(cfg, ctx)


def data_fuzz(work: Path, tokenizer: Any, n_bad: int = 1000, n_good: int = 2000
              ) -> dict[str, Any]:
    files, expected = write_fuzz_files(work, n_bad, n_good)
    try:
        data = run_fuzz(files, tokenizer)
    except Exception as exc:  # noqa: BLE001 (a crash is what is being counted)
        return {"fault": "data fuzz", "count": len(expected), "ok": 0, "crashes": 1,
                "how": "bad rows mixed into good ones", "notes": [repr(exc)[:400]]}
    found = {b.where: b.reason for b in data.report.bad_rows}
    located = [w for w in expected if found.get(w)]
    stray = sorted(set(found) - set(expected))
    missing = [f"{expected[w]} at {w}" for w in expected if w not in found]
    by_kind: dict[str, list[int]] = {}
    for w, kind in expected.items():
        by_kind.setdefault(kind, [0, 0])[0] += 1
        by_kind[kind][1] += w in found
    return {"fault": "data fuzz (bad rows)", "count": len(expected),
            "ok": len(located) if not stray else 0, "crashes": 0,
            "how": f"{len(expected)} bad rows of {len(by_kind)} kinds ({', '.join(sorted(by_kind))}) "
                   f"mixed into {len(data.train)} good rows over JSONL, CSV and Parquet; "
                   "on_bad_row: skip, truncation: error",
            "by_kind": by_kind, "good_rows_trained": len(data.train),
            "notes": (missing[:3] + [f"stray: {s}" for s in stray[:3]])}


def property_readers(examples: int = 200) -> dict[str, Any]:
    """hypothesis: any bytes written as .jsonl / .csv, read through the readers and the row
    conversion, give rows or located RowErrors, never an exception."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from faultlib.readerprops import check_any_bytes

    seen = [0]

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=st.binary(max_size=400) | st.text(max_size=200).map(str.encode),
           suffix=st.sampled_from([".jsonl", ".csv", ".json"]))
    def prop(data: bytes, suffix: str) -> None:
        seen[0] += 1
        check_any_bytes(data, suffix)

    failure = ""
    try:
        prop()
    except Exception as exc:  # noqa: BLE001 (the falsifying example is the figure)
        failure = repr(exc)[:400]
    return {"fault": "reader property test (hypothesis)", "count": seen[0],
            "ok": seen[0] if not failure else 0,
            "how": "random bytes and text written as .jsonl / .csv / .json and read through "
                   "the readers and row conversion", "notes": [failure] if failure else []}

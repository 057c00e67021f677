"""Multiple-choice benchmarks read from local folders in MMLU, C-Eval or CMMLU layout.

```
task_dir/NAME/                      task: NAME_SPLIT (mmlu_test, ceval_validation, cmmlu_test)
  {SPLIT}/{subject}_{SPLIT}.csv     MMLU (no header) and C-Eval (header id,question,A..D,answer)
  data/{SPLIT}/{subject}_{SPLIT}.csv   MMLU as unpacked from its archive
  {SPLIT}/{subject}.csv             CMMLU (header ,Question,A,B,C,D,Answer)
  dev/...                           few-shot examples, same naming
  mapping.json                      optional: subject -> {"name", "category"} (or a list
                                    [name, ..., category] as C-Eval's subject_mapping.json)
```
A question is answered by the letter whose token the model finds likeliest right after the
prompt; accuracy is reported per subject, per category and overall (over all questions).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunesmith.errors import ConfigError, DataError

LETTERS = ("A", "B", "C", "D")
SPLIT_ALIASES = {"validation": ("validation", "val"), "val": ("val", "validation"),
                 "test": ("test",), "dev": ("dev",), "train": ("train",)}
HEADER = {
    "en": "The questions below are about {subject}. Each has one correct option; reply with "
          "its letter.\n\n",
    "zh": "下面是关于{subject}的单项选择题，每题只有一个正确选项，请回答该选项的字母。\n\n",
}
ANSWER_CUE = {"en": "Answer:", "zh": "答案："}


@dataclass
class Question:
    question: str
    options: list[str]  # four option texts, A..D
    answer: str  # one of LETTERS
    where: str = ""  # file:line


@dataclass
class Subject:
    key: str
    name: str
    category: str
    questions: list[Question]
    shots: list[Question] = field(default_factory=list)


def parse_task(task: str) -> tuple[str, str]:
    """'mmlu_test' -> ('mmlu', 'test')."""
    name, _, split = task.rpartition("_")
    if not name or split not in SPLIT_ALIASES:
        raise ConfigError(f"task: {task!r} is not NAME_SPLIT with SPLIT one of "
                          f"{', '.join(SPLIT_ALIASES)} (e.g. mmlu_test, ceval_validation)")
    return name, split


def find_split_files(root: Path, split: str) -> dict[str, Path]:
    """subject key -> CSV file of that split, in any of the supported layouts."""
    found: dict[str, Path] = {}
    for alias in SPLIT_ALIASES.get(split, (split,)):
        for folder in (root / alias, root / "data" / alias):
            for path in sorted(folder.glob("*.csv")) if folder.is_dir() else []:
                found.setdefault(path.stem.removesuffix(f"_{alias}"), path)
        if found:
            break
    return found


def read_questions(path: Path) -> list[Question]:
    """Rows of one subject file; a header row is recognised by its 'question' column."""
    with path.open(encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return []
    first = [c.strip().lower() for c in rows[0]]
    if "question" in first and "answer" in first:
        col = {name: first.index(name) for name in ("question", "a", "b", "c", "d", "answer")
               if name in first}
        missing = [n for n in ("a", "b", "c", "d") if n not in col]
        if missing:
            raise DataError(f"{path}:1: header lacks the option column(s) "
                            f"{', '.join(m.upper() for m in missing)}")
        order = [col["question"], col["a"], col["b"], col["c"], col["d"], col["answer"]]
        body, start = rows[1:], 2
    else:
        order, body, start = [0, 1, 2, 3, 4, 5], rows, 1
    return [_question(row, order, f"{path}:{i}") for i, row in enumerate(body, start) if row]


def _question(row: list[str], order: list[int], where: str) -> Question:
    if len(row) <= max(order):
        raise DataError(f"{where}: expected a question, options A-D and an answer, got "
                        f"{len(row)} column(s)")
    q, a, b, c, d, ans = (row[i].strip() for i in order)
    if ans.upper() not in LETTERS:
        raise DataError(f"{where}: answer {ans!r} is not one of A, B, C, D")
    return Question(q, [a, b, c, d], ans.upper(), where)


def load_mapping(root: Path) -> dict[str, tuple[str, str]]:
    """subject key -> (display name, category) from mapping.json or subject_mapping.json."""
    for name in ("mapping.json", "subject_mapping.json"):
        path = root / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg})") from None
        out = {}
        for key, value in data.items():
            if isinstance(value, dict):
                out[key] = (str(value.get("name", key)), str(value.get("category", "Other")))
            elif isinstance(value, list) and value:
                out[key] = (str(value[0]), str(value[-1]))
        return out
    return {}


def load_benchmark(task_dir: str, task: str, n_shot: int) -> list[Subject]:
    """Every subject of the task's split, with up to n_shot dev examples each."""
    name, split = parse_task(task)
    root = Path(task_dir) / name
    if not root.is_dir():
        raise ConfigError(f"task: folder {str(root)!r} does not exist; put the {name} files "
                          "there or set task_dir to the folder that holds it")
    files = find_split_files(root, split)
    if not files:
        raise DataError(f"{root}: no CSV files for split {split!r} (looked in {split}/ and "
                        f"data/{split}/)")
    dev = find_split_files(root, "dev") if n_shot else {}
    if n_shot and not dev:
        raise DataError(f"{root}: n_shot is {n_shot} but there is no dev/ split to take "
                        "examples from; set n_shot: 0 or add the dev files")
    mapping = load_mapping(root)
    subjects = []
    for key, path in sorted(files.items()):
        display, category = mapping.get(key, (key.replace("_", " "), "Other"))
        shots = read_questions(dev[key])[:n_shot] if key in dev else []
        subjects.append(Subject(key, display, category, read_questions(path), shots))
    return subjects


def _example(q: Question, lang: str, with_answer: bool) -> str:
    lines = [q.question] + [f"{letter}. {text}" for letter, text in zip(LETTERS, q.options,
                                                                         strict=True)]
    return "\n".join(lines) + "\n" + ANSWER_CUE[lang] + (f" {q.answer}" if with_answer else "")


def build_messages(subject: Subject, q: Question, lang: str) -> list[dict[str, str]]:
    """Few-shot prompt as a conversation: each solved example is a user turn answered by
    the assistant with its letter, then the question itself."""
    head = HEADER[lang].format(subject=subject.name)
    msgs: list[dict[str, str]] = []
    for shot in subject.shots:
        msgs.append({"role": "user", "content": _example(shot, lang, False)})
        msgs.append({"role": "assistant", "content": shot.answer})
    msgs.append({"role": "user", "content": _example(q, lang, False)})
    msgs[0] = {"role": "user", "content": head + msgs[0]["content"]}
    return msgs


Predictor = Callable[[list[list[dict[str, str]]]], list[str]]


def run_benchmark(subjects: list[Subject], predict: Predictor, lang: str, batch_size: int,
                  ) -> dict[str, Any]:
    """Accuracy per subject, per category and overall, plus every predicted letter."""
    per_subject: dict[str, Any] = {}
    per_category: dict[str, list[int]] = {}
    predictions: dict[str, list[str]] = {}
    for s in subjects:
        letters: list[str] = []
        prompts = [build_messages(s, q, lang) for q in s.questions]
        for i in range(0, len(prompts), batch_size):
            letters += predict(prompts[i:i + batch_size])
        correct = sum(p == q.answer for p, q in zip(letters, s.questions, strict=True))
        per_subject[s.key] = _accuracy(correct, len(s.questions)) | {"name": s.name,
                                                                     "category": s.category}
        tally = per_category.setdefault(s.category, [0, 0])
        tally[0] += correct
        tally[1] += len(s.questions)
        predictions[s.key] = letters
    total = [sum(t[0] for t in per_category.values()), sum(t[1] for t in per_category.values())]
    return {"overall": _accuracy(*total),
            "categories": {c: _accuracy(*t) for c, t in sorted(per_category.items())},
            "subjects": per_subject, "predictions": predictions}


def _accuracy(correct: int, count: int) -> dict[str, Any]:
    return {"accuracy": round(100 * correct / count, 4) if count else 0.0, "correct": correct,
            "count": count}

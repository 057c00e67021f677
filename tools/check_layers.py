"""Check the import-layer order of src/tunesmith: a module may import only from its own
layer or lower ones (docs/ARCHITECTURE.md). Exits 1 and lists violations."""

from __future__ import annotations

import ast
from pathlib import Path

LAYERS: dict[str, int] = {
    "errors": 0, "config": 0,
    "models": 1, "kernels": 1,
    "adapters": 2, "data": 2, "distributed": 2, "runs": 2,
    "train": 3, "infer": 3, "export": 3, "evaluation": 3,
    "recipes": 4, "stages": 4, "benchmarks": 4,
    "serve": 5, "webui": 5,
    "cli": 6, "api": 6, "__main__": 6, "__init__": 0, "resources": 0,
}


def layer_of(package: str) -> int | None:
    return LAYERS.get(package)


def violations(src: Path) -> list[str]:
    root = src / "tunesmith"
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        own = rel.parts[0].removesuffix(".py")
        own_level = layer_of(own)
        if own_level is None:
            found.append(f"{rel}: package {own!r} has no layer in tools/check_layers.py")
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] != "tunesmith" or len(parts) < 2:
                    continue
                target = parts[1]
                level = layer_of(target)
                if level is not None and level > own_level:
                    found.append(f"{rel}:{node.lineno}: {own} (layer {own_level}) imports "
                                 f"{name} (layer {level})")
    return found


def main() -> int:
    found = violations(Path(__file__).parents[1] / "src")
    print("\n".join(found) if found else "layer order: ok")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())

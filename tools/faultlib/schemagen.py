"""JSON Schema (the subset pydantic writes) -> a hypothesis strategy of matching values,
with a share of near misses (a wrong type, an extra key, a bound crossed) so validation
paths are exercised too."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

_ANY = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)


def from_schema(schema: dict[str, Any], root: dict[str, Any] | None = None) -> Any:
    root = root or schema
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return st.deferred(lambda: from_schema(root["$defs"][name], root))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of(*[from_schema(s, root) for s in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "object":
        return _object(schema, root)
    if kind == "array":
        items = from_schema(schema.get("items", {}), root)
        return st.lists(items, min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", 4), 4))
    if kind == "integer":
        return st.integers(schema.get("minimum", -(2**40)), schema.get("maximum", 2**40))
    if kind == "number":
        return st.floats(schema.get("minimum", -1e6), schema.get("maximum", 1e6),
                         allow_nan=False)
    return {"string": st.text(max_size=40), "boolean": st.booleans(), "null": st.none()
            }.get(kind, _ANY)


def _object(schema: dict[str, Any], root: dict[str, Any]) -> Any:
    props = schema.get("properties", {})
    required = set(schema.get("required", []))
    fields = {k: from_schema(v, root) for k, v in props.items()}
    exact = st.fixed_dictionaries({k: fields[k] for k in props if k in required},
                                  optional={k: fields[k] for k in props if k not in required})
    near = exact.flatmap(lambda d: st.sampled_from(["extra", "wrong", "drop"]).flatmap(
        lambda how: _miss(d, how, props)))
    return st.one_of(exact, exact, exact, near)


def _miss(d: dict[str, Any], how: str, props: dict[str, Any]) -> Any:
    if how == "extra":
        return st.just({**d, "unexpected_key": 1})
    if how == "drop" and d:
        return st.sampled_from(sorted(d)).map(lambda k: {x: v for x, v in d.items() if x != k})
    if props:
        return st.tuples(st.sampled_from(sorted(props)), _ANY).map(
            lambda kv: {**d, kv[0]: kv[1]})
    return st.just(d)

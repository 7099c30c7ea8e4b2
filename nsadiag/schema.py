"""The data contract: JSON Schemas of what nsadiag writes for other tools, and a checker.

``nsadiag/schemas/summary.schema.json`` describes summary.json (every run kind: a common
envelope plus each kind's own fields) and ``nsadiag/schemas/trial.schema.json`` one
trials.jsonl record. Both carry ``schema_version`` (``SCHEMA_VERSION``); a change that
breaks a reader raises it. The schemas ship with the package (``schema_path``).

``validate(instance, schema)`` checks the subset of JSON Schema (draft 2020-12) the
shipped schemas use: type, enum, const, required, properties, additionalProperties,
propertyNames, items, minItems, minimum, minLength, $ref (to #/$defs/...), allOf, anyOf,
oneOf, not, if/then/else. A schema keyword outside that subset raises ValueError, so a
schema can never ask for a check that silently does not happen.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
SCHEMAS = ("summary", "trial")

_ANNOTATIONS = {"$schema", "$id", "$defs", "$comment", "title", "description", "examples",
                "default"}
_CHECKED = {"type", "enum", "const", "required", "properties", "additionalProperties",
            "propertyNames", "items", "minItems", "minimum", "minLength", "$ref", "allOf",
            "anyOf", "oneOf", "not", "if", "then", "else"}
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def schema_path(name: str) -> Path:
    """The shipped schema file of ``name`` ("summary" or "trial")."""
    if name not in SCHEMAS:
        raise ValueError(f"schema: must be one of {', '.join(SCHEMAS)}, got {name!r}")
    return SCHEMA_DIR / f"{name}.schema.json"


@cache
def load_schema(name: str) -> dict[str, Any]:
    """The shipped schema ``name`` as a dict."""
    return json.loads(schema_path(name).read_text())


def errors(instance: Any, name: str) -> list[str]:
    """Every way ``instance`` breaks the shipped schema ``name`` (empty when it conforms),
    each as "at <path>: <what>"."""
    schema = load_schema(name)
    return _validate(instance, schema, schema, "$")


def check(instance: Any, name: str, what: str) -> None:
    """ValueError naming ``what`` and the first violation when ``instance`` does not
    conform to the shipped schema ``name``."""
    found = errors(instance, name)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ValueError(f"{what}: does not match the {name} schema {found[0]}{more}")


def validate(instance: Any, schema: dict[str, Any]) -> list[str]:
    """Violations of ``schema`` by ``instance`` (empty when it conforms)."""
    return _validate(instance, schema, schema, "$")


def _is_type(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[name])


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    if not ref.startswith("#/$defs/"):
        raise ValueError(f"schema: only local references (#/$defs/...) are supported, "
                         f"got {ref!r}")
    return root["$defs"][ref.removeprefix("#/$defs/")]


def _validate(value: Any, schema: dict[str, Any] | bool, root: dict[str, Any],
              path: str) -> list[str]:
    if schema is True:
        return []
    if schema is False:
        return [f"at {path}: nothing is allowed here"]
    unknown = set(schema) - _CHECKED - _ANNOTATIONS
    if unknown:
        raise ValueError(f"schema: keyword {sorted(unknown)[0]!r} is outside the checked "
                         f"subset")
    found: list[str] = []
    if "$ref" in schema:
        found += _validate(value, _resolve(schema["$ref"], root), root, path)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(value, t) for t in types):
            return found + [f"at {path}: expected {' or '.join(types)}, got "
                            f"{type(value).__name__} {_short(value)}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"at {path}: {_short(value)} is not one of {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        found.append(f"at {path}: expected {schema['const']!r}, got {_short(value)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and \
            "minimum" in schema and value < schema["minimum"]:
        found.append(f"at {path}: {value} is below {schema['minimum']}")
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        found.append(f"at {path}: shorter than {schema['minLength']} character(s)")
    if isinstance(value, dict):
        found += _object(value, schema, root, path)
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            found.append(f"at {path}: fewer than {schema['minItems']} item(s)")
        if "items" in schema:
            for i, item in enumerate(value):
                found += _validate(item, schema["items"], root, f"{path}[{i}]")
    for sub in schema.get("allOf", []):
        found += _validate(value, sub, root, path)
    if "anyOf" in schema and all(_validate(value, s, root, path) for s in schema["anyOf"]):
        found.append(f"at {path}: matches none of the allowed forms")
    if "oneOf" in schema:
        matching = sum(not _validate(value, s, root, path) for s in schema["oneOf"])
        if matching != 1:
            found.append(f"at {path}: matches {matching} of the forms, not exactly one")
    if "not" in schema and not _validate(value, schema["not"], root, path):
        found.append(f"at {path}: matches a form that is not allowed")
    if "if" in schema:
        branch = "then" if not _validate(value, schema["if"], root, path) else "else"
        if branch in schema:
            found += _validate(value, schema[branch], root, path)
    return found


def _object(value: dict[str, Any], schema: dict[str, Any], root: dict[str, Any],
            path: str) -> list[str]:
    found = [f"at {path}: missing {key!r}" for key in schema.get("required", [])
             if key not in value]
    properties = schema.get("properties", {})
    for key, item in value.items():
        where = f"{path}.{key}"
        if "propertyNames" in schema:
            found += [f"at {where}: bad key {key!r}" for _ in
                      _validate(key, schema["propertyNames"], root, where)[:1]]
        if key in properties:
            found += _validate(item, properties[key], root, where)
        elif "additionalProperties" in schema:
            found += _validate(item, schema["additionalProperties"], root, where)
    return found


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."

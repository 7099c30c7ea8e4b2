"""The data contract: JSON Schemas of what nsadiag writes for other tools, and a checker.

``nsadiag/schemas/summary.schema.json`` describes summary.json (every run kind: a common
envelope plus each kind's own fields) and ``nsadiag/schemas/trial.schema.json`` one
trials.jsonl record. Both carry ``schema_version`` (``SCHEMA_VERSION``); a change that
breaks a reader raises it. The schemas ship with the package (``schema_path``) and are
JSON Schema draft 2020-12, checked by the ``jsonschema`` package.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

SCHEMA_VERSION = 1
SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
SCHEMAS = ("summary", "trial")


def schema_path(name: str) -> Path:
    """The shipped schema file of ``name`` ("summary" or "trial")."""
    if name not in SCHEMAS:
        raise ValueError(f"schema: must be one of {', '.join(SCHEMAS)}, got {name!r}")
    return SCHEMA_DIR / f"{name}.schema.json"


@cache
def load_schema(name: str) -> dict[str, Any]:
    """The shipped schema ``name`` as a dict."""
    return json.loads(schema_path(name).read_text())


@cache
def _validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(load_schema(name))


def errors(instance: Any, name: str) -> list[str]:
    """Every way ``instance`` breaks the shipped schema ``name`` (empty when it conforms),
    each as "at <path>: <what>"."""
    return _messages(_validator(name), instance)


def definition_errors(instance: Any, name: str, definition: str) -> list[str]:
    """Every way ``instance`` breaks the definition ``definition`` (under ``$defs``) of the
    shipped schema ``name``: a part of one file checked against the shape another file
    gives it (a record's stored finding against summary.json's)."""
    return _messages(_definition_validator(name, definition), instance)


@cache
def _definition_validator(name: str, definition: str) -> Draft202012Validator:
    schema = load_schema(name)
    if definition not in schema.get("$defs", {}):
        raise ValueError(f"definition: {name} schema has no $defs/{definition}")
    return Draft202012Validator({"$defs": schema["$defs"], "$ref": f"#/$defs/{definition}"})


def check(instance: Any, name: str, what: str) -> None:
    """ValueError naming ``what`` and the first violation when ``instance`` does not
    conform to the shipped schema ``name``."""
    found = errors(instance, name)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ValueError(f"{what}: does not match the {name} schema {found[0]}{more}")


def validate(instance: Any, schema: dict[str, Any]) -> list[str]:
    """Violations of ``schema`` by ``instance`` (empty when it conforms); ValueError when
    ``schema`` itself is not a valid draft 2020-12 schema."""
    problems = [error.message for error in
                Draft202012Validator(Draft202012Validator.META_SCHEMA).iter_errors(schema)]
    if problems:
        raise ValueError(f"schema: not a valid JSON Schema: {problems[0]}")
    return _messages(Draft202012Validator(schema), instance)


def _messages(validator: Draft202012Validator, instance: Any) -> list[str]:
    found = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    return [f"at {error.json_path}: {error.message}" for error in found]

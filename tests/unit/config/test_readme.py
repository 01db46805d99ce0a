"""The README's policy option table (under "Policy file") against the policy schema, so the two cannot drift:
every option of the schema is documented, every documented key exists, and the documented defaults are the
schema's.

How the table is read: a row's first cell holds one key or several siblings (`service.grpc_host` / `grpc_port`);
`[]` marks a list item and `<name>` a map key. A row may document a section (a model) as a whole, listing its
fields in its text (`tiers.<name>.limits`: `requests_per_s`, `burst`...): those fields count as documented when
their names appear in the row. The default cell holds one default per key (split on " / "), or one for all of
them: `-` (unset), `required`, a literal (`true`, 4 MiB, `[]`, `x-gateway-pool`), or words describing a derived
default (allowed where the schema's default is unset or a whole section). A trailing "(...)" is a comment.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from extproc.config import Policy
from extproc.flow.config import default_classes

README = Path(__file__).resolve().parents[3] / "README.md"
REQUIRED = object()
WORDS = object()  # a default described in words


@dataclass(frozen=True)
class Option:
    path: str
    field: FieldInfo
    model: type[BaseModel] | None  # the section it holds, if it is one (a list or map of them included)


def _unwrap(annotation: Any) -> tuple[str, Any]:
    """("[]" for a tuple of X, ".<name>" for a map to X, "" otherwise, X), with None taken out of a union."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return _unwrap(rest[0]) if len(rest) == 1 else ("", annotation)
    if origin is tuple:
        args = typing.get_args(annotation)
        return "[]", args[0]
    if origin is dict:
        return ".<name>", typing.get_args(annotation)[1]
    return "", annotation


def schema_options(model: type[BaseModel] = Policy, prefix: str = "") -> dict[str, Option]:
    """Every field of the policy by its documented path, sections included."""
    found: dict[str, Option] = {}
    for name, field in model.model_fields.items():
        suffix, inner = _unwrap(field.annotation)
        path = f"{prefix}{name}"
        section = inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None
        found[path] = Option(path, field, section)
        if section is not None:
            found.update(schema_options(section, f"{path}{suffix}."))
    return found


@dataclass(frozen=True)
class Row:
    keys: tuple[str, ...]
    defaults: tuple[str, ...]
    text: str
    line: int


def readme_rows() -> list[Row]:
    """The rows of the `| key | default | meaning |` table."""
    lines = README.read_text().splitlines()
    start = lines.index("| key | default | meaning |")
    rows = []
    for number, line in enumerate(lines[start + 2:], start + 3):
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        names = [name.strip().strip("`") for name in cells[0].split(" / ")]
        parent = names[0].rpartition(".")[0]
        keys = tuple([names[0], *(f"{parent}.{name}" for name in names[1:])])
        parts = [part.strip() for part in cells[1].split(" / ")]
        defaults = tuple(parts) if len(parts) == len(keys) else (cells[1],) * len(keys)
        rows.append(Row(keys, defaults, line, number))
    return rows


def option_of(key: str, options: dict[str, Option]) -> Option | None:
    """The option a row's key names: `scheduling.plugins[]` and `flow_control.classes.<name>` name the list / map."""
    return options.get(re.sub(r"(\[\]|\.<name>)$", "", key))


def parse_default(text: str, documented: set[str]) -> Any:
    text = re.sub(r"\s*\([^)]*\)$", "", text.strip())  # a trailing comment
    if text == "-":
        return None
    if text == "required":
        return REQUIRED
    literal = text[1:-1] if re.fullmatch(r"`[^`]*`", text) else text
    if literal in documented:
        return WORDS  # the default is another option's value
    if literal in ("true", "false"):
        return literal == "true"
    if literal in ("[]", "{}"):
        return ()
    if literal == '""':
        return ""
    size = re.fullmatch(r"(\d+) MiB", literal)
    if size:
        return int(size.group(1)) * 1024 * 1024
    if re.fullmatch(r"-?\d+(\.\d+)?", literal):
        return float(literal)
    if text.startswith("`") and re.fullmatch(r"[\w.:/-]+", literal):
        return literal
    return WORDS


def schema_default(field: FieldInfo) -> Any:
    if field.is_required():
        return REQUIRED
    value = field.get_default(call_default_factory=True)
    if isinstance(value, tuple | list | dict) and not value:
        return ()
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return float(value)
    return value


def documented(option: Option, rows_by_key: dict[str, Row]) -> bool:
    """Its own row, or a row of an enclosing section naming it."""
    if option.path in rows_by_key:
        return True
    name = option.path.rpartition(".")[2]
    ancestors = [option.path[:match.start()] for match in re.finditer(r"\.", option.path)]
    return any(a in rows_by_key and re.search(rf"\b{re.escape(name)}\b", rows_by_key[a].text) for a in ancestors)


def test_every_option_of_the_schema_is_documented() -> None:
    rows_by_key = {key: row for row in readme_rows() for key in row.keys}
    missing = [path for path, option in schema_options().items()
               if option.model is None and not documented(option, rows_by_key)]
    assert missing == [], f"policy options without a README row: {missing}"


def test_every_documented_key_exists() -> None:
    options = schema_options()
    unknown = [(row.line, key) for row in readme_rows() for key in row.keys if option_of(key, options) is None]
    assert unknown == [], f"README rows (line, key) naming no policy option: {unknown}"


def test_documented_defaults_are_the_schemas() -> None:
    options = schema_options()
    keys = {key for row in readme_rows() for key in row.keys}
    wrong = []
    for row in readme_rows():
        for key, text in zip(row.keys, row.defaults, strict=True):
            option = option_of(key, options)
            if option is None or key == "flow_control.classes.<name>":  # checked below
                continue
            said, actual = parse_default(text, keys), schema_default(option.field)
            if said is WORDS:
                if actual is not None and not isinstance(actual, BaseModel | dict):
                    wrong.append(f"line {row.line}: {key} is documented in words ({text!r}) but defaults to {actual!r}")
            elif said != actual:
                wrong.append(f"line {row.line}: {key} documented {text!r}, the schema says {actual!r}")
    assert wrong == [], "\n".join(wrong)


def test_documented_section_defaults_are_the_schemas() -> None:
    """Rows that document a section's fields inline (`{steps: [5,25,50,100], hold_s: 300, ...}`): each `name: value`
    with a numeric value is that field's default."""
    options = schema_options()
    wrong = []
    for row in readme_rows():
        option = option_of(row.keys[0], options)
        if option is None or option.model is None or row.keys[0] == "flow_control.classes.<name>":  # checked below
            continue
        fields = option.model.model_fields
        for name, value in re.findall(r"(\w+): (\[[\d, .]+\]|\d+(?:\.\d+)?)(?=[,}])", row.text):
            if name not in fields:
                wrong.append(f"line {row.line}: {row.keys[0]} has no field {name!r}")
                continue
            said = [float(v) for v in value.strip("[]").split(",")] if value.startswith("[") else float(value)
            actual = fields[name].get_default(call_default_factory=True)
            actual = [float(v) for v in actual] if isinstance(actual, tuple) else float(actual)
            if said != actual:
                wrong.append(f"line {row.line}: {row.keys[0]}.{name} documented {value}, the schema says {actual}")
    assert wrong == [], "\n".join(wrong)


def test_documented_priority_classes_are_the_defaults() -> None:
    [row] = [row for row in readme_rows() if row.keys[0] == "flow_control.classes.<name>"]
    documented_classes = {name: dict(re.findall(r"(\w+): ([\d.]+)", body))
                          for name, body in re.findall(r"`(\w+)` \{([^}]*)\}", row.defaults[0])}
    defaults = default_classes()
    assert documented_classes.keys() == defaults.keys()
    for name, fields in documented_classes.items():
        for field, value in fields.items():
            assert float(value) == float(getattr(defaults[name], field)), (name, field)
        unlisted = set(type(defaults[name]).model_fields) - set(fields)
        for field in unlisted:  # what a class does not list is the field's own default
            assert getattr(defaults[name], field) == type(defaults[name]).model_fields[field].default, (name, field)


def test_the_reader_catches_drift() -> None:
    """The checks above would fail on a missing row, an unknown key and a wrong default."""
    rows_by_key = {key: row for row in readme_rows() for key in row.keys}
    options = schema_options()
    assert not documented(Option("service.no_such_option", FieldInfo(), None), rows_by_key)
    assert documented(options["tiers.<name>.limits.burst"], rows_by_key)  # named in its section's row
    keys = set(rows_by_key)
    assert parse_default("4 MiB", keys) == 4 * 1024 * 1024 != schema_default(options["bounds.max_json_depth"].field)
    assert parse_default("- (none)", keys) is None and parse_default("`[]` (every tier)", keys) == ()
    assert parse_default("`flow_control.default_class`", keys) is WORDS

"""Load a policy file into an immutable `Policy`, with file:line-precise errors.

The policy's sections are defined by the packages that own them (`extproc.config.schema` mounts them); this
module sits above them all, so it also builds the scheduling plugins once to report a bad type or parameter.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from extproc.config.schema import Policy
from extproc.scheduling import PluginError, validate_scheduling

_MAX_POLICY_BYTES = 8 * 1024 * 1024

PathKey = tuple[str | int, ...]


@dataclass(frozen=True)
class ConfigProblem:
    file: str
    line: int
    location: str
    message: str

    def __str__(self) -> str:
        where = f" ({self.location})" if self.location else ""
        return f"{self.file}:{self.line}: {self.message}{where}"


class ConfigError(Exception):
    """A policy file was rejected; `problems` lists every error found, each with file:line."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def _walk(node: yaml.Node, path: PathKey, lines: dict[PathKey, int]) -> Any:
    """Turn a composed YAML node into plain Python while recording the line of every path."""
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise _BadNode("mapping keys must be plain scalars", line)
            key = _scalar(key_node)
            if key in result:
                raise _BadNode(f"duplicate key {key!r}", line)
            result[key] = _walk(value_node, (*path, key), lines)
            lines[(*path, key)] = line
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, (*path, index), lines) for index, item in enumerate(node.value)]
    return _scalar(node)


def _scalar(node: yaml.Node) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


class _BadNode(Exception):
    def __init__(self, message: str, line: int) -> None:
        self.message = message
        self.line = line


def _line_for(loc: PathKey, lines: dict[PathKey, int]) -> int:
    for end in range(len(loc), -1, -1):
        found = lines.get(loc[:end])
        if found is not None:
            return found
    return 1


def _format_loc(loc: PathKey) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _problems(error: ValidationError, file: str, lines: dict[PathKey, int]) -> Iterator[ConfigProblem]:
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        yield ConfigProblem(file, _line_for(loc, lines), _format_loc(loc), message)


M = TypeVar("M", bound=BaseModel)


def parse_yaml_model(model: type[M], text: str, file: str) -> M:
    """Validate YAML text against a pydantic model; raises ConfigError with file:line problems."""
    lines: dict[PathKey, int] = {}
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else 1
        raise ConfigError([ConfigProblem(file, line, "", f"YAML syntax: {exc.problem}")]) from None
    if node is None:
        raise ConfigError([ConfigProblem(file, 1, "", "the file is empty")])
    try:
        data = _walk(node, (), lines)
    except _BadNode as exc:
        raise ConfigError([ConfigProblem(file, exc.line, "", exc.message)]) from None
    if not isinstance(data, dict):
        raise ConfigError([ConfigProblem(file, 1, "", "the file must be a mapping at the top level")])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(list(_problems(exc, file, lines))) from None


def parse_policy(text: str, file: str = "<policy>") -> Policy:
    """Validate policy YAML text; raises ConfigError with file:line problems."""
    policy = parse_yaml_model(Policy, text, file)
    lines: dict[PathKey, int] = {}
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if node is not None:
        _walk(node, (), lines)
    # Plugins are built once here so a bad type or parameter is reported at load, with its line.
    try:
        validate_scheduling(policy.scheduling)
    except PluginError as exc:
        line = _line_for(("scheduling", "plugins"), lines)
        raise ConfigError([ConfigProblem(file, line, "scheduling", str(exc))]) from None
    return policy


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file (bounded size)."""
    file = Path(path)
    try:
        size = file.stat().st_size
        if size > _MAX_POLICY_BYTES:
            raise ConfigError([ConfigProblem(str(file), 1, "", f"file is {size} bytes, over 8 MiB")])
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([ConfigProblem(str(file), 1, "", f"cannot read: {exc.strerror}")]) from None
    except UnicodeDecodeError:
        raise ConfigError([ConfigProblem(str(file), 1, "", "file is not valid UTF-8")]) from None
    return parse_policy(text, str(file))

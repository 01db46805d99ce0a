"""Plugin registry: type name -> factory. Built-ins are registered explicitly, never on import."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from extproc.scheduling.framework import Filter, Picker, Scorer

Plugin = Filter | Scorer | Picker
Factory = Callable[[str, Mapping[str, Any]], Plugin]
P = TypeVar("P")


class PluginError(ValueError):
    """A plugin could not be built from its configuration."""


def build_params(cls: type[P], name: str, raw: Mapping[str, Any]) -> P:
    """Instantiate a frozen params dataclass from YAML values: unknown keys and wrong types are errors."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise PluginError(f"plugin {name!r}: unknown parameter(s) {unknown}; known: {sorted(fields)}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        expected = fields[key].type
        kind = {"float": float, "int": int, "bool": bool, "str": str}.get(str(expected))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            raise PluginError(f"plugin {name!r}: parameter {key!r} must be {kind.__name__}, got {value!r}")
        values[key] = value
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise PluginError(f"plugin {name!r}: {exc}") from None


class PluginRegistry:
    def __init__(self) -> None:
        self._factories: dict[str, Factory] = {}

    def register(self, type_name: str, factory: Factory) -> None:
        if type_name in self._factories:
            raise PluginError(f"plugin type {type_name!r} registered twice")
        self._factories[type_name] = factory

    def types(self) -> list[str]:
        return sorted(self._factories)

    def create(self, type_name: str, name: str, parameters: Mapping[str, Any]) -> Plugin:
        factory = self._factories.get(type_name)
        if factory is None:
            raise PluginError(f"plugin {name!r}: unknown type {type_name!r}; registered: {self.types()}")
        return factory(name, parameters)

"""The README's table of built-in scheduling plugins against the plugins themselves: every registered type has a
row, every row names a registered type, and its parameters (`name` default, ...) are exactly the plugin's
parameters with their defaults. A policy written from the README therefore loads."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from extproc.scheduling.plugins import MODULES
from extproc.scheduling.registry import PluginRegistry

README = Path(__file__).resolve().parents[3] / "README.md"


def plugin_parameters() -> dict[str, dict[str, Any]]:
    """Registered type -> {parameter: default}, from each plugin module's frozen `Params` dataclass."""
    found: dict[str, dict[str, Any]] = {}
    for module in MODULES:
        registry = PluginRegistry()
        module.register(registry)
        defaults = {field.name: field.default for field in dataclasses.fields(module.Params)}
        found.update({type_name: defaults for type_name in registry.types()})
    return found


def readme_plugins() -> dict[str, dict[str, str]]:
    """Type -> {parameter: documented default} from the `| type | what it does | parameters (defaults) |` rows."""
    lines = README.read_text().splitlines()
    start = lines.index("| type | what it does | parameters (defaults) |")
    found: dict[str, dict[str, str]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        types_cell, _, parameters = (cell.strip() for cell in line.strip("|").split(" | "))
        documented = dict(re.findall(r"`(\w+)` ([^,]+)", parameters))
        for type_name in re.findall(r"`([\w-]+)`", types_cell):
            found[type_name] = documented
    return found


def same(documented: str, actual: Any) -> bool:
    if isinstance(actual, bool):
        return documented == str(actual).lower()
    if isinstance(actual, int | float):
        return float(documented) == float(actual)
    return documented == str(actual)


def test_every_plugin_type_has_a_row_and_every_row_a_plugin() -> None:
    assert sorted(readme_plugins()) == sorted(plugin_parameters())


def test_documented_parameters_and_defaults_are_the_plugins() -> None:
    documented = readme_plugins()
    for type_name, parameters in plugin_parameters().items():
        said = documented.get(type_name, {})
        assert sorted(said) == sorted(parameters), f"{type_name}: README {sorted(said)}, plugin {sorted(parameters)}"
        wrong = {name: (said[name], default) for name, default in parameters.items() if not same(said[name], default)}
        assert wrong == {}, f"{type_name}: (documented, actual) defaults differ: {wrong}"

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import pytest

from extproc.bench import stack
from extproc.bench.stack import SimPool, held_ports, prepare


class FakePorts:
    """The kernel's ports, without sockets: `taken` ones are not free; blocks come from 20000 on, 100 apart."""

    def __init__(self) -> None:
        self.taken: set[int] = set()
        self._bases = itertools.count(20_000, 100)
        self._ephemeral = itertools.count(40_000)

    def all_free(self, ports: Sequence[int]) -> bool:
        return not self.taken & set(ports)

    def block(self, count: int) -> int:
        return next(self._bases)

    def free_ports(self, count: int) -> list[int]:
        return [next(self._ephemeral) for _ in range(count)]


@pytest.fixture
def ports(monkeypatch: pytest.MonkeyPatch) -> FakePorts:
    fake = FakePorts()
    monkeypatch.setattr(stack, "_all_free", fake.all_free)
    monkeypatch.setattr(stack, "free_port_block", fake.block)
    monkeypatch.setattr(stack, "free_ports", fake.free_ports)
    return fake


def test_held_ports_are_kept_while_free_and_replaced_once_one_is_taken(ports: FakePorts) -> None:
    first = held_ports(4)
    assert first == [20_000, 20_001, 20_002, 20_003]
    assert held_ports(4, first) == first
    ports.taken.add(20_002)
    assert held_ports(4, first) == [20_100, 20_101, 20_102, 20_103]
    assert held_ports(3, first) == [20_200, 20_201, 20_202]  # another count: new ports


def test_prepare_puts_the_given_engine_ports_in_the_policy(tmp_path: Path, ports: FakePorts) -> None:
    pools = [SimPool("chat", "m", 2), SimPool("other", "n", 1)]
    engines = held_ports(3)
    for name in ("a", "b"):
        prepared = prepare(tmp_path / name, pools, engine_ports=engines)
        assert prepared.sim_ports == {"chat": engines[:2], "other": engines[2:]}
        assert [p.endpoints for p in prepared.policy.pools] == [
            tuple(f"127.0.0.1:{p}" for p in engines[:2]), (f"127.0.0.1:{engines[2]}",)]
        assert not set(prepared.service_ports[0]) & set(engines)
    fresh = prepare(tmp_path / "c", pools)
    assert not {p for group in fresh.sim_ports.values() for p in group} & set(engines)
    with pytest.raises(ValueError, match="2 engine ports for 3 engines"):
        prepare(tmp_path / "d", pools, engine_ports=engines[:2])

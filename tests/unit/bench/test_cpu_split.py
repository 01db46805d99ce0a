from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from extproc.bench.cpu_split import CpuSplit, parse_split, pin_process


def test_auto_gives_the_system_under_test_the_first_half() -> None:
    assert parse_split("auto", [0, 1]) == CpuSplit(frozenset({0}), frozenset({1}))
    assert parse_split("auto", [4, 5, 6, 7, 8]) == CpuSplit(frozenset({4, 5}), frozenset({6, 7, 8}))
    assert parse_split("auto", [3]) is None  # one CPU: nothing to split
    assert parse_split("off", [0, 1]) is None


def test_a_cpu_list_takes_those_and_leaves_the_rest_to_the_harness() -> None:
    assert parse_split("0,2-3", range(6)) == CpuSplit(frozenset({0, 2, 3}), frozenset({1, 4, 5}))
    assert parse_split("1", [0, 1]) == CpuSplit(frozenset({1}), frozenset({0}))


@pytest.mark.parametrize(("text", "message"), [
    ("0-1", "leaves no CPU for the harness"),
    ("2", "CPUs 2 are not available"),
    ("1-0", "expected a CPU list"),
    ("x", "expected a CPU list"),
    ("", "expected a CPU list"),
])
def test_a_bad_list_is_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_split(text, [0, 1])


def _allowed(pid: int) -> dict[int, str]:
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                found[int(tid)] = line.split(":", 1)[1].strip()
    return found


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin onto one of them")
def test_pinning_moves_every_thread_of_a_running_process() -> None:
    # A child with threads already running before it is pinned (as Envoy's workers and a router's runtime are).
    code = ("import threading, sys\n"
            "stop = threading.Event()\n"
            "for _ in range(3): threading.Thread(target=stop.wait, daemon=True).start()\n"
            "print('ready', flush=True); sys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        target = min(os.sched_getaffinity(0))
        before = _allowed(child.pid)
        assert len(before) == 4 and all(cpus != str(target) for cpus in before.values())
        pin_process(child.pid, frozenset({target}))
        assert set(_allowed(child.pid).values()) == {str(target)}
    finally:
        child.kill()
        child.wait()

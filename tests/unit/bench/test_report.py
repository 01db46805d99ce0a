from __future__ import annotations

import io
import json
import math
from pathlib import Path

from extproc.bench.loadgen import Progress, Sample
from extproc.bench.report import (
    ProgressPrinter,
    format_markdown_table,
    format_table,
    plot_lines,
    write_json,
    write_markdown_table,
)

ROWS = [
    {"pool": "small", "rps": 12.5, "errors": {"http_5xx": 2}, "ttft_ms": {"p99": 101.234}},
    {"pool": "a-much-longer-pool", "rps": 1234.0, "errors": {}, "ttft_ms": {"p99": None}},
]


def test_format_table_aligns_columns() -> None:
    text = format_table(ROWS, ["pool", "rps", ("ttft_ms.p99", "ttft p99"), "errors", "missing"])
    lines = text.splitlines()
    assert lines[0].split() == ["pool", "rps", "ttft", "p99", "errors", "missing"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[2].startswith("small               ")  # text left-aligned to the widest cell
    assert "  12.50  " in lines[2] and "1234.00" in lines[3]
    assert lines[2].index("12.50") + len("12.50") == lines[3].index("1234.00") + len("1234.00")  # right
    assert "101.23" in lines[2] and "http_5xx=2" in lines[2]
    assert lines[3].split()[2:] == ["-", "-", "-"]
    assert len({len(line) for line in lines[:2]}) == 1


def test_format_table_without_rows_has_header() -> None:
    assert format_table([], ["a", "b"]).splitlines() == ["a  b", "-  -"]


def test_markdown_table(tmp_path: Path) -> None:
    text = format_markdown_table(ROWS, ["pool", "rps"])
    assert text.splitlines() == [
        "| pool | rps |", "|---|---:|", "| small | 12.50 |", "| a-much-longer-pool | 1234.00 |",
    ]
    path = write_markdown_table(tmp_path / "sub" / "t.md", ROWS, ["pool"], title="Pools")
    assert path.read_text().startswith("## Pools\n\n| pool |")


def test_write_json_handles_dataclasses_and_non_finite(tmp_path: Path) -> None:
    sample = Sample(0, {"model": "m"}, 0.0, 0.0, 200, None, 0.1, 0.2)
    path = write_json(tmp_path / "out" / "r.json", {"s": [sample], "bad": math.nan, "t": (1, 2)})
    data = json.loads(path.read_text())
    assert data["bad"] is None and data["t"] == [1, 2]
    assert data["s"][0]["labels"] == {"model": "m"} and data["s"][0]["e2e_s"] == 0.2
    assert list(tmp_path.joinpath("out").iterdir()) == [path]  # no temp file left behind


def test_plot_lines_writes_png(tmp_path: Path) -> None:
    path = plot_lines(
        tmp_path / "p.png", {"pool-a": [(2.0, 5.0), (1.0, 3.0)], "pool-b": [(1.0, 4.0)]}, "rps", "ms", "ttft"
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _progress(elapsed: float, done: int) -> Progress:
    return Progress(elapsed, done + 1, done, 0, 1, 10.0)


def test_progress_printer_plain_lines_are_rate_limited() -> None:
    now = [0.0]
    out = io.StringIO()
    printer = ProgressPrinter(out, tty=False, interval_s=5.0, clock=lambda: now[0])
    for t in range(0, 12):
        now[0] = float(t)
        printer(_progress(float(t), t))
    printer.close()
    lines = out.getvalue().splitlines()
    assert [line.split("]")[0].strip("[ ") for line in lines] == ["0.0s", "5.0s", "10.0s", "11.0s"]
    assert "done=11" in lines[-1] and "\r" not in out.getvalue()


def test_progress_printer_tty_rewrites_one_line() -> None:
    out = io.StringIO()
    printer = ProgressPrinter(out, tty=True)
    printer(Progress(1.0, 100, 90, 3, 10, 95.5, late=2, dropped=1))
    printer(_progress(2.0, 5))
    printer.close()
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1
    assert "errors=3" in text and "rps=95.5" in text and "dropped=1" in text

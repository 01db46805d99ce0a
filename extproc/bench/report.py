"""Terminal tables, JSON/Markdown/PNG report files and a one-line progress display for benchmarks."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from extproc.bench.loadgen import Progress

__all__ = [
    "Column",
    "ProgressPrinter",
    "command_line",
    "format_cell",
    "format_markdown_table",
    "format_progress",
    "format_table",
    "plot_lines",
    "to_jsonable",
    "write_json",
    "write_markdown_table",
]

# A column is a key into each row, or (key, title). Keys may be dotted paths into nested dicts,
# e.g. "ttft_ms.p99" for a stats.Summary row.
Column = str | tuple[str, str]


def _lookup(row: Mapping[str, object], key: str) -> object:
    if key in row:
        return row[key]
    value: object = row
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def format_cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.0f}" if abs(value) >= 1e5 else f"{value:.2f}"
    if isinstance(value, Mapping):
        return " ".join(f"{k}={format_cell(v)}" for k, v in value.items()) or "-"
    return str(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _grid(
    rows: Sequence[Mapping[str, object]], columns: Sequence[Column]
) -> tuple[list[str], list[list[str]], list[bool]]:
    """Titles, formatted cells and which columns are numeric."""
    keys = [c if isinstance(c, str) else c[0] for c in columns]
    titles = [c if isinstance(c, str) else c[1] for c in columns]
    values = [[_lookup(row, k) for k in keys] for row in rows]
    numeric = [
        bool(values) and all(v is None or _is_number(v) for v in col) for col in zip(*values, strict=False)
    ] or [False] * len(keys)
    return titles, [[format_cell(v) for v in row] for row in values], numeric


def format_table(rows: Sequence[Mapping[str, object]], columns: Sequence[Column]) -> str:
    """Aligned plain-text table; numeric columns are right-aligned."""
    titles, cells, numeric = _grid(rows, columns)
    widths = [max([len(t), *(len(r[i]) for r in cells)]) for i, t in enumerate(titles)]

    def line(parts: Sequence[str]) -> str:
        return "  ".join(
            p.rjust(w) if num else p.ljust(w) for p, w, num in zip(parts, widths, numeric, strict=True)
        ).rstrip()

    out = [line(titles), line(["-" * w for w in widths]), *(line(r) for r in cells)]
    return "\n".join(out) + "\n"


def format_markdown_table(rows: Sequence[Mapping[str, object]], columns: Sequence[Column]) -> str:
    titles, cells, numeric = _grid(rows, columns)

    def line(parts: Sequence[str]) -> str:
        return "| " + " | ".join(p.replace("|", "\\|") for p in parts) + " |"

    rule = "|" + "|".join("---:" if num else "---" for num in numeric) + "|"
    return "\n".join([line(titles), rule, *(line(r) for r in cells)]) + "\n"


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def to_jsonable(obj: object) -> object:
    """Dataclasses, mappings, sequences and paths as plain JSON values; NaN/inf become None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, str | int | bool):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):  # numpy scalars
        return to_jsonable(obj.item())
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that is running, as a shell would take it back (`extproc ...` for the installed entry point),
    so that a report says how to reproduce it."""
    args = list(sys.argv if argv is None else argv)
    if args and Path(args[0]).name in ("extproc", "__main__.py"):
        args[0] = "extproc"
    return " ".join(shlex.quote(a) for a in args)


def write_json(path: str | Path, obj: object) -> Path:
    path = Path(path)
    _atomic_write(path, json.dumps(to_jsonable(obj), indent=2, allow_nan=False) + "\n")
    return path


def write_markdown_table(
    path: str | Path, rows: Sequence[Mapping[str, object]], columns: Sequence[Column], *, title: str = ""
) -> Path:
    path = Path(path)
    heading = f"## {title}\n\n" if title else ""
    _atomic_write(path, heading + format_markdown_table(rows, columns))
    return path


def plot_lines(
    path: str | Path, series: Mapping[str, Sequence[tuple[float, float]]], xlabel: str, ylabel: str,
    title: str, *, logy: bool = False,
) -> Path:
    """One PNG line chart, one line per series. matplotlib is imported here so the service never loads it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, points in series.items():
        ordered = sorted(points)
        ax.plot([x for x, _ in ordered], [y for _, y in ordered], marker="o", markersize=3, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if logy:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    if series:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def format_progress(p: Progress) -> str:
    text = (
        f"[{p.elapsed_s:7.1f}s] sent={p.sent} done={p.done} in_flight={p.in_flight} "
        f"errors={p.errors} rps={p.rps:.1f}"
    )
    if p.late or p.dropped:
        text += f" late={p.late} dropped={p.dropped}"
    return text


class ProgressPrinter:
    """Renders Progress on one carriage-return-updated line on a TTY, else a plain line every interval_s."""

    def __init__(
        self, stream: TextIO | None = None, *, tty: bool | None = None, interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic, prefix: str = "",
    ) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty() if tty is None else tty
        self._interval_s = interval_s
        self._clock = clock
        self._prefix = prefix
        self._last_print: float | None = None
        self._suppressed: str | None = None
        self._width = 0

    def __call__(self, progress: Progress) -> None:
        text = self._prefix + format_progress(progress)
        if self._tty:
            self._stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            now = self._clock()
            if self._last_print is not None and now - self._last_print < self._interval_s:
                self._suppressed = text
                return
            self._last_print = now
            self._suppressed = None
            self._stream.write(text + "\n")
        self._stream.flush()

    def close(self) -> None:
        """Ends the TTY line, or prints the last line held back by the interval, so none is lost."""
        if self._tty and self._width:
            self._stream.write("\n")
            self._width = 0
        elif self._suppressed is not None:
            self._stream.write(self._suppressed + "\n")
            self._suppressed = None
        self._stream.flush()

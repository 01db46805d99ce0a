"""Benchmark tooling: a lean HTTP/1.1 load generator, statistics, reports and child-process control.

Nothing here is imported by the service; matplotlib is only imported inside `report.plot_lines`.
"""

__all__: list[str] = []

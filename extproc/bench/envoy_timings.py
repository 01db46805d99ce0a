"""`extproc bench routing --samples`: Envoy's own timing of every request, for the hop split of the inbound path.

With `--samples`, our stacks' Envoy also writes a file access log (`TIMINGS_LOG` in the point's work directory,
copied next to `requests.jsonl`) with Envoy's duration points of each request (`%COMMON_DURATION%`, microseconds
from the first downstream byte), the ext_proc filter's own round-trip latencies (its filter state) and the
connections used, keyed by the simulated engine's request id (`x-sim-request`, as in `sim-timings-*.json`).
`START_TIME` is the wall clock: `clock_offset_s` (wall - monotonic, taken by the bench) puts it on the monotonic
clock of the client's and the engines' stamps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import yaml

from extproc.bench.httpclient import HttpClient
from extproc.bench.procs import ProcessGroup, run_delay_seconds
from extproc.sim.timings import HEADER as SIM_HEADER
from extproc.xds.render import dump, write_atomic

__all__ = ["OFFSET_FILE", "RUN_DELAY_FILE", "TIMINGS_FILE", "TIMINGS_FORMAT", "TIMINGS_LOG", "add_timings_log",
           "clock_offset_s", "keep_timings", "machine_load", "read_timings", "stack_run_delays",
           "write_run_delays"]

TIMINGS_LOG = "envoy-timings.jsonl"  # in the point's work directory
TIMINGS_FILE = "envoy-timings.jsonl"  # in the point's samples directory
OFFSET_FILE = "clock-offset.json"
RUN_DELAY_FILE = "run-delay.json"  # in the point's samples directory
_EXT_PROC = "envoy.filters.http.ext_proc"
_FILE_LOG = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog"


def _since_start(point: str) -> str:
    return f"%COMMON_DURATION(DS_RX_BEG:{point}:us)%"


# Every duration in microseconds from the first byte of the downstream request (DS_RX_BEG).
TIMINGS_FORMAT: dict[str, str] = {
    "sim": f"%RESP({SIM_HEADER.upper()})%",
    "start": "%START_TIME(%s.%6f)%",
    "ds_rx_end": _since_start("DS_RX_END"),  # the whole request received (the buffer filter lets go here)
    "us_cx_beg": _since_start("US_CX_BEG"),  # a new upstream connection started (empty: a pooled one)
    "us_cx_end": _since_start("US_CX_END"),
    "us_tx_beg": _since_start("US_TX_BEG"),  # first byte to the engine
    "us_tx_end": _since_start("US_TX_END"),
    "us_rx_beg": _since_start("US_RX_BEG"),
    "ds_tx_beg": _since_start("DS_TX_BEG"),
    # ext_proc's send -> reply of the headers message and of the body message(s), as the filter measured them.
    "xp_headers_us": f"%FILTER_STATE({_EXT_PROC}:FIELD:request_header_latency_us)%",
    "xp_body_us": f"%FILTER_STATE({_EXT_PROC}:FIELD:request_body_total_latency_us)%",
    "xp_body_calls": f"%FILTER_STATE({_EXT_PROC}:FIELD:request_body_call_count)%",
    "cx": "%CONNECTION_ID%",
    "ucx": "%UPSTREAM_CONNECTION_ID%",
    "upstream": "%UPSTREAM_HOST%",
    "status": "%RESPONSE_CODE%",
}


def add_timings_log(envoy_dir: Path, path: Path) -> None:
    """Add the timing file log to the gateway listener's HTTP connection manager in the rendered file-xDS
    `lds.yaml` (before Envoy starts)."""
    lds = envoy_dir / "lds.yaml"
    document: dict[str, Any] = yaml.safe_load(lds.read_text())
    for resource in document["resources"]:
        for chain in resource["filter_chains"]:
            for network_filter in chain["filters"]:
                if network_filter["name"] != "envoy.filters.network.http_connection_manager":
                    continue
                network_filter["typed_config"].setdefault("access_log", []).append({
                    "name": "envoy.access_loggers.file",
                    "typed_config": {"@type": _FILE_LOG, "path": str(path),
                                     "log_format": {"json_format": TIMINGS_FORMAT}},
                })
    write_atomic(lds, dump(document))


def clock_offset_s() -> float:
    """Wall clock minus monotonic clock now (both read back to back: the error is well under a microsecond)."""
    return time.time() - time.monotonic()


def read_timings(path: Path) -> dict[str, dict[str, Any]]:
    """Envoy's timing lines by sim request id (lines of requests the engine never saw are left out)."""
    out: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if item.get("sim"):
            out[str(item["sim"])] = item
    return out


def _lines(log: Path) -> int:
    return log.read_bytes().count(b"\n") if log.exists() else 0


def _copy(log: Path, where: Path) -> None:
    if log.exists():
        (where / TIMINGS_FILE).write_bytes(log.read_bytes())
        (where / OFFSET_FILE).write_text(json.dumps({"wall_minus_monotonic_s": clock_offset_s()}))


async def keep_timings(client: HttpClient, admin_port: int, log: Path, where: Path, expected: int) -> None:
    """Copy the point's timing log and the clock offset into its samples directory. Envoy writes its log files
    in the background (every 10 s by default): `/reopen_logs` flushes them; wait (bounded) for `expected` lines."""
    await client.request("POST", "127.0.0.1", admin_port, "/reopen_logs", timeout_s=5.0)
    deadline = time.monotonic() + 5.0
    while _lines(log) < expected:
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.05)
    _copy(log, where)


def write_run_delays(where: Path, before: dict[str, float], after: dict[str, float], wall_s: float) -> None:
    """Per process of the stack: seconds per second of the measured run its threads waited for a CPU; and the
    machine's (`MACHINE` keys, from `machine_load`): CPU used by SCHED_IDLE processes (other users' background
    work) and the CPU pressure stall share (/proc/pressure/cpu "some")."""
    where.mkdir(parents=True, exist_ok=True)
    shares = {name: round((after[name] - before[name]) / wall_s, 4) for name in after
              if name in before and name not in MACHINE}
    machine = {name: round((after[name] - before[name]) / wall_s, 4) for name in MACHINE
               if name in after and name in before}
    (where / RUN_DELAY_FILE).write_text(json.dumps({"run_delay_s_per_s": shares, "machine_s_per_s": machine,
                                                    "wall_s": round(wall_s, 2)}))


MACHINE = ("idle_class_cpu", "cpu_pressure_some")
_SCHED_IDLE = 5


def machine_load() -> dict[str, float]:
    """Seconds so far: CPU of every SCHED_IDLE process on the machine, and the CPU pressure "some" stall total."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            raw = stat.read_text()
            fields = raw[raw.rindex(")") + 2:].split()
            if int(fields[38]) == _SCHED_IDLE:
                ticks += int(fields[11]) + int(fields[12])
    load = {"idle_class_cpu": ticks / os.sysconf("SC_CLK_TCK")}
    with contextlib.suppress(OSError, ValueError, IndexError):
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        load["cpu_pressure_some"] = int(some.rpartition("total=")[2]) / 1e6
    return load


def stack_run_delays(group: ProcessGroup) -> dict[str, float]:
    """Run delay so far of every child of the stack and of this process (the load generator, "client")."""
    return {**group.run_delays(), "client": run_delay_seconds(os.getpid()), **machine_load()}

"""Envoy's per-request timing log of `bench routing --samples`: added to the rendered listener, read back by the
engine's request id; and the run-delay snapshot of the stack's processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from extproc.bench.envoy_timings import (
    RUN_DELAY_FILE,
    TIMINGS_FORMAT,
    add_timings_log,
    machine_load,
    read_timings,
    write_run_delays,
)
from extproc.bench.procs import run_delay_seconds
from extproc.bench.stack import SimPool, build_policy
from extproc.config import parse_policy
from extproc.xds import write_config


def test_the_timing_log_joins_the_gateway_listener_after_its_own_logs(tmp_path: Path) -> None:
    document = build_policy([SimPool("chat", "m", 2)], {"chat": [9001, 9002]}, [9100, 9101, 9102, 9103])
    envoy_dir = tmp_path / "envoy"
    write_config(parse_policy(yaml.safe_dump(document), "policy.yaml"), envoy_dir)
    log = tmp_path / "timings.jsonl"
    add_timings_log(envoy_dir, log)
    listener = yaml.safe_load((envoy_dir / "lds.yaml").read_text())["resources"][0]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    names = [entry["name"] for entry in hcm["access_log"]]
    assert names[0] == "envoy.access_loggers.http_grpc" and names[-1] == "envoy.access_loggers.file"
    timing = hcm["access_log"][-1]["typed_config"]
    assert timing["path"] == str(log) and timing["log_format"]["json_format"] == TIMINGS_FORMAT
    assert TIMINGS_FORMAT["sim"] == "%RESP(X-SIM-REQUEST)%"
    assert TIMINGS_FORMAT["us_tx_end"] == "%COMMON_DURATION(DS_RX_BEG:US_TX_END:us)%"


def test_read_timings_keys_lines_by_sim_request_and_skips_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"sim": "9001-1", "us_tx_end": "120"}) + "\n" + json.dumps({"sim": None}) + "\n"
                    + "{torn line\n" + json.dumps({"sim": "9002-7", "us_tx_end": "80"}) + "\n")
    assert read_timings(path) == {"9001-1": {"sim": "9001-1", "us_tx_end": "120"},
                                  "9002-7": {"sim": "9002-7", "us_tx_end": "80"}}
    assert read_timings(tmp_path / "missing.jsonl") == {}


def test_run_delays_are_written_per_second_of_the_run(tmp_path: Path) -> None:
    assert run_delay_seconds(os.getpid()) >= 0.0
    write_run_delays(tmp_path, {"sim": 1.0, "envoy": 2.0, "gone": 0.5, "idle_class_cpu": 3.0},
                     {"sim": 1.5, "envoy": 2.25, "idle_class_cpu": 13.0}, 10.0)
    written = json.loads((tmp_path / RUN_DELAY_FILE).read_text())
    assert written == {"run_delay_s_per_s": {"sim": 0.05, "envoy": 0.025}, "machine_s_per_s": {"idle_class_cpu": 1.0},
                       "wall_s": 10.0}
    load = machine_load()
    assert load["idle_class_cpu"] >= 0.0 and set(load) <= {"idle_class_cpu", "cpu_pressure_some"}

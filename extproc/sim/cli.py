"""`extproc sim`: run a fleet of simulated vLLM replicas until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from extproc.sim.faults import FaultSettings
from extproc.sim.profile import BUILTIN_PROFILES, Profile, ProfileError, load_profile
from extproc.sim.server import Fleet
from extproc.sim.spec import ReplicaSpec

__all__ = ["build_specs", "configure", "parse_ports", "run"]


class UsageError(ValueError):
    """A command-line value that cannot be used."""


def configure(parser: argparse.ArgumentParser) -> None:
    profiles = ", ".join(sorted(BUILTIN_PROFILES))
    parser.add_argument("--pool", action="append", default=[], metavar="MODEL=PORTSPEC",
                        help="serve MODEL on each port of PORTSPEC ('8001-8004', '8001,8003' or a mix); "
                             "repeatable; MODEL may contain '/' and ':' (split on the last '=')")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address every replica binds (default %(default)s)")
    parser.add_argument("--profile", default="h100-8b", metavar="NAME_OR_FILE",
                        help=f"timing/capacity profile: a built-in name ({profiles}) or a YAML/JSON file "
                             "of Profile fields, optionally with 'base: NAME' (default %(default)s)")
    parser.add_argument("--lora", action="append", default=[], metavar="MODEL=ADAPTER[,ADAPTER...]",
                        help="LoRA adapters loaded on every replica of MODEL; repeatable")
    parser.add_argument("--stream-chunk-tokens", type=int, default=1, metavar="N",
                        help="tokens per SSE chunk; N>1 wakes a stream once per N engine steps and "
                             "saves CPU (default %(default)s)")
    parser.add_argument("--error-rate", type=float, default=0.0, metavar="FRACTION",
                        help="initial fraction of inference requests answered 500 (default %(default)s)")
    parser.add_argument("--slow-factor", type=float, default=1.0, metavar="X",
                        help="initial multiplier of every engine step's duration (default %(default)s)")
    parser.add_argument("--ready-file", type=Path, default=None, metavar="PATH",
                        help="once every replica listens, write a JSON list of {model, url} here")
    parser.add_argument("--park-file", type=Path, default=None, metavar="PATH",
                        help="start parked: write PATH once ready to go, and bind the ports only on SIGUSR1 "
                             "(a replica pre-started idle, so that a benchmark's cold start is the only delay)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed for output lengths/text and fault draws (default %(default)s)")


def parse_ports(spec: str) -> list[int]:
    ports: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        low, sep, high = part.partition("-")
        try:
            first = int(low)
            last = int(high) if sep else first
        except ValueError as exc:
            raise UsageError(f"bad port spec {spec!r}") from exc
        if not (1 <= first <= last <= 65535):
            raise UsageError(f"bad port range {part!r} in {spec!r}")
        ports.extend(range(first, last + 1))
    return ports


def _split_pair(value: str, option: str) -> tuple[str, str]:
    model, sep, rest = value.rpartition("=")
    if not sep or not model or not rest:
        raise UsageError(f"{option} expects MODEL=VALUE, got {value!r}")
    return model, rest


def build_specs(args: argparse.Namespace, profile: Profile) -> list[ReplicaSpec]:
    if not args.pool:
        raise UsageError("at least one --pool MODEL=PORTSPEC is required")
    loras: dict[str, tuple[str, ...]] = {}
    for value in args.lora:
        model, names = _split_pair(value, "--lora")
        loras[model] = loras.get(model, ()) + tuple(n.strip() for n in names.split(",") if n.strip())
    pools = [_split_pair(value, "--pool") for value in args.pool]
    unknown = sorted(set(loras) - {model for model, _ in pools})
    if unknown:
        raise UsageError(f"--lora names models without a --pool: {unknown}")
    try:
        faults = FaultSettings(error_rate=args.error_rate, slow_factor=args.slow_factor)
        if not 0.0 <= args.error_rate <= 1.0 or args.slow_factor < 0.01:
            raise UsageError("--error-rate must be in [0, 1] and --slow-factor >= 0.01")
        return [
            ReplicaSpec(model=model, host=args.host, port=port, profile=profile,
                        lora_adapters=loras.get(model, ()), stream_chunk_tokens=args.stream_chunk_tokens,
                        seed=args.seed, faults=faults)
            for model, ports in pools for port in parse_ports(ports)
        ]
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _write_ready_file(path: Path, content: list[dict[str, str]] | int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


async def _unpark(park_file: Path, stop: asyncio.Event) -> bool:
    """Wait for SIGUSR1 (True) or a stop (False), once `park_file` says the process is ready for it."""
    loop = asyncio.get_running_loop()
    go = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, go.set)
    try:
        _write_ready_file(park_file, os.getpid())
        waits = [asyncio.ensure_future(go.wait()), asyncio.ensure_future(stop.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        return go.is_set() and not stop.is_set()
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)


async def serve(fleet: Fleet, ready_file: Path | None, profile: Profile, park_file: Path | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        if park_file is not None and not await _unpark(park_file, stop):
            return
        async with fleet:
            for replica in fleet.replicas:
                lora = ",".join(replica.spec.lora_adapters) or "-"
                print(f"sim replica model={replica.spec.model} url={replica.url} profile={profile.name} "
                      f"lora={lora} chunk={replica.spec.stream_chunk_tokens}", flush=True)
            # What startup built lives as long as the process: out of the collector's sight, so that a full
            # collection walks only what requests allocate (~85,000 objects made each one a ~55-ms stop of
            # every simulated engine, a tail no real engine has).
            gc.freeze()
            if ready_file is not None:
                _write_ready_file(ready_file, fleet.endpoints)
            await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def _runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run

    def run_uvloop(main: Coroutine[Any, Any, None]) -> None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main)

    return run_uvloop


def run(args: argparse.Namespace) -> int:
    try:
        profile = load_profile(args.profile)
        specs = build_specs(args, profile)
        fleet = Fleet(specs)
    except (UsageError, ProfileError, ValueError) as exc:
        print(f"extproc sim: error: {exc}", file=sys.stderr)
        return 2
    try:
        _runner()(serve(fleet, args.ready_file, profile, args.park_file))
    except OSError as exc:
        print(f"extproc sim: cannot listen: {exc}", file=sys.stderr)
        return 1
    finally:
        for path in (args.ready_file, args.park_file):
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="extproc sim", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))

"""Options of `extproc bench routing` that shape a run: the shared-prefix (and drift) workload and flow control
per strategy."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from extproc.bench.routing_workloads import popularity_weights

__all__ = [
    "BUFFERED", "ENVOY2", "GRPCIO", "LEAN", "NOFLOW", "NOPUSH", "NOSHARE", "SHARE", "STAGGER", "STREAMED",
    "PrefixShape",
    "add_shape_options", "body_mode", "envoy_workers", "exchange_every", "front_end", "parse_range",
    "service_replicas", "shares_scrapes", "split_strategy", "staggers_scrapes", "strategy_flags",
]

# A strategy with this suffix runs our service with flow control off (`flow_control.enabled: false`); without
# it, flow control is as a new user gets it: on.
NOFLOW = "+noflow"
# With these suffixes our service runs on that front end (`service.front_end`): lean (HTTP/2 on the event loop) or
# grpcio; without either, on the policy's default (lean), as a new user gets it. Suffixes combine in any order
# before @N, e.g. default+noflow+grpcio@3.
LEAN = "+lean"
GRPCIO = "+grpcio"
# With these suffixes Envoy's ext_proc filter sends the request body as `envoy.request_body_mode` says (streamed:
# right behind the headers, one round trip to the service less; buffered: after the headers' reply), whatever the
# policy's default, so that both body modes compare in one run.
STREAMED = "+streamed"
BUFFERED = "+buffered"
PREBUFFERED = "+prebuffered"
# With these suffixes our service replicas share their scrapes (`scheduling.scrape.share: true`: each endpoint scraped
# by one replica for all, through the fleet exchange; it needs 2 or more replicas to matter) or each scrape every
# endpoint themselves (false); without either, as the policy's default says (shared), so both compare in one run.
SHARE = "+share"
NOSHARE = "+noshare"
# A strategy with this suffix runs our replicas with the requests they route sent with the placement exchange
# (`scheduling.push_requests: false`) instead of pushed as they are routed (the default).
NOPUSH = "+nopush"
# A strategy with this suffix staggers its scrapes over the interval (`scheduling.scrape.stagger: true`); without it,
# every engine is scraped at once each round (the policy's default).
STAGGER = "+stagger"
# A strategy with this suffix runs our Envoy with 2 worker threads (`--concurrency 2`, Envoy's own default on this
# 2-core machine, as many threads as the peer routers' runtimes use) instead of 1.
ENVOY2 = "+envoy2"
SUFFIXES = frozenset({NOFLOW, LEAN, GRPCIO, SHARE, NOSHARE, NOPUSH, STREAMED, BUFFERED, PREBUFFERED, STAGGER, ENVOY2})


# A profile strategy may end with @N: N service replicas sharing a redis-server (instead of --replicas), so that one
# run can compare replica counts side by side, e.g. default,default@3.
REPLICAS = "@"


def service_replicas(strategy: str, default: int) -> int:
    """The service replicas a strategy runs with: its @N suffix, else `default`. Raises ValueError."""
    _, sep, count = strategy.rpartition(REPLICAS)
    if not sep:
        return default
    if not count.isdigit() or not 1 <= int(count) <= 16:
        raise ValueError(f"strategy {strategy!r}: @N needs 1 <= N <= 16 service replicas")
    return int(count)


def strategy_flags(strategy: str) -> tuple[str, frozenset[str]]:
    """(scheduling profile or baseline name, its suffixes such as NOFLOW), whatever the replica count."""
    base = strategy.rpartition(REPLICAS)[0] or strategy
    name, *flags = base.split("+")
    return name, frozenset("+" + flag for flag in flags)


def split_strategy(strategy: str) -> tuple[str, bool]:
    """(scheduling profile or baseline name, flow control on), whatever the replica count."""
    name, flags = strategy_flags(strategy)
    return name, NOFLOW not in flags


def front_end(strategy: str) -> str | None:
    """The `service.front_end` a strategy's suffix asks for, or None for the policy's default. Raises ValueError
    when it asks for both."""
    flags = strategy_flags(strategy)[1]
    if LEAN in flags and GRPCIO in flags:
        raise ValueError(f"strategy {strategy!r}: {LEAN} and {GRPCIO} exclude each other")
    return "lean" if LEAN in flags else "grpcio" if GRPCIO in flags else None


def body_mode(strategy: str) -> str | None:
    """The `envoy.request_body_mode` a strategy's suffix asks for, or None for the policy's default.
    Raises ValueError when it asks for both."""
    modes = strategy_flags(strategy)[1] & {STREAMED, BUFFERED, PREBUFFERED}
    if len(modes) > 1:
        raise ValueError(f"strategy {strategy!r}: {', '.join(sorted(modes))} exclude each other")
    return next(iter(modes))[1:] if modes else None


def envoy_workers(strategy: str) -> int:
    return 2 if ENVOY2 in strategy_flags(strategy)[1] else 1


def staggers_scrapes(strategy: str) -> bool:
    return STAGGER in strategy_flags(strategy)[1]


def shares_scrapes(strategy: str) -> bool | None:
    """The service's `scheduling.scrape.share` a strategy's suffix asks for, or None for the policy's default.
    Raises ValueError when it asks for both."""
    flags = strategy_flags(strategy)[1]
    if SHARE in flags and NOSHARE in flags:
        raise ValueError(f"strategy {strategy!r}: {SHARE} and {NOSHARE} exclude each other")
    return True if SHARE in flags else False if NOSHARE in flags else None


def exchange_every(policy: dict[str, Any], ms: int) -> None:
    """Set `--fleet-sync-ms` in a policy document: the replicas' in-flight and placement exchanges both every `ms`
    (at equal intervals the placement exchange rides the in-flight exchange's timer; setting one alone would
    measure two timers, not a slower exchange)."""
    policy.setdefault("flow_control", {})["fleet_sync_ms"] = ms
    policy.setdefault("scheduling", {})["placement_sync_ms"] = ms


def parse_range(text: str) -> tuple[int, int]:
    """`N` or `LOW-HIGH` (inclusive, positive)."""
    low, sep, high = text.partition("-")
    try:
        bounds = (int(low), int(high) if sep else int(low))
    except ValueError:
        raise ValueError(f"expected N or LOW-HIGH, got {text!r}") from None
    if bounds[0] < 1 or bounds[1] < bounds[0]:
        raise ValueError(f"expected 1 <= LOW <= HIGH, got {text!r}")
    return bounds


@dataclass(frozen=True)
class PrefixShape:
    """The shared-prefix and drift workloads: `groups` system prompts, questions, outputs, how popular each group
    is (drift: before its hot set moves)."""

    groups: int = 48
    prefix_tokens: tuple[int, int] = (3000, 3000)
    question_tokens: tuple[int, int] = (300, 300)
    output_tokens: tuple[int, int] = (100, 100)
    popularity: str = "uniform"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PrefixShape:
        popularity = args.popularity or ("zipf:1.1" if getattr(args, "workload", None) == "drift" else "uniform")
        shape = cls(args.groups, parse_range(args.prefix_tokens), parse_range(args.question_tokens),
                    parse_range(args.output_tokens), popularity)
        if shape.groups < 1:
            raise ValueError("--groups must be >= 1")
        popularity_weights(shape.popularity, shape.groups)  # raises ValueError on a bad spec
        if getattr(args, "workload", None) == "drift" and shape.popularity == "uniform":
            raise ValueError("the drift workload needs --popularity zipf:S (a uniform popularity has no hot set)")
        return shape


def add_shape_options(parser: argparse.ArgumentParser) -> None:
    shape = PrefixShape()
    parser.add_argument("--groups", type=int, default=shape.groups,
                        help="shared-prefix, drift: system prompts (default %(default)s)")
    parser.add_argument("--prefix-tokens", default="3000",
                        help="shared-prefix, drift: tokens per system prompt, N or LOW-HIGH (default %(default)s)")
    parser.add_argument("--question-tokens", default="300",
                        help="shared-prefix, drift: tokens per question, N or LOW-HIGH (default %(default)s)")
    parser.add_argument("--output-tokens", default="100",
                        help="shared-prefix, drift: max_tokens per request, N or LOW-HIGH; one value is generated "
                             "exactly (ignore_eos) (default %(default)s)")
    parser.add_argument("--popularity", default=None,
                        help="shared-prefix, drift: 'uniform' or 'zipf:S' over the system prompts (default: uniform; "
                             "drift: zipf:1.1, a hot set that moves halfway through the measured run)")

"""Options of `extproc bench routing` that shape a run: the shared-prefix workload, flow control per strategy,
and offered load as a share of the fleet's capacity."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from extproc.bench.workloads import popularity_weights
from extproc.sim.profile import Profile

__all__ = ["CAPACITY_HIT_RATE", "NOFLOW", "PrefixShape", "add_shape_options", "fleet_capacity_rps", "parse_range",
           "split_strategy"]

# A strategy with this suffix runs our service with flow control off (`flow_control.enabled: false`); without
# it, flow control is as a new user gets it: on.
NOFLOW = "+noflow"
_TEMPLATE_TOKENS = 8  # chat template tokens around the system prompt and the question


def split_strategy(strategy: str) -> tuple[str, bool]:
    """(scheduling profile or baseline name, flow control on)."""
    if strategy.endswith(NOFLOW):
        return strategy.removesuffix(NOFLOW), False
    return strategy, True


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
    """The shared-prefix workload: `groups` system prompts, questions, outputs, how popular each group is."""

    groups: int = 32
    prefix_tokens: tuple[int, int] = (1500, 3000)
    question_tokens: tuple[int, int] = (8, 48)
    output_tokens: tuple[int, int] = (32, 128)
    popularity: str = "uniform"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PrefixShape:
        shape = cls(args.groups, parse_range(args.prefix_tokens), parse_range(args.question_tokens),
                    parse_range(args.output_tokens), args.popularity)
        if shape.groups < 1:
            raise ValueError("--groups must be >= 1")
        popularity_weights(shape.popularity, shape.groups)  # raises ValueError on a bad spec
        return shape

    def mean(self, bounds: tuple[int, int]) -> float:
        return (bounds[0] + bounds[1]) / 2

    def mean_output(self, profile: Profile) -> float:
        """Outputs are exact when the range is one value; else the simulator stops within [fraction, 1] of it."""
        low, high = self.output_tokens
        if low == high:
            return float(low)
        return self.mean(self.output_tokens) * (1 + profile.min_output_fraction) / 2


def add_shape_options(parser: argparse.ArgumentParser) -> None:
    shape = PrefixShape()
    parser.add_argument("--groups", type=int, default=shape.groups,
                        help="shared-prefix: system prompts (default %(default)s)")
    parser.add_argument("--prefix-tokens", default="1500-3000",
                        help="shared-prefix: tokens per system prompt, N or LOW-HIGH (default %(default)s)")
    parser.add_argument("--question-tokens", default="8-48",
                        help="shared-prefix: tokens per question, N or LOW-HIGH (default %(default)s)")
    parser.add_argument("--output-tokens", default="32-128",
                        help="shared-prefix: max_tokens per request, N or LOW-HIGH; one value is generated "
                             "exactly (ignore_eos) (default %(default)s)")
    parser.add_argument("--popularity", default="uniform",
                        help="shared-prefix: 'uniform' or 'zipf:S' over the system prompts (default %(default)s)")


# The prefix-cache hit rate at which --loads are counted: what a cache-aware router holds on the shared-prefix
# workload at moderate load (0.84-0.88 measured with 48 x 3,000-token prefixes); at higher load the hit rate
# falls as running requests crowd cached prefixes out, so the capacity counted at a perfect 1.0 is never reached.
CAPACITY_HIT_RATE = 0.8


def fleet_capacity_rps(profile: Profile, replicas: int, shape: PrefixShape,
                       hit_rate: float = CAPACITY_HIT_RATE) -> float:
    """Requests/s the fleet completes when `hit_rate` of every system prompt is cached (the question always
    needs prefill)."""
    prefix = shape.mean(shape.prefix_tokens)
    prompt = round(prefix + shape.mean(shape.question_tokens)) + _TEMPLATE_TOKENS
    uncached = round(shape.mean(shape.question_tokens) + (1.0 - hit_rate) * prefix) + _TEMPLATE_TOKENS
    return replicas * profile.capacity_rps(prompt, shape.mean_output(profile), uncached)

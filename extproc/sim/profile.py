"""Performance profiles of a simulated vLLM replica: plain data, loaded by name or from a file."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

__all__ = ["BUILTIN_PROFILES", "Profile", "ProfileError", "load_profile", "profile_from_mapping"]


class ProfileError(ValueError):
    """A profile name or file that cannot be turned into a valid `Profile`."""


@dataclass(frozen=True, slots=True)
class Profile:
    """How fast and how big one simulated replica is.

    The engine runs discrete steps like vLLM v1's scheduler (see README "Scheduling model"). One step
    computes the tokens the scheduler gave it and takes (times the replica's slow-factor fault)
      step_base_s + step_per_seq_s x sequences in the step + prefill_per_token_s x prefill tokens in the step
    A step holds at most `max_num_seqs` sequences and `max_num_batched_tokens` tokens (decode tokens first,
    then chunked prefill).
    """

    name: str = "h100-8b"
    # Llama-3.1-8B in bf16 on one H100 SXM: ~6.5 ms per step to stream the weights, ~0.12 ms more per
    # sequence in the batch, ~64 us per prefill token (~15.6k prefill tokens/s, about half of peak FLOPs).
    step_base_s: float = 0.0065
    step_per_seq_s: float = 0.00012
    prefill_per_token_s: float = 0.000064
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int = 0  # 0: a prefill chunk is bounded by the step budget only
    block_size: int = 16
    # 80 GB H100 at 0.9 utilisation leaves ~58 GB after the weights, 128 KiB/token of KV.
    num_gpu_blocks: int = 28_000
    max_model_len: int = 8192
    default_max_tokens: int = 128
    max_tokens_cap: int = 4096
    # Without ignore_eos a request stops after a prompt-seeded fraction in [min_output_fraction, 1]
    # of its token limit, so lengths vary but repeat exactly for the same prompt.
    min_output_fraction: float = 0.5
    embedding_dim: int = 1024
    max_loras: int = 4
    vocab_size: int = 128_256
    vllm_version: str = "0.11.0"
    # Sleep mode and runtime LoRA (extproc/sim/lifecycle.py). Level 1 offloads the weights to CPU memory
    # (16 GB of bf16 for an 8B model) and drops the KV cache; waking copies them back and re-creates the
    # cache (a few seconds on PCIe); level 2 discards the weights, so waking reloads them from disk (about
    # twice as long). Loading an adapter reads and moves its weights (~1.5 s for a rank-16 adapter).
    sleep_s: float = 0.5
    wake_up_s: float = 4.0
    wake_up_level2_s: float = 8.0
    lora_load_s: float = 1.5

    def __post_init__(self) -> None:
        positive = ("step_base_s", "max_num_seqs", "max_num_batched_tokens", "block_size", "num_gpu_blocks",
                    "max_model_len", "default_max_tokens", "max_tokens_cap", "embedding_dim", "vocab_size")
        for field in positive:
            if getattr(self, field) <= 0:
                raise ProfileError(f"profile {self.name!r}: {field} must be > 0")
        non_negative = ("step_per_seq_s", "prefill_per_token_s", "max_loras", "long_prefill_token_threshold",
                        "sleep_s", "wake_up_s", "wake_up_level2_s", "lora_load_s")
        for field in non_negative:
            if getattr(self, field) < 0:
                raise ProfileError(f"profile {self.name!r}: {field} must be >= 0")
        if not 0.0 <= self.min_output_fraction <= 1.0:
            raise ProfileError(f"profile {self.name!r}: min_output_fraction must be in [0, 1]")
        if self.num_gpu_blocks * self.block_size < self.max_model_len:
            raise ProfileError(
                f"profile {self.name!r}: num_gpu_blocks * block_size must hold one max_model_len sequence"
            )
        if self.vocab_size <= 1024:
            raise ProfileError(f"profile {self.name!r}: vocab_size must be > 1024")

    def step_s(self, sequences: int, prefill_tokens: int) -> float:
        """Duration of one step carrying `sequences` sequences, `prefill_tokens` of them prompt tokens."""
        return self.step_base_s + self.step_per_seq_s * sequences + self.prefill_per_token_s * prefill_tokens

    def chunk_limit(self) -> int:
        """Most prompt tokens one request may compute in one step."""
        threshold = self.long_prefill_token_threshold
        return min(threshold, self.max_num_batched_tokens) if threshold > 0 else self.max_num_batched_tokens

    def ttft_alone_s(self, uncached_tokens: int) -> float:
        """Time to the first token of a request alone on an idle engine: its prefill chunks, one step each."""
        chunk = self.chunk_limit()
        steps = max(1, math.ceil(uncached_tokens / chunk))
        return steps * self.step_s(1, 0) + self.prefill_per_token_s * uncached_tokens

    def decode_tokens_per_s(self, batch: int) -> float:
        """Output tokens per second of `batch` sequences decoding together (no prefill in the steps)."""
        return batch / self.step_s(batch, 0)

    def capacity_rps(self, prompt_tokens: int, output_tokens: float, uncached_tokens: int | None = None) -> float:
        """Requests/s one engine completes when saturated by requests of this shape (`uncached_tokens` of
        the prompt need prefill: all of it by default).

        Seat-bound: every seat is busy, a request holds one for its prefill chunks plus its decode steps,
        and each step also carries the prefill of the requests admitted meanwhile. Budget-bound: every step
        is full of tokens. KV-bound: fewer seats when the cache cannot hold `max_num_seqs` sequences.
        The least of the three.
        """
        uncached = prompt_tokens if uncached_tokens is None else uncached_tokens
        footprint = prompt_tokens + output_tokens / 2  # a sequence's average KV while it runs
        seats = min(float(self.max_num_seqs), self.num_gpu_blocks * self.block_size / max(footprint, 1.0))
        steps = max(1.0, output_tokens) + max(0, math.ceil(uncached / self.chunk_limit()) - 1)
        admitted_per_step = seats / steps
        step = self.step_s(0, 0) + self.step_per_seq_s * seats + self.prefill_per_token_s * uncached * admitted_per_step
        seat_bound = admitted_per_step / step
        budget = self.max_num_batched_tokens
        full_step = self.step_s(0, 0) + self.step_per_seq_s * seats + self.prefill_per_token_s * budget
        budget_bound = budget / max(1.0, uncached + output_tokens - 1) / full_step
        return min(seat_bound, budget_bound)


def _builtin() -> Mapping[str, Profile]:
    profiles = [
        Profile(),
        # Llama-3.1-70B on 4 x H100 (tensor parallel): vLLM's H100 default budget of 8,192 tokens per step.
        Profile(name="h100-70b-tp4", step_base_s=0.018, step_per_seq_s=0.00025, prefill_per_token_s=0.00008,
                max_num_seqs=64, max_num_batched_tokens=8192, num_gpu_blocks=40_000, max_model_len=16384),
        # An 8B model on one A10G (24 GB): ~600 GB/s streams the weights in ~27 ms; a small KV cache.
        Profile(name="a10g-8b", step_base_s=0.028, step_per_seq_s=0.0008, prefill_per_token_s=0.00028,
                max_num_seqs=8, num_gpu_blocks=1_200, max_model_len=8192),
        # For tests and demos: small cache so eviction is reachable, fast enough for sub-second runs.
        Profile(name="fast", step_base_s=0.002, step_per_seq_s=0.0, prefill_per_token_s=0.000010,
                max_num_seqs=8, num_gpu_blocks=1_024, max_model_len=4096, default_max_tokens=16,
                max_tokens_cap=1024, embedding_dim=64),
    ]
    return MappingProxyType({p.name: p for p in profiles})


BUILTIN_PROFILES: Mapping[str, Profile] = _builtin()


def profile_from_mapping(raw: Mapping[str, Any], *, source: str = "<mapping>") -> Profile:
    """Build a profile from plain data; `base` names a built-in profile whose values are the defaults."""
    known = {f.name for f in dataclasses.fields(Profile)}
    data = dict(raw)
    base_name = data.pop("base", "h100-8b")
    if base_name not in BUILTIN_PROFILES:
        raise ProfileError(f"{source}: unknown base profile {base_name!r}")
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProfileError(f"{source}: unknown profile fields {unknown} (known: {sorted(known)})")
    base = BUILTIN_PROFILES[base_name]
    try:
        return dataclasses.replace(base, **data)
    except TypeError as exc:
        raise ProfileError(f"{source}: {exc}") from exc


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, else a YAML or JSON file holding one profile mapping."""
    if name_or_path in BUILTIN_PROFILES:
        return BUILTIN_PROFILES[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        names = ", ".join(sorted(BUILTIN_PROFILES))
        raise ProfileError(f"{name_or_path!r} is neither a built-in profile ({names}) nor a file")
    text = path.read_text(encoding="utf-8")
    try:
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ProfileError(f"{path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: expected a mapping of profile fields")
    raw.setdefault("name", path.stem)
    return profile_from_mapping(raw, source=str(path))

"""Performance profiles of a simulated vLLM replica: plain data, loaded by name or from a file."""

from __future__ import annotations

import dataclasses
import json
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

    Timing model (all times in seconds, multiplied by the replica's slow-factor fault):
      TTFT = queue wait + prefill_overhead_s + uncached_prompt_tokens * prefill_per_token_s
      ITL  = itl_s * (1 + load_factor * (running - 1) / max_num_seqs)
    where `running` counts the sequences admitted to the batch when the token is produced.
    """

    name: str = "h100-8b"
    itl_s: float = 0.012
    prefill_overhead_s: float = 0.030
    prefill_per_token_s: float = 0.000250
    max_num_seqs: int = 16
    load_factor: float = 2.0
    block_size: int = 16
    # Llama-3-8B in bf16 on an 80 GB H100 at 0.9 utilisation leaves ~58 GB, 128 KiB/token of KV.
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

    def __post_init__(self) -> None:
        positive = ("itl_s", "max_num_seqs", "block_size", "num_gpu_blocks", "max_model_len",
                    "default_max_tokens", "max_tokens_cap", "embedding_dim", "vocab_size")
        for field in positive:
            if getattr(self, field) <= 0:
                raise ProfileError(f"profile {self.name!r}: {field} must be > 0")
        non_negative = ("prefill_overhead_s", "prefill_per_token_s", "load_factor", "max_loras")
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

    def itl_for(self, running: int) -> float:
        """Inter-token latency with `running` sequences in the batch (before any slow-down fault)."""
        extra = self.load_factor * max(running - 1, 0) / self.max_num_seqs
        return self.itl_s * (1.0 + extra)

    def prefill_s(self, uncached_tokens: int) -> float:
        return self.prefill_overhead_s + uncached_tokens * self.prefill_per_token_s


def _builtin() -> Mapping[str, Profile]:
    profiles = [
        Profile(),
        Profile(name="h100-70b-tp4", itl_s=0.030, prefill_overhead_s=0.050, prefill_per_token_s=0.000600,
                max_num_seqs=32, load_factor=1.5, num_gpu_blocks=40_000, max_model_len=16384),
        Profile(name="a10g-8b", itl_s=0.035, prefill_overhead_s=0.060, prefill_per_token_s=0.001200,
                max_num_seqs=8, load_factor=2.5, num_gpu_blocks=1_200, max_model_len=8192),
        # For tests and demos: small cache so eviction is reachable, fast enough for sub-second runs.
        Profile(name="fast", itl_s=0.002, prefill_overhead_s=0.005, prefill_per_token_s=0.000010,
                max_num_seqs=8, load_factor=1.0, num_gpu_blocks=1_024, max_model_len=4096,
                default_max_tokens=16, max_tokens_cap=1024, embedding_dim=64),
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
        raise ProfileError(f"{source}: unknown profile fields {unknown}")
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

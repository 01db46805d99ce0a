"""How often a new prompt falsely matches a full prefix directory (CRC-32 block hashes): fill a PrefixDirectory to
~199,000 hashes with prompts of 2,400 random words (~200 blocks of 64 characters) at 8 endpoints, then look up
5,000 new prompts of the same kind; any match is false. `.venv/bin/python reports/routing-s8/collisions.py`"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from extproc.scheduling.prefix import prefix_blocks
from extproc.scheduling.prefix_directory import PrefixDirectory

rng = random.Random(1)
words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
endpoints = [f"10.0.0.{i}:8000" for i in range(8)]


def text(count: int) -> str:
    return " ".join(rng.choice(words) for _ in range(count))


directory = PrefixDirectory(200_000, 8)
while len(directory) < 199_000:
    directory.record(prefix_blocks(text(2400)), rng.choice(endpoints))
false = [found for found in (directory.match(prefix_blocks(text(2400)), endpoints) for _ in range(5000)) if found]
print(f"directory of {len(directory)} hashes: {len(false)} of 5000 new prompts matched somewhere "
      f"({len(false) / 5000:.2%}); depths {sorted(d for found in false for d in found.values())}")

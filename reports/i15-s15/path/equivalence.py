"""Randomized check: PrefixDirectory of this tree against the one of 63bb0fb (saved as /tmp/old_pd.py by
`git show 63bb0fb:extproc/scheduling/prefix_directory.py > /tmp/old_pd.py`): the same answers from match/record/
holders/depths and the same index (order included) over random chains sharing prefixes, spills, learns and
trimming. Usage: python equivalence.py [rounds]"""
from __future__ import annotations

import importlib.util
import random
import sys

from extproc.scheduling.prefix_directory import PrefixDirectory as New

spec = importlib.util.spec_from_file_location("old_pd", "/tmp/old_pd.py")
assert spec is not None and spec.loader is not None
old_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old_module)
Old = old_module.PrefixDirectory

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
rng = random.Random(15)
endpoints = [f"10.0.0.{i}:8000" for i in range(1, 9)]
for trial in range(20):
    capacity = rng.choice([50, 400, 100_000])
    old, new = Old(capacity, 2 + trial % 3, share_every=rng.choice([1, 4])), None
    new = New(old.capacity, old.homes, share_every=old.share_every)
    prefixes = [tuple(rng.randrange(1 << 32) for _ in range(rng.randrange(1, 40))) for _ in range(12)]
    for _ in range(rounds // 20):
        base = rng.choice(prefixes)
        cut = rng.randrange(0, len(base) + 1)
        chain = base[:cut] + tuple(rng.randrange(64 if rng.random() < 0.2 else 1 << 32)
                                   for _ in range(rng.randrange(0, 12)))
        if not chain:
            continue
        address = rng.choice(endpoints[:rng.randrange(1, 9)])
        if rng.random() < 0.05:
            hashes = list(chain[::4])
            old.learn(hashes, address)
            new.learn(hashes, address)
            continue
        assert old.match(chain, endpoints) == new.match(chain, endpoints)
        assert old.holders(chain, 3) == new.holders(chain, 3)
        assert old.record(chain, address) == new.record(chain, address), chain
        assert list(old._blocks.items()) == list(new._blocks.items())
        assert old.depths(chain) == new.depths(chain)
print("equivalent over", rounds, "operations per 20 directories")

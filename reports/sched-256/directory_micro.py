import random, timeit, sys, importlib.util
sys.path.insert(0, "/work/wt/tests")
from extproc.scheduling.prefix_directory import PrefixDirectory as New
spec = importlib.util.spec_from_file_location("oldpd", "/tmp/s8-old/extproc/scheduling/prefix_directory.py")
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
from extproc.scheduling.prefix import prefix_blocks
from extproc.bench.scheduling import _prompt
rng = random.Random(1)
addrs = [f"10.0.{i // 250}.{i % 250 + 1}:8000" for i in range(256)]
texts = [_prompt(rng, 16000) for _ in range(8)]
chains = [prefix_blocks(t) for t in texts]
homes = [rng.choice(addrs) for _ in chains]
present = rng.sample(addrs, 14) + homes[:1]
def build(cls):
    d = cls(200_000, 8)
    for c, h in zip(chains, homes): d.record(c, h)
    return d
n, o = build(New), build(old.PrefixDirectory)
c = chains[0]
def new_decision():
    cc = tuple(list(c))  # a new tuple per decision, as in production
    n.holders(cc, 8); n.match(cc, present); n.record(cc, homes[0])
def old_decision():
    cc = tuple(list(c))
    o.holders(cc, 8); o.match(cc, present); o.record(cc, homes[0])
def new_walk():
    n._walked = None; n.match(c, present)
def hashing():
    prefix_blocks(texts[0])
for name, fn in [("old decision", old_decision), ("new decision", new_decision), ("new walk", new_walk), ("hash", hashing)]:
    print(name, round(min(timeit.repeat(fn, number=2000, repeat=7))/2000*1e6, 1), "us")

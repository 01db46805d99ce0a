"""Log the cache-lifetime rule's decisions in one virtual-time run: probe.py VARIANT WORKLOAD SEED."""
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "i15-s13"))
import sweep  # noqa: E402
from extproc.scheduling import cache_life  # noqa: E402

ORIG = cache_life.CacheLife._placeable


def logged(self, family, prefix_tokens, target, homes, now, stats):
    ok = ORIG(self, family, prefix_tokens, target, homes, now, stats)
    m = target.metrics
    kv = float(m.num_gpu_blocks * m.block_size) if m else 0.0
    fa = stats[0]
    rate = fa.get(family, 1.0) * sum(self.rate(family, a, now) for a in homes)
    hw, hf = self._load(homes[0], now, fa)
    w, f = self._load(target.address, now, fa)
    before = self.lifetime(kv, w, f)
    after = self.lifetime(kv, w, [*f, (prefix_tokens, rate / 2)])
    rarest = min((r for _, r in f if r * before >= 1.0), default=math.inf)
    print(f"t={now:5.2f} fam={family % 10000:4d} ok={int(ok)} rate={rate:.2f} need={self.margin * 2 / max(rate, 1e-9):.2f} "
          f"Thome={self.lifetime(kv, hw, hf):.2f} Tb={before:.2f} Ta={after:.2f} W={w:.0f} nf={len(f)} "
          f"rarest={rarest:.2f} protect={self.margin / rarest:.2f}", flush=True)
    return ok


cache_life.CacheLife._placeable = logged
r = sweep.one(sys.argv[1], sys.argv[2], int(sys.argv[3]))
print("result hit %.4f p90 %.1f p99 %.1f p50 %.1f cold %d" % r[:5])

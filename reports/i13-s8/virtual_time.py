"""Virtual-time comparison of the reserve rules on the overload mix (tests/unit/flow/test_overload_priority.py's
fleet: 4 h100-8b engines, capacity learned, warm-up at 1.5x then an idle start): per-class TTFT p99 at 0.9x with
flow control on (old rule: reserve always; new: only while saturated) and off, and critical's p99 ratio 2x / 0.7x.

Run: PYTHONPATH=. .venv/bin/python reports/i13-s8/virtual_time.py
"""

import extproc.flow.controller as controller
from tests.unit.flow.test_overload_priority import _p99, _point

SEEDS = (1, 2, 3, 4, 5, 6)
RULES = {"always (old)": 0.0, "while saturated (new)": controller.RESERVE_FREED_INTERVAL_S}


def ms(values: list[float]) -> str:
    return f"{_p99(values) * 1000:.0f}"


print("| seed | rule | 0.9x crit | 0.9x std | 0.9x shed | 0.9x refused | off crit | off std | off shed |"
      " 2x crit p99 | 2x/0.7x |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for seed in SEEDS:
    off, _ = _point(0.9, flow=False, seed=seed)
    for name, interval in RULES.items():
        controller.RESERVE_FREED_INTERVAL_S = interval  # type: ignore[misc]
        on, refused = _point(0.9, flow=True, seed=seed)
        calm, _ = _point(0.7, flow=True, seed=seed)
        over, _ = _point(2.0, flow=True, seed=seed)
        ratio = _p99(over["critical"]) / _p99(calm["critical"])
        print(f"| {seed} | {name} | {ms(on['critical'])} | {ms(on['standard'])} | {ms(on['sheddable'])} | {refused} |"
              f" {ms(off['critical'])} | {ms(off['standard'])} | {ms(off['sheddable'])} |"
              f" {ms(over['critical'])} | {ratio:.2f} |", flush=True)

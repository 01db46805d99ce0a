import sys
sys.path.insert(0, "reports/i13-s10")
import replicas_vt
for seed in [int(s) for s in sys.argv[1:]]:
    for replicas in (3,):
        calm, *_ = replicas_vt.point(0.7, True, seed, replicas, False)
        over, refused, held, _ = replicas_vt.point(2.0, True, seed, replicas, False)
        print(f"seed {seed} replicas {replicas}: crit p99 0.7x {replicas_vt.p99(calm['critical'])*1000:.0f} 2x {replicas_vt.p99(over['critical'])*1000:.0f} ratio {replicas_vt.p99(over['critical'])/replicas_vt.p99(calm['critical']):.2f} refused {refused}", flush=True)

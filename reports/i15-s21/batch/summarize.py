"""CPU per replica of three, Redis, client TTFT p90/p99, per run (a = two connections per round, b = one write)."""
import glob, json
for kind in ("mt80", "idle"):
    for rev in ("a", "b"):
        for run in sorted(glob.glob(f"{kind}-{rev}-r?")):
            r = json.load(open(f"{run}/results.json"))
            for p in r["points"]:
                c = p["cores"]
                per = [v for k, v in c.items() if k.startswith("service")]
                print(f"{run:10} seed {p['seed']:2}: CPU per replica {sum(per) / len(per):.3f} (total {sum(per):.3f}), "
                      f"redis {c.get('redis', 0):.3f}, envoy {c.get('envoy', 0):.3f}, sim {c.get('sim', 0):.3f}; "
                      f"TTFT p90/p99 {p['ttft_p90_ms']}/{p['ttft_p99_ms']} hit {p['hit_rate']}")

"""PrefixChains before/after one change, in one process, alternating: microseconds per call (CPU time, median of
rounds) on prompt shapes the gateway sees. Usage: ab.py OLD_REPO NEW_REPO"""
import importlib.util, random, statistics, sys, time

def load(repo, name):
    spec = importlib.util.spec_from_file_location(name, f"{repo}/extproc/scheduling/prefix.py")
    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
    return module

old, new = load(sys.argv[1], "old_prefix"), load(sys.argv[2], "new_prefix")
words = ("gpu", "token", "cache", "prefix", "stream", "latency", "envoy", "router", "batch", "model")
rng = random.Random(7)
def words_of(chars):
    return " ".join(rng.choice(words) for _ in range(chars // 5 + 1))[:chars]
def chat(*messages):
    return "\n".join(f"<|{'system' if i == 0 else 'user' if i % 2 else 'assistant'}|>{m}" for i, m in enumerate(messages))

systems12 = [words_of(12_000) for _ in range(8)]
systems16 = [words_of(16_000) for _ in range(8)]
docs200 = [words_of(200_000) for _ in range(8)]
history = [words_of(1_200) if i % 2 else words_of(400) for i in range(12)]
cases = {
    "12 KB system + 1.2 KB question (the bench's shared prefix)": [chat(systems12[i % 8], words_of(1_200)) for i in range(64)],
    "16 KB system + short question": [chat(systems16[i % 8], f"question {i}") for i in range(64)],
    "200 KB document + short question": [chat(docs200[i % 8], f"question {i}") for i in range(64)],
    "200 KB document as the last message": [chat("You read.", docs200[i % 8]) for i in range(64)],
    "multi-turn, 12 KB system + 6-11 turns (>16 KB)": [chat(systems12[i % 8], *history[:6 + i % 6]) for i in range(64)],
}
print(f"{'case':58} {'before us':>10} {'after us':>10}")
for name, texts in cases.items():
    chains = {"old": old.PrefixChains("\n<|"), "new": new.PrefixChains("\n<|")}
    for which in chains:  # warm: every text once
        for text in texts:
            chains[which](text)
    assert all(chains["old"](t) == chains["new"](t) for t in texts)
    spent = {"old": [], "new": []}
    for _ in range(30):
        for which in ("old", "new"):
            call = chains[which]
            started = time.thread_time()
            for text in texts:
                call(text)
            spent[which].append((time.thread_time() - started) / len(texts) * 1e6)
    print(f"{name:58} {statistics.median(spent['old']):10.1f} {statistics.median(spent['new']):10.1f}")

"""PrefixChains vs prefix_blocks on the routing workload's prompts, interleaved: .venv/bin/python reports/i15-s11/chains_vs_plain.py"""
import json, time
from extproc.scheduling.prefix import prefix_blocks, PrefixChains
from extproc.openai.prompt import prompt_view, MESSAGE_START
from extproc.openai.apis import Api
from extproc.bench.routing_workloads import shared_prefix_workload
wl = shared_prefix_workload("chat", groups=48, prefix_tokens=(3000, 3000), question_tokens=(300, 300), max_tokens=(100, 100))
texts = [prompt_view(Api.CHAT, json.loads(wl.next_spec(i).body))[0] for i in range(2000)]
memo = PrefixChains(MESSAGE_START)
for t in texts: assert memo(t) == prefix_blocks(t)
for r in range(3):
    for name, f in (("plain", prefix_blocks), ("memo", memo)):
        t0 = time.thread_time()
        for t in texts: f(t)
        print(name, f"{(time.thread_time()-t0)/len(texts)*1e6:.1f} us", end="; ")
    print()
print("hits", memo.hits, "held", memo.held)

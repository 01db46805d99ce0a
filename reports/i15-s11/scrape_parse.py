"""The metrics parse cost per scrape of a simulator page: .venv/bin/python reports/i15-s11/scrape_parse.py"""
import time
from extproc.sim.metrics import render_metrics, Counters, Gauges
from extproc.endpoints.vllm_metrics import parse_vllm_metrics
c = Counters(requests=12345, prompt_tokens=4_000_000, generation_tokens=100_000)
for h in c.histograms.values():
    for v in (0.01, 0.05, 0.3, 1.0): h.observe(v, 100)
text = render_metrics("org/chat-8b", c, Gauges(3, 1, 0.4, (), (), 4, 16, 3615, time.time()))
print(len(text), text.count("\n"), "lines")
n = 2000
t = time.thread_time()
for _ in range(n): parse_vllm_metrics(text, 1.0)
print(f"parse {(time.thread_time()-t)/n*1e6:.0f} us")

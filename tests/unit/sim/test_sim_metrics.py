from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from extproc.sim.engine import Engine, GenRequest
from extproc.sim.metrics import Histogram, render_metrics
from extproc.sim.profile import Profile


def families(text: str) -> dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    out: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for family in text_string_to_metric_families(text):
        samples = out.setdefault(family.name, {})
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_histogram_buckets_are_cumulative_and_weighted() -> None:
    h = Histogram((0.1, 1.0))
    h.observe(0.05)
    h.observe(0.5, count=3)
    h.observe(5.0)
    assert h.cumulative() == [("0.1", 1), ("1.0", 4), ("+Inf", 5)]
    assert h.total == 5 and h.sum == 0.05 + 1.5 + 5.0


def test_boundary_value_falls_into_its_bucket() -> None:
    h = Histogram((0.1, 1.0))
    h.observe(0.1)
    assert h.cumulative()[0] == ("0.1", 1)


def test_rendered_text_parses_with_vllm_names_and_model_label() -> None:
    now = [0.0]
    eng = Engine(Profile(), lambda: now[0])
    first = GenRequest("a", list(range(40)), [1, 2, 3], finish_reason="length")
    eng.submit(first)
    while eng.has_work:  # one prefill step, then two decode steps of ~6.6 ms
        step = eng.begin_step(now[0])
        assert step is not None
        now[0] += step.duration_s
        eng.end_step(step, now[0])
    second = GenRequest("b", list(range(40)), [1, 2], lora="sql")
    eng.submit(second)
    step = eng.begin_step(now[0])
    assert step is not None
    eng.end_step(step, now[0] + step.duration_s)
    text = render_metrics('org/model:"v1"', eng.counters, eng.gauges(123.0))
    parsed = families(text)
    model = ("model_name", 'org/model:"v1"')
    assert parsed["vllm:num_requests_running"][("vllm:num_requests_running", (model,))] == 1
    assert parsed["vllm:num_requests_waiting"][("vllm:num_requests_waiting", (model,))] == 0
    usage = parsed["vllm:kv_cache_usage_perc"][("vllm:kv_cache_usage_perc", (model,))]
    assert 0 < usage < 1
    assert parsed["vllm:prefix_cache_queries"][("vllm:prefix_cache_queries_total", (model,))] == 80
    # The LoRA request does not share the base model's blocks.
    assert parsed["vllm:prefix_cache_hits"][("vllm:prefix_cache_hits_total", (model,))] == 0
    assert parsed["vllm:generation_tokens"][("vllm:generation_tokens_total", (model,))] == 4
    assert parsed["vllm:request_success"][
        ("vllm:request_success_total", (("finished_reason", "length"), model))] == 1
    lora = parsed["vllm:lora_requests_info"]
    ((name, labels), value), = lora.items()
    assert dict(labels)["running_lora_adapters"] == "sql" and dict(labels)["max_lora"] == "4"
    assert value == 123.0
    cache = dict(next(iter(parsed["vllm:cache_config_info"]))[1])
    assert cache["block_size"] == "16" and cache["num_gpu_blocks"] == "28000"
    ttft = parsed["vllm:time_to_first_token_seconds"]
    assert ttft[("vllm:time_to_first_token_seconds_count", (model,))] == 2
    assert ttft[("vllm:time_to_first_token_seconds_bucket", (("le", "+Inf"), model))] == 2
    itl = parsed["vllm:inter_token_latency_seconds"]
    assert itl[("vllm:inter_token_latency_seconds_count", (model,))] == 2
    assert itl[("vllm:inter_token_latency_seconds_bucket", (("le", "0.01"), model))] == 2
    for name in ("vllm:time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:prompt_tokens", "vllm:request_queue_time_seconds"):
        assert name in parsed

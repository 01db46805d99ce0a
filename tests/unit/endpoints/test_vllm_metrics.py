from __future__ import annotations

import dataclasses
import math
import random

import pytest

from extproc.endpoints import EndpointMetrics, parse_vllm_metrics

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TTFT_BOUNDS = ("0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0",
               "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0", "+Inf")
TOKEN_BOUNDS = ("1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0", "1000.0", "2000.0",
                "5000.0", "10000.0", "+Inf")


def _histogram(name: str, help_text: str, bounds: tuple[str, ...], model: str) -> str:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    count = 0
    for i, bound in enumerate(bounds):
        count += i * 3
        lines.append(f'{name}_bucket{{engine="0",le="{bound}",model_name="{model}"}} {float(count)}')
    lines.append(f'{name}_count{{engine="0",model_name="{model}"}} {float(count)}')
    lines.append(f'{name}_sum{{engine="0",model_name="{model}"}} 1234.5678')
    lines.append(f'{name}_created{{engine="0",model_name="{model}"}} 1.7231e+09')
    return "\n".join(lines)


# What a vLLM 0.10 OpenAI server answers on /metrics (shape and names; numbers made up), with a second
# served model name and a LoRA info history of three samples.
VLLM_PAGE = "\n".join([
    "# HELP python_gc_objects_collected_total Objects collected during gc",
    "# TYPE python_gc_objects_collected_total counter",
    'python_gc_objects_collected_total{generation="0"} 12345.0',
    'python_gc_objects_collected_total{generation="1"} 2345.0',
    'python_gc_objects_collected_total{generation="2"} 345.0',
    "# HELP python_info Python platform information",
    "# TYPE python_info gauge",
    'python_info{implementation="CPython",major="3",minor="12",patchlevel="3",version="3.12.3"} 1.0',
    "# HELP process_resident_memory_bytes Resident memory size in bytes.",
    "# TYPE process_resident_memory_bytes gauge",
    "process_resident_memory_bytes 4.123456e+09",
    "# HELP process_open_fds Number of open file descriptors.",
    "# TYPE process_open_fds gauge",
    "process_open_fds 87.0",
    "# HELP vllm:num_requests_running Number of requests in model execution batches.",
    "# TYPE vllm:num_requests_running gauge",
    f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 5.0',
    'vllm:num_requests_running{engine="0",model_name="alias \\"quoted\\", {with} braces"} 2.0',
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
    "# TYPE vllm:num_requests_waiting gauge",
    f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 3.0',
    'vllm:num_requests_waiting{engine="0",model_name="alias \\"quoted\\", {with} braces"} 1.0',
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
    "# TYPE vllm:kv_cache_usage_perc gauge",
    f'vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.4375',
    "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
    "# TYPE vllm:prefix_cache_queries_total counter",
    f'vllm:prefix_cache_queries_total{{engine="0",model_name="{MODEL}"}} 120000.0',
    'vllm:prefix_cache_queries_total{engine="0",model_name="alias \\"quoted\\", {with} braces"} 8000.0',
    "# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.",
    "# TYPE vllm:prefix_cache_queries_created gauge",
    f'vllm:prefix_cache_queries_created{{engine="0",model_name="{MODEL}"}} 1.7231e+09',
    "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.",
    "# TYPE vllm:prefix_cache_hits_total counter",
    f'vllm:prefix_cache_hits_total{{engine="0",model_name="{MODEL}"}} 64000.0',
    "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
    "# TYPE vllm:num_preemptions_total counter",
    f'vllm:num_preemptions_total{{engine="0",model_name="{MODEL}"}} 0.0',
    "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
    "# TYPE vllm:prompt_tokens_total counter",
    f'vllm:prompt_tokens_total{{engine="0",model_name="{MODEL}"}} 130000.0',
    "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
    "# TYPE vllm:generation_tokens_total counter",
    f'vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}} 45000.0',
    "# HELP vllm:request_success_total Count of successfully processed requests.",
    "# TYPE vllm:request_success_total counter",
    f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="{MODEL}"}} 310.0',
    f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{MODEL}"}} 12.0',
    f'vllm:request_success_total{{engine="0",finished_reason="abort",model_name="{MODEL}"}} 1.0',
    _histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_BOUNDS, MODEL),
    _histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", TOKEN_BOUNDS, MODEL),
    _histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", TOKEN_BOUNDS,
               MODEL),
    _histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BOUNDS,
               MODEL),
    _histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", TTFT_BOUNDS,
               MODEL),
    _histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", TTFT_BOUNDS,
               MODEL),
    _histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
               TTFT_BOUNDS, MODEL),
    "# HELP vllm:lora_requests_info Running stats on lora requests.",
    "# TYPE vllm:lora_requests_info gauge",
    'vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7231e+09',
    'vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat-\\"v2\\"",'
    'waiting_lora_adapters="summarise"} 1.7231000502e+09',
    'vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql",waiting_lora_adapters=""} 1.7231000301e+09',
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig.",
    "# TYPE vllm:cache_config_info gauge",
    'vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",'
    'cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",'
    'is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="27713",num_gpu_blocks_override="None",'
    'prefix_caching_hash_algo="builtin",sliding_window="None",swap_space="4",'
    'swap_space_bytes="4294967296"} 1.0',
    "",
])


def test_fixture_is_a_typical_page() -> None:
    assert 200 <= VLLM_PAGE.count("\n") <= 260


def test_parses_a_real_looking_vllm_page() -> None:
    metrics = parse_vllm_metrics(VLLM_PAGE, 12.5)
    assert metrics.ttft_count == 759.0 and metrics.ttft_buckets[-1] == (float("inf"), 759.0)
    assert len(metrics.ttft_buckets) == 23
    metrics = dataclasses.replace(metrics, ttft_buckets=(), ttft_sum=0.0, ttft_count=0.0)
    assert metrics == EndpointMetrics(
        scraped_at=12.5,
        running=7.0,
        waiting=4.0,
        kv_usage=0.4375,
        running_loras=frozenset({"sql", 'chat-"v2"'}),
        waiting_loras=frozenset({"summarise"}),
        max_lora=4,
        prefix_queries=128000.0,
        prefix_hits=64000.0,
        block_size=16,
        num_gpu_blocks=27713,
        step_tokens_buckets=((1.0, 0.0), (2.0, 3.0), (5.0, 9.0), (10.0, 18.0), (20.0, 30.0), (50.0, 45.0),
                             (100.0, 63.0), (200.0, 84.0), (500.0, 108.0), (1000.0, 135.0), (2000.0, 165.0),
                             (5000.0, 198.0), (10000.0, 234.0), (math.inf, 273.0)),
    )


def test_crlf_line_endings_and_trailing_timestamps() -> None:
    page = (
        "vllm:num_requests_running 2 1700000000000\r\n"
        'vllm:num_requests_waiting{model_name="m"}   6.5\r\n'
        'vllm:kv_cache_usage_perc{model_name="m"} 0.25 1700000000000\r\n'
    )
    metrics = parse_vllm_metrics(page, 0.0)
    assert (metrics.running, metrics.waiting, metrics.kv_usage) == (2.0, 6.5, 0.25)


def test_older_metric_names_are_used_only_when_the_new_ones_are_absent() -> None:
    old = (
        '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
        'vllm:gpu_prefix_cache_queries_total{model_name="m"} 100.0\n'
        'vllm:gpu_prefix_cache_hits_total{model_name="m"} 40.0\n'
    )
    metrics = parse_vllm_metrics(old, 1.0)
    assert (metrics.kv_usage, metrics.prefix_queries, metrics.prefix_hits) == (0.5, 100.0, 40.0)
    both = old + (
        'vllm:kv_cache_usage_perc{model_name="m"} 0.75\n'
        'vllm:prefix_cache_queries_total{model_name="m"} 200.0\n'
        'vllm:prefix_cache_hits_total{model_name="m"} 90.0\n'
    )
    metrics = parse_vllm_metrics(both, 1.0)
    assert (metrics.kv_usage, metrics.prefix_queries, metrics.prefix_hits) == (0.75, 200.0, 90.0)


def test_kv_usage_takes_the_most_loaded_engine_and_stays_a_fraction() -> None:
    page = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75\n'
    )
    assert parse_vllm_metrics(page, 0.0).kv_usage == 0.75
    assert parse_vllm_metrics("vllm:kv_cache_usage_perc 1.5\n", 0.0).kv_usage == 1.0


def test_names_match_exactly_not_by_longer_prefix() -> None:
    page = (
        "vllm:num_requests_running_extra 9\n"
        "xvllm:num_requests_running 9\n"
        "# vllm:num_requests_running 9\n"
        '# HELP vllm:num_requests_waiting {x="1"} 9\n'
        "vllm:num_requests_running 1\n"
    )
    metrics = parse_vllm_metrics(page, 0.0)
    assert (metrics.running, metrics.waiting) == (1.0, 0.0)


def test_lora_info_without_adapters_and_with_blank_entries() -> None:
    page = 'vllm:lora_requests_info{running_lora_adapters=" a , ,b,",waiting_lora_adapters="",max_lora="2"} 5\n'
    metrics = parse_vllm_metrics(page, 0.0)
    assert metrics.running_loras == frozenset({"a", "b"})
    assert metrics.waiting_loras == frozenset()
    assert metrics.max_lora == 2


def test_label_escapes_are_decoded() -> None:
    page = (
        'vllm:lora_requests_info{max_lora="1",running_lora_adapters="back\\\\slash,new\\nline,q\\"x",'
        'waiting_lora_adapters="",} 1\n'
    )
    metrics = parse_vllm_metrics(page, 0.0)
    assert metrics.running_loras == frozenset({"back\\slash", "new\nline", 'q"x'})


def test_defaults_when_nothing_matches() -> None:
    assert parse_vllm_metrics("", 3.0) == EndpointMetrics(scraped_at=3.0)
    assert parse_vllm_metrics("# only comments\n# TYPE x gauge\n", 3.0) == EndpointMetrics(scraped_at=3.0)


@pytest.mark.parametrize(
    "page",
    [
        "vllm:num_requests_running{model_name=\"m\" 5\nvllm:num_requests_waiting 2\n",
        "vllm:num_requests_running abc\nvllm:num_requests_waiting 2\n",
        "vllm:num_requests_running NaN\nvllm:num_requests_running +Inf\nvllm:num_requests_waiting 2\n",
        "vllm:num_requests_running\nvllm:num_requests_waiting 2\n",
        'vllm:cache_config_info{block_size="sixteen",num_gpu_blocks="None"} 1\nvllm:num_requests_waiting 2\n',
        'vllm:cache_config_info{block_size="16" num_gpu_blocks="9"} 1\nvllm:num_requests_waiting 2\n',
        'vllm:lora_requests_info{max_lora="x",running_lora_adapters="a} 1\nvllm:num_requests_waiting 2\n',
        'vllm:lora_requests_info{max_lora="1e400",running_lora_adapters="a\\"} 1\nvllm:num_requests_waiting 2\n',
        "\x00\xff\ufffd\n\n\n{}}}{{ 1\nvllm:num_requests_waiting 2",
    ],
)
def test_malformed_lines_are_skipped(page: str) -> None:
    metrics = parse_vllm_metrics(page, 0.0)
    assert metrics.waiting == 2.0
    assert metrics.running == 0.0
    assert metrics.block_size == 16 and metrics.num_gpu_blocks == 0
    assert metrics.running_loras == frozenset()


def test_random_garbage_never_raises() -> None:
    rng = random.Random(7)
    alphabet = 'vlm:_{}="\\, \n\t#0123456789.eE+-abcdefghijklmnopqrstuvwxyz'
    pieces = [line + "\n" for line in VLLM_PAGE.splitlines()]
    for _ in range(300):
        noise = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 300)))
        page = "".join(rng.sample(pieces, 20)) + noise
        cut = rng.randrange(0, len(page) + 1)
        result = parse_vllm_metrics(page[:cut] + noise + page[cut:], 0.0)
        assert 0.0 <= result.kv_usage <= 1.0


def test_ttft_histogram_is_summed_over_label_sets() -> None:
    from extproc.endpoints import parse_vllm_metrics

    page = "\n".join([
        '# TYPE vllm:time_to_first_token_seconds histogram',
        'vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="a"} 3.0',
        'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="a"} 5.0',
        'vllm:time_to_first_token_seconds_bucket{model_name="b",le="0.1"} 1.0',
        'vllm:time_to_first_token_seconds_bucket{model_name="b",le="+Inf"} 1.0',
        'vllm:time_to_first_token_seconds_sum{model_name="a"} 0.75',
        'vllm:time_to_first_token_seconds_count{model_name="a"} 5.0',
        'vllm:time_to_first_token_seconds_count{model_name="b"} 1.0',
        "",
    ])
    metrics = parse_vllm_metrics(page, 1.0)
    assert metrics.ttft_buckets == ((0.1, 4.0), (float("inf"), 6.0))
    assert metrics.ttft_sum == 0.75 and metrics.ttft_count == 6.0

"""Per-replica counters and histograms, rendered as Prometheus text with vLLM's metric names."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["FINISH_REASONS", "Counters", "Gauges", "Histogram", "render_metrics"]

FINISH_REASONS = ("stop", "length", "abort")

# Bucket boundaries as vLLM's v1 Prometheus logger defines them.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
STEP_TOKEN_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class Histogram:
    """Cumulative-on-render histogram; `observe(v, n)` records n equal observations in O(log buckets)."""

    __slots__ = ("bounds", "counts", "sum", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.total = 0

    def observe(self, value: float, count: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += count
        self.sum += value * count
        self.total += count

    def cumulative(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        running = 0
        for bound, count in zip((*(repr(b) for b in self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


def _new_histograms() -> dict[str, Histogram]:
    return {
        "vllm:time_to_first_token_seconds": Histogram(TTFT_BUCKETS),
        "vllm:inter_token_latency_seconds": Histogram(ITL_BUCKETS),
        "vllm:time_per_output_token_seconds": Histogram(ITL_BUCKETS),
        "vllm:e2e_request_latency_seconds": Histogram(REQUEST_BUCKETS),
        "vllm:request_queue_time_seconds": Histogram(REQUEST_BUCKETS),
        # A histogram despite the `_total` in its name, as vLLM names it.
        "vllm:iteration_tokens_total": Histogram(STEP_TOKEN_BUCKETS),
    }


@dataclass(slots=True)
class Counters:
    """Monotonic counts since start or the last reset; token counts as vLLM counts them."""

    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries_tokens: int = 0
    prefix_hits_tokens: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    histograms: dict[str, Histogram] = field(default_factory=_new_histograms)


@dataclass(frozen=True, slots=True)
class Gauges:
    running: int
    waiting: int
    kv_usage: float
    running_loras: tuple[str, ...]
    waiting_loras: tuple[str, ...]
    max_loras: int
    block_size: int
    num_gpu_blocks: int
    timestamp: float


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


_HELP = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:gpu_cache_usage_perc": "GPU KV-cache usage (pre-0.10 name of vllm:kv_cache_usage_perc).",
    "vllm:lora_requests_info": "Running stats on lora requests.",
    "vllm:cache_config_info": "Information of the LLMEngine CacheConfig.",
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:request_success": "Count of successfully processed requests.",
    "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "vllm:inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "vllm:time_per_output_token_seconds": "Histogram of time per output token in seconds.",
    "vllm:e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "vllm:request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "vllm:iteration_tokens": "Histogram of number of tokens per engine_step.",
}


def render_metrics(model_name: str, counters: Counters, gauges: Gauges) -> str:
    lines: list[str] = []
    model = ("model_name", model_name)
    base = _labels([model])

    def head(name: str, kind: str) -> None:
        lines.append(f"# HELP {name} {_HELP[name.removesuffix('_total')]}")
        lines.append(f"# TYPE {name} {kind}")

    def gauge(name: str, value: float) -> None:
        head(name, "gauge")
        lines.append(f"{name}{base} {float(value)!r}")

    # Text format 0.0.4 as prometheus_client writes it: counter families are declared with `_total`.
    def counter(name: str, value: float) -> None:
        head(f"{name}_total", "counter")
        lines.append(f"{name}_total{base} {float(value)!r}")

    gauge("vllm:num_requests_running", gauges.running)
    gauge("vllm:num_requests_waiting", gauges.waiting)
    gauge("vllm:kv_cache_usage_perc", gauges.kv_usage)
    gauge("vllm:gpu_cache_usage_perc", gauges.kv_usage)
    head("vllm:lora_requests_info", "gauge")
    lora_labels = _labels([("max_lora", str(gauges.max_loras)),
                           ("running_lora_adapters", ",".join(gauges.running_loras)),
                           ("waiting_lora_adapters", ",".join(gauges.waiting_loras)), model])
    lines.append(f"vllm:lora_requests_info{lora_labels} {gauges.timestamp!r}")
    head("vllm:cache_config_info", "gauge")
    cache_labels = _labels([("block_size", str(gauges.block_size)), ("enable_prefix_caching", "True"),
                            ("num_gpu_blocks", str(gauges.num_gpu_blocks)), model])
    lines.append(f"vllm:cache_config_info{cache_labels} 1.0")
    counter("vllm:prefix_cache_queries", counters.prefix_queries_tokens)
    counter("vllm:prefix_cache_hits", counters.prefix_hits_tokens)
    counter("vllm:prompt_tokens", counters.prompt_tokens)
    counter("vllm:generation_tokens", counters.generation_tokens)
    counter("vllm:num_preemptions", counters.preemptions)
    head("vllm:request_success_total", "counter")
    for reason, count in counters.finished.items():
        labels = _labels([("finished_reason", reason), model])
        lines.append(f"vllm:request_success_total{labels} {float(count)!r}")
    for name, hist in counters.histograms.items():
        head(name, "histogram")
        for bound, count in hist.cumulative():
            lines.append(f"{name}_bucket{_labels([('le', bound), model])} {float(count)!r}")
        lines.append(f"{name}_count{base} {float(hist.total)!r}")
        lines.append(f"{name}_sum{base} {hist.sum!r}")
    lines.append("")
    return "\n".join(lines)

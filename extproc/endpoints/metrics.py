"""One scrape of a vLLM server's /metrics, as the gateway keeps it (names as vLLM exports them)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EndpointMetrics"]


@dataclass(frozen=True, slots=True)
class EndpointMetrics:
    """One scrape of a vLLM server's /metrics (names as vLLM exports them)."""

    scraped_at: float  # monotonic clock of the scraping process
    running: float = 0.0  # vllm:num_requests_running
    waiting: float = 0.0  # vllm:num_requests_waiting
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0..1
    running_loras: frozenset[str] = frozenset()  # vllm:lora_requests_info{running_lora_adapters}
    waiting_loras: frozenset[str] = frozenset()  # vllm:lora_requests_info{waiting_lora_adapters}
    max_lora: int = 0  # vllm:lora_requests_info{max_lora}
    prefix_queries: float = 0.0  # vllm:prefix_cache_queries_total (tokens)
    prefix_hits: float = 0.0  # vllm:prefix_cache_hits_total (tokens)
    block_size: int = 16  # vllm:cache_config_info{block_size}
    num_gpu_blocks: int = 0  # vllm:cache_config_info{num_gpu_blocks}
    # vllm:time_to_first_token_seconds histogram: (upper bound, cumulative count), sum, count.
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    preemptions: float = 0.0  # vllm:num_preemptions_total
    # vllm:iteration_tokens_total histogram (tokens per engine step): (upper bound, cumulative count).
    step_tokens_buckets: tuple[tuple[float, float], ...] = ()

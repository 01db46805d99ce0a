"""Parse the few vLLM /metrics samples the scheduler uses out of Prometheus text exposition.

A full Prometheus parser would build an object per sample of every histogram bucket; a vLLM page has
hundreds of those and we need about ten samples. One regular expression finds only the lines whose metric
name is wanted (its literal prefix `\\nvllm:` lets the regex engine skip the rest of the page in C), and
labels are read only for the two info metrics that carry their payload in labels.
Garbage never raises: a line that does not parse is skipped and the defaults of `EndpointMetrics` stay.
"""

from __future__ import annotations

import re
from itertools import chain
from math import isfinite

from extproc.endpoints.metrics import EndpointMetrics

__all__ = ["parse_vllm_metrics"]

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV = "vllm:kv_cache_usage_perc"
_KV_OLD = "vllm:gpu_cache_usage_perc"  # before vLLM 0.10
_QUERIES = "vllm:prefix_cache_queries_total"
_QUERIES_OLD = "vllm:gpu_prefix_cache_queries_total"
_HITS = "vllm:prefix_cache_hits_total"
_HITS_OLD = "vllm:gpu_prefix_cache_hits_total"
_LORA = "vllm:lora_requests_info"
_CACHE = "vllm:cache_config_info"
_TTFT_BUCKET = "vllm:time_to_first_token_seconds_bucket"
_TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
_TTFT_COUNT = "vllm:time_to_first_token_seconds_count"
_PREEMPTIONS = "vllm:num_preemptions_total"
_STEP_TOKENS_BUCKET = "vllm:iteration_tokens_total_bucket"

# A sample line: name, optional {labels}, whitespace, value, optional timestamp. The name alternation is
# followed by `{` or blank so that `vllm:num_requests_running_foo` never matches. The label group is greedy
# up to the last `}` of the line: a value and a timestamp cannot contain `}`, label values can.
_SAMPLE_BODY = (
    r"(vllm:(?:num_requests_(?:running|waiting)|(?:kv|gpu)_cache_usage_perc"
    r"|(?:gpu_)?prefix_cache_(?:queries|hits)_total|lora_requests_info|cache_config_info"
    r"|time_to_first_token_seconds_(?:bucket|sum|count)|num_preemptions_total|iteration_tokens_total_bucket))"
    r"(?:\{([^\n]*)\})?[ \t]+([^ \t\r\n]+)"
)
_FIRST_SAMPLE = re.compile(_SAMPLE_BODY)
_SAMPLE = re.compile("\n" + _SAMPLE_BODY)
# A quoted label value with escapes, written as an unrolled loop so the regex engine never backtracks.
_VALUE = r'[^"\\\n]*(?:\\.[^"\\\n]*)*'
_PAIR = r'[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"' + _VALUE + r'"[ \t]*,'
_UNESCAPE = re.compile(r"\\(.)")


def _label_pattern(name: str) -> re.Pattern[str]:
    """Finds one label by walking the label set pair by pair from its start, in C.

    Walking whole quoted pairs (instead of searching for `name="`) is what keeps a value that happens to
    contain `,name=` from being read as the label; only the pairs before the wanted one must be well formed.
    """
    return re.compile(r"(?:" + _PAIR + r")*?[ \t]*" + name + r'[ \t]*=[ \t]*"(' + _VALUE + r')"[ \t]*(?:,|$)')


_BLOCK_SIZE = _label_pattern("block_size")
_NUM_GPU_BLOCKS = _label_pattern("num_gpu_blocks")
_MAX_LORA = _label_pattern("max_lora")
_RUNNING_ADAPTERS = _label_pattern("running_lora_adapters")
_WAITING_ADAPTERS = _label_pattern("waiting_lora_adapters")
_LE = _label_pattern("le")


def _unescape_char(match: re.Match[str]) -> str:
    char = match.group(1)
    return "\n" if char == "n" else char


def _label(pattern: re.Pattern[str], labels: str) -> str | None:
    match = pattern.match(labels)
    if match is None:
        return None
    value = match.group(1)
    return _UNESCAPE.sub(_unescape_char, value) if "\\" in value else value


def _adapters(value: str | None) -> frozenset[str]:
    if not value:
        return frozenset()
    return frozenset(name for name in (part.strip() for part in value.split(",")) if name)


def _int(value: str | None, default: int) -> int:
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        pass
    try:
        number = float(value)  # "16.0"; "None" (vLLM before the cache is sized) falls through to default
    except ValueError:
        return default
    return int(number) if isfinite(number) else default


def parse_vllm_metrics(text: str, scraped_at: float) -> EndpointMetrics:
    """The scheduler's view of one vLLM /metrics page.

    Gauges and counters that appear under several label sets (several `model_name`s or data-parallel
    `engine`s) are summed, except KV usage, a fraction, which takes the most loaded set. The newer metric
    names win over the pre-0.10 ones when a page carries both. Of several `vllm:lora_requests_info`
    samples the one with the highest value (vLLM's timestamp) is the current one.
    """
    sums: dict[str, float] = {}
    lora_labels: str | None = None
    lora_stamp = float("-inf")
    cache_labels: str | None = None
    kv = kv_old = -1.0
    ttft: dict[float, float] = {}  # bucket upper bound -> cumulative count, summed over label sets
    step_tokens: dict[float, float] = {}
    first = _FIRST_SAMPLE.match(text)
    for match in chain((first,) if first is not None else (), _SAMPLE.finditer(text)):
        name, labels, raw = match.groups()
        try:
            value = float(raw)
        except ValueError:
            continue
        if not isfinite(value):  # NaN or Inf would poison every sum and comparison
            continue
        if name == _KV:
            kv = max(kv, value)
        elif name == _KV_OLD:
            kv_old = max(kv_old, value)
        elif name == _LORA:
            if value >= lora_stamp:
                lora_stamp = value
                lora_labels = labels or ""
        elif name == _CACHE:
            cache_labels = labels or ""
        elif name in (_TTFT_BUCKET, _STEP_TOKENS_BUCKET):
            bound = _label(_LE, labels or "")
            try:
                upper = float(bound) if bound is not None else None
            except ValueError:
                upper = None
            if upper is not None:
                buckets = ttft if name == _TTFT_BUCKET else step_tokens
                buckets[upper] = buckets.get(upper, 0.0) + value
        else:
            sums[name] = sums.get(name, 0.0) + value

    running_loras: frozenset[str] = frozenset()
    waiting_loras: frozenset[str] = frozenset()
    max_lora = 0
    if lora_labels is not None:
        running_loras = _adapters(_label(_RUNNING_ADAPTERS, lora_labels))
        waiting_loras = _adapters(_label(_WAITING_ADAPTERS, lora_labels))
        max_lora = _int(_label(_MAX_LORA, lora_labels), 0)
    block_size, num_gpu_blocks = 16, 0
    if cache_labels is not None:
        block_size = _int(_label(_BLOCK_SIZE, cache_labels), 16)
        num_gpu_blocks = _int(_label(_NUM_GPU_BLOCKS, cache_labels), 0)

    kv_usage = kv if kv >= 0.0 else kv_old
    return EndpointMetrics(
        scraped_at=scraped_at,
        running=sums.get(_RUNNING, 0.0),
        waiting=sums.get(_WAITING, 0.0),
        kv_usage=min(max(kv_usage, 0.0), 1.0),
        running_loras=running_loras,
        waiting_loras=waiting_loras,
        max_lora=max_lora,
        prefix_queries=sums.get(_QUERIES, sums.get(_QUERIES_OLD, 0.0)),
        prefix_hits=sums.get(_HITS, sums.get(_HITS_OLD, 0.0)),
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        ttft_buckets=tuple(sorted(ttft.items())),
        ttft_sum=sums.get(_TTFT_SUM, 0.0),
        ttft_count=sums.get(_TTFT_COUNT, 0.0),
        preemptions=sums.get(_PREEMPTIONS, 0.0),
        step_tokens_buckets=tuple(sorted(step_tokens.items())),
    )

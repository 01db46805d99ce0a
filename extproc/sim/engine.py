"""The scheduler of one replica, sans-IO: admission, KV allocation, timing and accounting.

The engine never sleeps. It decides when a request may run (FIFO, at most `max_num_seqs` running,
KV blocks available, at most `max_loras` distinct adapters in the batch), how long its prefill takes
and what the current inter-token latency is; the async driver (`driver.py`) turns those numbers into
sleeps and reports tokens back. All times come from the injected clock.
"""

from __future__ import annotations

import contextlib
import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from extproc.sim.kvcache import Allocation, KVCache
from extproc.sim.metrics import Counters, Gauges
from extproc.sim.profile import Profile
from extproc.sim.tokens import block_hashes

__all__ = ["Engine", "GenRequest", "RequestState"]

Clock = Callable[[], float]


class RequestState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class GenRequest:
    """One request as the engine sees it: token ids in, a fixed number of token ids out."""

    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    lora: str | None = None
    finish_reason: str = "stop"
    # Called once when the request is admitted to the running batch.
    on_admit: Callable[[], None] | None = None
    state: RequestState = RequestState.WAITING
    prompt_hashes: list[int] = field(default_factory=list)
    arrival: float = 0.0
    admitted_at: float = 0.0
    first_token_at: float = 0.0
    last_token_at: float = 0.0
    generated: int = 0
    cached_tokens: int = 0
    prefill_s: float = 0.0
    allocation: Allocation | None = None

    @property
    def salt(self) -> str:
        return self.lora or ""

    @property
    def total_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


class Engine:
    def __init__(self, profile: Profile, clock: Clock) -> None:
        self.profile = profile
        self.clock = clock
        self.kv = KVCache(profile.num_gpu_blocks, profile.block_size)
        self.waiting: deque[GenRequest] = deque()
        self.running: dict[GenRequest, None] = {}  # insertion-ordered set
        self.counters = Counters()
        # Set by the slow fault; multiplies prefill and inter-token latency.
        self.slow_factor = 1.0

    # -- admission ---------------------------------------------------------------------------------

    def submit(self, request: GenRequest) -> None:
        if request.total_tokens > self.profile.max_model_len:
            raise ValueError("request longer than max_model_len")
        request.arrival = self.clock()
        request.prompt_hashes = block_hashes(request.prompt_ids, self.profile.block_size, request.salt)
        request.state = RequestState.WAITING
        self.counters.requests += 1
        self.waiting.append(request)
        self._schedule()

    def _running_loras(self) -> set[str]:
        return {r.lora for r in self.running if r.lora}

    def _schedule(self) -> None:
        """Admit from the head of the queue while the batch has room.

        A request stuck on KV blocks blocks the queue behind it (FIFO, as in vLLM); a request whose
        adapter cannot join the batch (max_loras reached) is skipped so others can go.
        """
        if not self.waiting or len(self.running) >= self.profile.max_num_seqs:
            return
        loras = self._running_loras()
        skipped: list[GenRequest] = []
        while self.waiting and len(self.running) < self.profile.max_num_seqs:
            request = self.waiting[0]
            if request.lora and request.lora not in loras and len(loras) >= self.profile.max_loras:
                skipped.append(self.waiting.popleft())
                continue
            if not self._admit(request):
                break
            self.waiting.popleft()
            if request.lora:
                loras.add(request.lora)
        self.waiting.extendleft(reversed(skipped))

    def _admit(self, request: GenRequest) -> bool:
        prompt_len = len(request.prompt_ids)
        # At least the last prompt token is always computed, so a block-aligned prompt that is fully
        # cached still recomputes its last block.
        max_hit_blocks = (prompt_len - 1) // self.profile.block_size
        total_blocks = self.kv.blocks_for(max(request.total_tokens, 1))
        allocation = self.kv.allocate(request.prompt_hashes, total_blocks, max_hit_blocks)
        if allocation is None:
            return False
        now = self.clock()
        request.allocation = allocation
        request.state = RequestState.RUNNING
        request.admitted_at = now
        request.cached_tokens = allocation.hit_blocks * self.profile.block_size
        uncached = prompt_len - request.cached_tokens
        request.prefill_s = self.profile.prefill_s(uncached) * self.slow_factor
        self.running[request] = None
        counters = self.counters
        counters.prefix_queries_tokens += prompt_len
        counters.prefix_hits_tokens += request.cached_tokens
        counters.prompt_tokens += prompt_len
        counters.histograms["vllm:request_queue_time_seconds"].observe(now - request.arrival)
        if request.on_admit is not None:
            request.on_admit()
        return True

    # -- timing ------------------------------------------------------------------------------------

    def itl_s(self) -> float:
        """Current per-token decode latency for every running sequence."""
        return self.profile.itl_for(len(self.running)) * self.slow_factor

    def first_token(self, request: GenRequest) -> None:
        now = self.clock()
        request.first_token_at = request.last_token_at = now
        request.generated = 1
        self.counters.generation_tokens += 1
        self.counters.histograms["vllm:time_to_first_token_seconds"].observe(now - request.arrival)

    def tokens(self, request: GenRequest, count: int) -> None:
        """`count` more tokens were produced since the last report (one stream chunk)."""
        now = self.clock()
        per_token = (now - request.last_token_at) / count
        request.last_token_at = now
        request.generated += count
        self.counters.generation_tokens += count
        self.counters.histograms["vllm:inter_token_latency_seconds"].observe(per_token, count)

    # -- completion --------------------------------------------------------------------------------

    def finish(self, request: GenRequest, reason: str) -> None:
        """The request produced all its tokens; its full blocks stay cached for later prefixes."""
        if request.state is not RequestState.RUNNING or request.allocation is None:
            raise ValueError(f"request {request.request_id} is not running")
        block_size = self.profile.block_size
        filled: list[int] = []
        prompt_blocks = len(request.prompt_hashes)
        done = len(request.prompt_ids) + request.generated
        if done // block_size > prompt_blocks:
            sequence = request.prompt_ids + request.output_ids[: request.generated]
            tail = sequence[prompt_blocks * block_size : (done // block_size) * block_size]
            parent = request.prompt_hashes[-1] if request.prompt_hashes else 0
            filled = block_hashes(tail, block_size, request.salt, parent=parent)
        self.kv.release(request.allocation, filled)
        self._close(request, reason)
        now = self.clock()
        hists = self.counters.histograms
        hists["vllm:e2e_request_latency_seconds"].observe(now - request.arrival)
        if request.generated > 1:
            tpot = (request.last_token_at - request.first_token_at) / (request.generated - 1)
            hists["vllm:time_per_output_token_seconds"].observe(tpot)
        self._schedule()

    def abort(self, request: GenRequest) -> None:
        """Client went away or the stream was cut: free everything, cache nothing new."""
        if request.state is RequestState.WAITING:
            with contextlib.suppress(ValueError):
                self.waiting.remove(request)
        elif request.state is RequestState.RUNNING and request.allocation is not None:
            self.kv.release(request.allocation)
        else:
            return
        self._close(request, "abort")
        self._schedule()

    def _close(self, request: GenRequest, reason: str) -> None:
        self.running.pop(request, None)
        request.state = RequestState.FINISHED
        request.allocation = None
        self.counters.finished[reason] = self.counters.finished.get(reason, 0) + 1

    # -- state -------------------------------------------------------------------------------------

    def reset(self) -> None:
        """Clear the prefix cache (blocks in use stay) and every counter."""
        self.kv.reset()
        self.counters = Counters()

    def gauges(self, timestamp: float) -> Gauges:
        running_loras = tuple(sorted(self._running_loras()))
        waiting_loras = tuple(sorted({r.lora for r in self.waiting if r.lora}))
        return Gauges(
            running=len(self.running), waiting=len(self.waiting), kv_usage=self.kv.usage,
            running_loras=running_loras, waiting_loras=waiting_loras, max_loras=self.profile.max_loras,
            block_size=self.profile.block_size, num_gpu_blocks=self.profile.num_gpu_blocks,
            timestamp=timestamp,
        )

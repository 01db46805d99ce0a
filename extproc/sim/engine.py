"""The scheduler of one replica, sans-IO, stepping like vLLM v1's (vllm/v1/core/sched/scheduler.py).

The engine never sleeps and reads no clock of its own: the caller (`driver.EngineLoop`, or a test with a
virtual clock) calls `begin_step(now)`, waits the step's `duration_s`, then calls `end_step(now)`. Requests
submitted meanwhile wait in an inbox until the next step boundary. One step:

1. running requests first, in admission order: one token each when decoding, the next prefill chunk
   (at most `max_num_batched_tokens` less what is already scheduled) when still prefilling; a request whose
   new KV blocks do not fit preempts the newest running request (its blocks are freed, it goes back to the
   head of the queue and recomputes later), itself last;
2. then, if nothing was preempted, waiting requests in FIFO order while the step has token budget and a
   free seat (`max_num_seqs`): each gets its cached prefix plus a first prefill chunk; the first one whose
   blocks do not fit stops admission; one whose LoRA adapter cannot join the batch (`max_loras`) is skipped.

`end_step` advances every scheduled request by its tokens; a request whose known tokens are all computed
samples its next token (the first one ends its prefill), and finishes when it has all of them. Gauges are
what vLLM's scheduler reports after each step: requests running and waiting then (not the inbox), KV use.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from extproc.sim.kvcache import BlockTable, KVCache
from extproc.sim.metrics import Counters, Gauges
from extproc.sim.profile import Profile
from extproc.sim.tokens import block_hashes

__all__ = ["Engine", "GenRequest", "RequestState", "Step"]


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
    # Called after the first token, then every `notify_every` tokens, and when the request finishes
    # (notify_every 0: only when it finishes).
    on_progress: Callable[[GenRequest], None] | None = None
    notify_every: int = 1
    state: RequestState = RequestState.WAITING
    prompt_hashes: list[int] = field(default_factory=list)
    arrival: float = 0.0
    scheduled_at: float | None = None  # first step that scheduled it
    first_token_at: float = 0.0
    last_token_at: float = 0.0
    computed: int = 0  # tokens whose KV is computed (vLLM's num_computed_tokens)
    generated: int = 0
    notified: int = 0
    cached_tokens: int = 0  # prefix-cache hit at its first admission
    preemptions: int = 0
    table: BlockTable = field(default_factory=BlockTable)

    @property
    def salt(self) -> str:
        return self.lora or ""

    @property
    def total_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_tokens(self) -> int:
        """Tokens known so far (prompt + generated): all must be computed before the next one is sampled."""
        return len(self.prompt_ids) + self.generated


@dataclass(frozen=True, slots=True)
class Step:
    """What one step computes: (request, new tokens) pairs, and how long it takes."""

    scheduled: tuple[tuple[GenRequest, int], ...]
    prefill_tokens: int
    duration_s: float


class Engine:
    def __init__(self, profile: Profile, clock: Callable[[], float]) -> None:
        self.profile = profile
        self.clock = clock
        self.kv = KVCache(profile.num_gpu_blocks, profile.block_size)
        self.inbox: list[GenRequest] = []
        self.waiting: deque[GenRequest] = deque()
        self.running: list[GenRequest] = []
        self.counters = Counters()
        self.slow_factor = 1.0  # set by the slow fault; multiplies every step's duration
        self.steps = 0
        self._reported = (0, 0, 0.0)  # running, waiting, KV use after the last step

    @property
    def has_work(self) -> bool:
        return bool(self.inbox or self.waiting or self.running)

    # -- arrivals ----------------------------------------------------------------------------------

    def submit(self, request: GenRequest) -> None:
        """Queue a request for the next step boundary."""
        if request.total_tokens > self.profile.max_model_len:
            raise ValueError("request longer than max_model_len")
        request.arrival = self.clock()
        request.prompt_hashes = block_hashes(request.prompt_ids, self.profile.block_size, request.salt)
        request.state = RequestState.WAITING
        self.counters.requests += 1
        self.inbox.append(request)

    def abort(self, request: GenRequest) -> None:
        """Client went away or the stream was cut: free everything, cache nothing new."""
        if request.state is RequestState.WAITING:
            if request in self.inbox:
                self.inbox.remove(request)
            elif request in self.waiting:
                self.waiting.remove(request)
        elif request.state is RequestState.RUNNING:
            self.kv.release(request.table)
            self.running.remove(request)
        else:
            return
        self._close(request, "abort")

    # -- one step ----------------------------------------------------------------------------------

    def begin_step(self, now: float) -> Step | None:
        """Schedule the next step at `now`; None when there is nothing to compute."""
        if self.inbox:
            self.waiting.extend(self.inbox)
            self.inbox.clear()
        budget = self.profile.max_num_batched_tokens
        scheduled: list[tuple[GenRequest, int]] = []
        preempted = self._schedule_running(scheduled, budget)
        budget -= sum(n for _, n in scheduled)
        if not preempted and budget > 0:
            self._schedule_waiting(scheduled, budget, now)
        if not scheduled:
            return None
        prefill = sum(n for r, n in scheduled if r.generated == 0 or r.computed + 1 < r.num_tokens)
        return Step(tuple(scheduled), prefill, self.profile.step_s(len(scheduled), prefill) * self.slow_factor)

    def _schedule_running(self, scheduled: list[tuple[GenRequest, int]], budget: int) -> bool:
        chunk = self.profile.chunk_limit()
        preempted = False
        index = 0
        running = self.running
        while index < len(running) and budget > 0:
            request = running[index]
            count = min(request.num_tokens - request.computed, chunk, budget)
            # Decoding needs a new block only every block_size tokens: most steps allocate nothing.
            while (request.table.size * self.profile.block_size < request.computed + count
                   and not self.kv.grow(request.table, self._new_blocks(request, request.computed + count))):
                victim = running.pop()  # the newest request gives its blocks back
                self._preempt(victim)
                preempted = True
                if victim is request:
                    return True
            scheduled.append((request, count))
            budget -= count
            index += 1
        return preempted

    def _schedule_waiting(self, scheduled: list[tuple[GenRequest, int]], budget: int, now: float) -> None:
        profile = self.profile
        chunk = profile.chunk_limit()
        loras = {r.lora for r in self.running if r.lora}
        skipped: list[GenRequest] = []
        waiting = self.waiting
        while waiting and budget > 0 and len(self.running) < profile.max_num_seqs:
            request = waiting[0]
            if request.lora and request.lora not in loras and len(loras) >= profile.max_loras:
                skipped.append(waiting.popleft())
                continue
            # At least the last known token is always computed, so a fully cached prompt recomputes its
            # last block.
            max_hit = min((request.num_tokens - 1) // profile.block_size, len(request.prompt_hashes))
            hit = self.kv.cached_prefix(request.prompt_hashes[:max_hit])
            computed = hit * profile.block_size
            count = min(request.num_tokens - computed, chunk, budget)
            blocks = [*request.prompt_hashes[:hit], *self._new_blocks(request, computed + count, hit)]
            if not self.kv.grow(request.table, blocks):
                break
            waiting.popleft()
            self.running.append(request)
            request.state = RequestState.RUNNING
            request.computed = computed
            if request.scheduled_at is None:
                self._first_admission(request, computed, now)
            if request.lora:
                loras.add(request.lora)
            scheduled.append((request, count))
            budget -= count
        waiting.extendleft(reversed(skipped))

    def _new_blocks(self, request: GenRequest, upto: int, held: int | None = None) -> list[int | None]:
        """Blocks `request` needs beyond those it holds to keep `upto` tokens: full prompt blocks hashed."""
        have = request.table.size if held is None else held
        target = self.kv.blocks_for(upto)
        hashes = request.prompt_hashes
        return [hashes[i] if i < len(hashes) else None for i in range(have, target)]

    def _first_admission(self, request: GenRequest, computed: int, now: float) -> None:
        request.scheduled_at = now
        request.cached_tokens = computed
        counters = self.counters
        prompt_len = len(request.prompt_ids)
        counters.prefix_queries_tokens += prompt_len
        counters.prefix_hits_tokens += computed
        counters.prompt_tokens += prompt_len
        counters.histograms["vllm:request_queue_time_seconds"].observe(max(0.0, now - request.arrival))

    def _preempt(self, request: GenRequest) -> None:
        self.kv.release(request.table)
        request.state = RequestState.WAITING
        request.computed = 0
        request.preemptions += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(request)

    def end_step(self, step: Step, now: float) -> None:
        """The step's computation is done at `now`: advance its requests, sample tokens, finish some."""
        decoded = sampled = 0
        hists = self.counters.histograms
        for request, count in step.scheduled:
            if request.state is not RequestState.RUNNING:
                continue  # aborted while the step ran
            request.computed += count
            if request.computed < request.num_tokens:
                continue  # a prefill chunk; more to come
            if not request.output_ids:  # a pooling (embedding) request ends with its prefill
                self._finish(request, "stop", now)
                continue
            request.generated += 1
            sampled += 1
            if request.generated == 1:
                request.first_token_at = now
                hists["vllm:time_to_first_token_seconds"].observe(now - request.arrival)
            else:
                decoded += 1
            request.last_token_at = now
            if request.generated >= len(request.output_ids):
                self._finish(request, request.finish_reason, now)
            elif request.notify_every and (request.generated == 1
                                           or request.generated - request.notified >= request.notify_every):
                self._notify(request)
        self.counters.generation_tokens += sampled
        if decoded:
            hists["vllm:inter_token_latency_seconds"].observe(step.duration_s, decoded)
        hists["vllm:iteration_tokens_total"].observe(sum(n for _, n in step.scheduled))
        self.steps += 1
        self._reported = (len(self.running), len(self.waiting), self.kv.usage)

    def _notify(self, request: GenRequest) -> None:
        request.notified = request.generated
        if request.on_progress is not None:
            request.on_progress(request)

    def _finish(self, request: GenRequest, reason: str, now: float) -> None:
        """All tokens produced: its full blocks stay cached for later prefixes (generated ones too)."""
        block_size = self.profile.block_size
        prompt_blocks = len(request.prompt_hashes)
        done = len(request.prompt_ids) + request.generated
        filled: list[int] = []
        if done // block_size > prompt_blocks:
            sequence = request.prompt_ids + request.output_ids[: request.generated]
            tail = sequence[prompt_blocks * block_size : (done // block_size) * block_size]
            parent = request.prompt_hashes[-1] if request.prompt_hashes else 0
            filled = block_hashes(tail, block_size, request.salt, parent=parent)[: request.table.anonymous]
        self.kv.release(request.table, filled)
        self.running.remove(request)
        hists = self.counters.histograms
        hists["vllm:e2e_request_latency_seconds"].observe(now - request.arrival)
        if request.generated > 1:
            tpot = (request.last_token_at - request.first_token_at) / (request.generated - 1)
            hists["vllm:time_per_output_token_seconds"].observe(tpot)
        self._close(request, reason)
        self._notify(request)

    def _close(self, request: GenRequest, reason: str) -> None:
        request.state = RequestState.FINISHED
        self.counters.finished[reason] = self.counters.finished.get(reason, 0) + 1

    # -- state -------------------------------------------------------------------------------------

    def requests_present(self) -> int:
        """Requests the engine holds now, inbox included (the true load, not what /metrics reported)."""
        return len(self.inbox) + len(self.waiting) + len(self.running)

    def reset(self) -> None:
        """Clear the prefix cache (blocks in use stay) and every counter."""
        self.kv.reset()
        self.counters = Counters()

    def gauges(self, timestamp: float) -> Gauges:
        """What vLLM's /metrics shows: the scheduler's counts after the last step."""
        running, waiting, kv_usage = self._reported
        running_loras = tuple(sorted({r.lora for r in self.running if r.lora}))
        waiting_loras = tuple(sorted({r.lora for r in (*self.waiting, *self.inbox) if r.lora}))
        return Gauges(
            running=running, waiting=waiting, kv_usage=kv_usage,
            running_loras=running_loras, waiting_loras=waiting_loras, max_loras=self.profile.max_loras,
            block_size=self.profile.block_size, num_gpu_blocks=self.profile.num_gpu_blocks,
            timestamp=timestamp,
        )

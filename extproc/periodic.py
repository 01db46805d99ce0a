"""`Periodic`: the one way the service runs work in the background every so often.

Every periodic loop of the service is one of these: the policy and keys file watches, the rollouts refresh, the
replicas' exchanges through Redis (fleet in-flight counts, prompt calibration), DNS discovery and the metrics
scraper's rounds. They share:

- `start()` (idempotent) / `stop()` (cancels and waits for the task to unwind);
- the interval: seconds, or a getter read before every wait (to follow the current policy);
- when the first round runs: at once (`immediate`), or one interval after `start`;
- the pace: a fixed delay between rounds (the default), or a fixed rate (`fixed_rate`: rounds stay on their
  schedule, and rounds missed while the event loop was blocked are skipped, never run back to back);
- failures: a round that raises is counted and logged once per state change (the first failure, a different
  failure, the recovery: `FailureLog`), and the loop goes on. Exceptions listed in `expected` (a store that is
  down) are logged as warnings with their message; anything else as an error with its traceback.

`sleep` and `clock` are injected, so unit tests run a loop one round at a time with no real time passing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from extproc.aio import Sleep, cancel_and_wait

__all__ = ["FailureLog", "Periodic"]


class FailureLog:
    """Logs an activity that fails once per state change: the first failure, a failure with a different reason,
    the recovery. Every failure is counted in `failures_total`."""

    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what = what
        self._log = log
        self.reason: str | None = None  # the failure now in effect, None while it works
        self.failures_total = 0

    @property
    def failing(self) -> bool:
        return self.reason is not None

    def failed(self, reason: str, exc: BaseException | None = None) -> bool:
        """Count one failure; log it unless the same reason is already in effect: a warning with the reason, or,
        given the unexpected exception `exc`, an error with its traceback. Returns whether it was logged."""
        self.failures_total += 1
        if reason == self.reason:
            return False
        self.reason = reason
        if exc is None:
            self._log.warning("%s failing: %s", self.what, reason)
        else:
            self._log.error("%s failed", self.what, exc_info=exc)
        return True

    def recovered(self) -> bool:
        """The activity works (again); logs the recovery if it was failing. Returns whether it was."""
        if self.reason is None:
            return False
        self.reason = None
        self._log.info("%s recovered", self.what)
        return True


class Periodic:
    """Runs `work` in a background task named `name` every `interval_s` (see the module docstring)."""

    def __init__(self, name: str, work: Callable[[], Awaitable[object]], interval_s: float | Callable[[], float],
                 *, log: logging.Logger, what: str | None = None, immediate: bool = False, fixed_rate: bool = False,
                 expected: tuple[type[Exception], ...] = (), sleep: Sleep = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`what` names the work in log lines (default: `name`, the task's name)."""
        self.name = name
        self._work = work
        self._interval = interval_s if callable(interval_s) else (lambda: interval_s)
        self._immediate = immediate
        self._fixed_rate = fixed_rate
        self._expected = expected
        self._sleep = sleep
        self._clock = clock
        self.failures = FailureLog(what or name, log)
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the loop (a no-op while it runs); needs a running event loop."""
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=self.name)

    def cancel(self) -> None:
        """Stop the loop without waiting for it to unwind (`stop` waits)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def run_once(self, work: Callable[[], Awaitable[object]] | None = None) -> bool:
        """One round of `work` (default: the loop's own) with the loop's failure handling; True if it worked."""
        try:
            await (work or self._work)()
        except self._expected as exc:
            self.failures.failed(str(exc) or type(exc).__name__)
            return False
        except Exception as exc:  # never let the loop die of a bug: log it, retry next round
            self.failures.failed(f"{type(exc).__name__}: {exc}", exc)
            return False
        self.failures.recovered()
        return True

    async def _loop(self) -> None:
        due = self._clock()
        if not self._immediate:
            due = await self._wait(due)
        while True:
            await self.run_once()
            due = await self._wait(due)

    async def _wait(self, due: float) -> float:
        """Sleep until the next round; returns when it is due (by `clock`)."""
        interval = self._interval()
        if not self._fixed_rate:
            await self._sleep(interval)
            return self._clock()
        due += interval
        now = self._clock()
        if due < now:  # the event loop was blocked past the round: skip the missed ones, no burst
            due = now
        await self._sleep(due - now)
        return due

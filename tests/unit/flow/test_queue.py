from __future__ import annotations

from extproc.flow.queue import FairQueue, Waiter


def waiter(tenant: str, klass: str = "std", priority: int = 50, tokens: int = 100, at: float = 0.0,
           weight: float = 1.0) -> Waiter:
    return Waiter(tenant, klass, priority, weight, tokens, at, at + 60.0)


def drain(queue: FairQueue, now: float = 0.0) -> list[Waiter]:
    out = []
    while (item := queue.pop(now)) is not None:
        out.append(item)
    return out


def test_strict_priority_between_classes() -> None:
    queue = FairQueue()
    low = waiter("a", "shed", priority=0, at=0.0)
    high = waiter("b", "crit", priority=100, at=1.0)
    queue.push(low)
    queue.push(high)
    assert drain(queue, now=1.0) == [high, low]


def test_aging_lets_an_old_low_priority_request_overtake() -> None:
    queue = FairQueue(aging_per_s=10.0)
    old = waiter("a", "std", priority=50, at=0.0)
    fresh = waiter("b", "crit", priority=100, at=6.0)
    queue.push(old)
    queue.push(fresh)
    # At t=6 the old one has 50 + 60 = 110 points > 100.
    assert queue.pop(6.0) is old
    queue.push(old2 := waiter("a", "std", priority=50, at=6.0))
    assert queue.pop(6.0) is fresh
    assert queue.pop(6.0) is old2


def test_fair_share_by_tokens_within_a_class() -> None:
    queue = FairQueue()
    # The heavy tenant queued 30 requests first; the light one 3 afterwards.
    for i in range(30):
        queue.push(waiter("heavy", at=i * 0.001))
    for i in range(3):
        queue.push(waiter("light", at=1.0 + i))
    order = [w.tenant for w in drain(queue, now=5.0)]
    # The light tenant is served within the first six, alternating, despite arriving last.
    assert order[:6].count("light") == 3
    assert len(order) == 33


def test_weights_and_token_sizes_shape_the_share() -> None:
    queue = FairQueue()
    for i in range(40):
        queue.push(waiter("big", tokens=400, at=i * 0.001))
        queue.push(waiter("small", tokens=100, at=i * 0.001))
        queue.push(waiter("gold", tokens=100, weight=2.0, at=i * 0.001))
    first = [queue.pop(1.0) for _ in range(30)]
    served: dict[str, int] = {}
    for item in first:
        assert item is not None
        served[item.tenant] = served.get(item.tenant, 0) + item.tokens
    # Equal tokens for the two weight-1 tenants (within one request), twice that for weight 2.
    assert abs(served["big"] - served["small"]) <= 400
    assert served["gold"] >= 1.6 * served["small"]


def test_returning_tenant_gets_no_saved_credit() -> None:
    queue = FairQueue()
    for i in range(5):
        queue.push(waiter("a", at=i * 0.01))
    for _ in range(4):
        queue.pop(1.0)
    # "a" still has one queued; "b" joins now and starts level with "a" (400 tokens), not at zero,
    # so the tie goes to the older request and "b" does not get four requests in a row.
    queue.push(waiter("b", at=2.0))
    queue.push(waiter("b", at=2.1))
    assert [w.tenant for w in drain(queue, now=3.0)] == ["a", "b", "b"]


def test_remove_and_lowest() -> None:
    queue = FairQueue()
    a = waiter("a", "crit", priority=100)
    b = waiter("b", "shed", priority=0, at=1.0)
    c = waiter("c", "shed", priority=0, at=2.0)
    for item in (a, b, c):
        queue.push(item)
    assert queue.lowest() in (b, c)
    assert queue.remove(b) and not queue.remove(b)
    assert len(queue) == 2 and queue.queued("shed") == 1
    assert queue.lowest() is c
    assert drain(queue, now=3.0) == [a, c]
    assert len(queue) == 0 and queue.lowest() is None


def test_oldest_is_the_enqueue_time_of_the_longest_queued_request_of_a_class_or_of_any() -> None:
    queue: FairQueue[Waiter] = FairQueue()
    assert queue.oldest() is None and queue.oldest("a") is None
    first, second = Waiter("t", "a", 1, 1.0, 1, 5.0, 9.0), Waiter("u", "b", 2, 1.0, 1, 3.0, 9.0)
    queue.push(first)
    queue.push(second)
    queue.push(Waiter("t", "a", 1, 1.0, 1, 7.0, 9.0))
    assert queue.oldest() == 3.0 and queue.oldest("a") == 5.0 and queue.oldest("c") is None
    queue.remove(second)
    assert queue.oldest() == 5.0 and queue.oldest("b") is None

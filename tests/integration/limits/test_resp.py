"""The lean RESP client against a real redis-server: pipelining order, abandoned calls, NOSCRIPT,
posted calls and their failures, SELECT, reconnects and a stalled server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from redis.asyncio import Redis

from extproc.limits import StoreUnavailable
from extproc.limits.resp import Address, RespClient, Script
from tests.integration.limits.redis_server import RedisServer
from tests.support import block_event_loop, eventually

pytestmark = pytest.mark.integration

ECHO = Script("return {KEYS[1], ARGV[1]}")


def client(url: str, timeout_s: float = 2.0, stale_after_s: float | None = None,
           failures: list[tuple[str, str]] | None = None) -> RespClient:
    def failed(op: str, reason: str) -> None:
        if failures is not None:
            failures.append((op, reason))

    return RespClient(Address.from_url(url), timeout_s=timeout_s, scripts=(ECHO,), stale_after_s=stale_after_s,
                      on_posted_failure=failed)


@pytest.fixture
async def resp(redis_server: RedisServer) -> AsyncIterator[RespClient]:
    made = client(redis_server.url)
    try:
        yield made
    finally:
        await made.close()


def test_urls() -> None:
    plain = Address.from_url("redis://u%40x:p%3Aw@example:7000/3")
    assert (plain.host, plain.port, plain.username, plain.password, plain.db, plain.tls) == (
        "example", 7000, "u@x", "p:w", 3, None)
    assert plain.handshake() == [("AUTH", "u@x", "p:w"), ("SELECT", 3)]
    assert Address.from_url("redis://:pw@h").handshake() == [("AUTH", "pw")]
    assert Address.from_url("redis://h").handshake() == []
    assert Address.from_url("rediss://h").tls is not None
    for bad in ("http://h", "redis://h/zero"):
        with pytest.raises(ValueError):
            Address.from_url(bad)


def test_under_uvloop(redis_server: RedisServer) -> None:
    """The service runs on uvloop, whose transports differ from asyncio's."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> list[object]:
        resp = client(redis_server.url)
        try:
            await resp.post("set", "SET", "uv:k", "1")
            return [await resp.call("GET", "uv:k"), await resp.evalsha(ECHO, ["k"], ["v"]),
                    await reply_after_a_stalled_loop(resp), resp.posted_failures]
        finally:
            await resp.close()

    assert uvloop.run(scenario()) == [b"1", [b"k", b"v"], [b"k", b"late"], {}]


async def one_loop_turn() -> None:
    """Let a task just created run to its first wait: it sends its command, then awaits the reply."""
    await asyncio.sleep(0)  # one turn of the event loop, no time: the task's first step runs


async def reply_after_a_stalled_loop(resp: RespClient) -> object:
    """A call whose deadline passes while the whole process is blocked (descheduled, a long callback):
    its reply, there by then, is read before the deadline is looked at."""
    await resp.call("PING")
    task = asyncio.create_task(resp.evalsha(ECHO, ["k"], ["late"], timeout_s=0.005))
    await one_loop_turn()
    block_event_loop(0.05)  # the fault under test
    return await task


async def test_a_reply_that_arrived_while_the_loop_was_blocked_counts(resp: RespClient) -> None:
    assert await reply_after_a_stalled_loop(resp) == [b"k", b"late"]


async def test_pipelined_replies_reach_their_callers(resp: RespClient) -> None:
    replies = await asyncio.gather(*(resp.call("ECHO", str(i)) for i in range(500)))
    assert replies == [str(i).encode() for i in range(500)]
    assert await resp.evalsha(ECHO, ["k"], [7]) == [b"k", b"7"]
    with pytest.raises(StoreUnavailable, match=r"ERR"):
        await resp.call("INCRBY", "not-a-number-key", "x")


async def test_a_caller_that_gives_up_does_not_shift_the_replies(redis_server: RedisServer, resp: RespClient) -> None:
    staller = Redis.from_url(redis_server.url)
    try:
        stall = asyncio.create_task(staller.execute_command("DEBUG", "SLEEP", "0.3"))  # type: ignore[no-untyped-call]
        await eventually(redis_server.asleep, "the server in DEBUG SLEEP")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.02):
                await resp.call("ECHO", "abandoned")
        cancelled = asyncio.create_task(resp.call("ECHO", "cancelled"))
        await one_loop_turn()
        cancelled.cancel()
        assert await resp.call("ECHO", "mine") == b"mine"
        await stall
    finally:
        await staller.aclose()


async def test_noscript_falls_back_to_eval_for_calls_and_posts(redis_server: RedisServer,
                                                               resp: RespClient) -> None:
    raw = Redis.from_url(redis_server.url)
    try:
        await resp.call("PING")
        await raw.script_flush()
        assert await resp.evalsha(ECHO, ["k"], ["v"]) == [b"k", b"v"]
        await raw.script_flush()
        await resp.post_evalsha("echo", ECHO, ["k"], ["v"])
        await resp.call("PING")
        await resp.call("PING")  # the EVAL retry was sent after the first PING
        assert resp.posted_failures == {}
    finally:
        await raw.aclose()


async def test_a_batch_is_one_write_and_each_call_gets_its_reply_or_its_error(resp: RespClient) -> None:
    unloaded = Script("return {ARGV[1], 'unloaded'}")  # neither loaded on connect: NOSCRIPT, then EVAL
    failing = Script("return redis.error_reply('ERR refused')")
    await resp.call("PING")
    conn = resp._conn
    assert conn is not None and conn._transport is not None
    transport, writes = conn._transport, list[bytes]()
    write = transport.write

    def counted(data: bytes | bytearray | memoryview) -> None:  # a spy on the socket's writes
        writes.append(bytes(data))
        write(data)

    transport.write = counted  # type: ignore[method-assign]
    replies = await resp.evalsha_batch([(ECHO, ["a"], [1]), (failing, ["b"], []), (ECHO, ["c"], [3]),
                                        (unloaded, ["d"], ["x"])])
    assert replies[0] == [b"a", b"1"] and replies[2] == [b"c", b"3"] and replies[3] == [b"x", b"unloaded"]
    assert isinstance(replies[1], StoreUnavailable) and "refused" in str(replies[1])
    # The batch in one write, then an EVAL for each script the server did not have.
    assert len(writes) == 3 and writes[0].count(b"EVALSHA") == 4 and all(b"EVAL\r\n" in w for w in writes[1:])
    assert await resp.evalsha(ECHO, ["k"], ["v"]) == [b"k", b"v"]  # the connection's FIFO is in step


async def test_a_batch_without_a_server_fails_every_call(servers: Callable[..., RedisServer]) -> None:
    server = servers()
    alone = client(server.url, timeout_s=0.3)
    try:
        assert await alone.evalsha_batch([(ECHO, ["a"], [1])]) == [[b"a", b"1"]]
        server.kill()
        for _ in range(2):  # the connection lost under the batch, then none to send on
            failed = await alone.evalsha_batch([(ECHO, ["a"], [1]), (ECHO, ["b"], [2])])
            assert len(failed) == 2 and all(isinstance(reply, StoreUnavailable) for reply in failed)
    finally:
        await alone.close()


async def test_posted_calls_keep_order_and_count_failures(redis_server: RedisServer) -> None:
    seen: list[tuple[str, str]] = []
    resp = client(redis_server.url, failures=seen)
    try:
        await resp.post("set", "SET", "posted:k", "1")
        await resp.post("incr", "INCRBY", "posted:k", "2")
        await resp.post("bad", "INCRBY", "posted:k", "not-a-number")
        assert await resp.call("GET", "posted:k") == b"3"
        assert resp.posted_failures == {"bad": 1} and seen[0][0] == "bad" and "ERR" in seen[0][1]
    finally:
        await resp.close()


async def test_select_and_auth_on_connect(servers: Callable[..., RedisServer]) -> None:
    server = servers("--requirepass", "pw")
    db3 = client(f"redis://:pw@127.0.0.1:{server.port}/3")
    raw = Redis.from_url(f"redis://:pw@127.0.0.1:{server.port}/3")
    try:
        await db3.call("SET", "in-db-3", "yes")
        assert await raw.get("in-db-3") == b"yes"
    finally:
        await db3.close()
        await raw.aclose()


async def test_a_lost_connection_fails_pending_calls_and_the_next_call_reconnects(
        servers: Callable[..., RedisServer]) -> None:
    server = servers()
    failures: list[tuple[str, str]] = []
    resp = client(server.url, timeout_s=1.0, failures=failures)
    try:
        await resp.call("PING")
        staller = Redis.from_url(server.url)
        stall = asyncio.create_task(staller.execute_command("DEBUG", "SLEEP", "2"))  # type: ignore[no-untyped-call]
        await eventually(server.asleep, "the server in DEBUG SLEEP")
        pending = asyncio.create_task(resp.call("ECHO", "lost"))
        await resp.post("release", "ZREM", "k", "m")  # pending from now on: the kill fails it, written or not
        server.kill()
        with pytest.raises(StoreUnavailable, match="connection lost"):
            await pending
        assert [op for op, _ in failures] == ["release"]
        with pytest.raises(StoreUnavailable):  # refused, then a short backoff
            await resp.call("PING")
        with pytest.raises(StoreUnavailable, match="backoff"):
            await resp.call("PING")
        stall.cancel()
        await asyncio.gather(stall, return_exceptions=True)
        await staller.aclose()
        server.start()

        async def reconnected() -> bool:  # after the backoff (at most 0.5 s), the next call connects
            try:
                return bool(await resp.call("PING") == b"PONG")
            except StoreUnavailable:
                return False

        await eventually(reconnected, "a PING on a new connection")
        assert await resp.evalsha(ECHO, ["k"], ["v"]) == [b"k", b"v"]  # scripts loaded again on connect
    finally:
        await resp.close()


async def test_a_stalled_connection_is_dropped_when_a_caller_gives_up(redis_server: RedisServer) -> None:
    failures: list[tuple[str, str]] = []
    resp = client(redis_server.url, timeout_s=0.05, stale_after_s=0.15, failures=failures)
    staller = Redis.from_url(redis_server.url)
    try:
        await resp.call("PING")
        stall = asyncio.create_task(staller.execute_command("DEBUG", "SLEEP", "0.6"))  # type: ignore[no-untyped-call]
        await eventually(redis_server.asleep, "the server in DEBUG SLEEP")
        await resp.post("posted", "ECHO", "x")
        with pytest.raises(StoreUnavailable, match="no reply within"):
            await resp.call("ECHO", "first")  # waited 50 ms: not stale yet, the connection stays
        assert failures == []
        await asyncio.sleep(0.15)  # the behaviour: staleness is time without a reply (stale_after_s 0.15)
        with pytest.raises(StoreUnavailable, match="no reply within"):
            await resp.call("ECHO", "second")  # no reply for > 150 ms when it gives up: dropped
        assert [op for op, _ in failures] == ["posted"] and "reconnecting" in failures[0][1]
        await stall
        assert await resp.call("ECHO", "after") == b"after"  # on a new connection
    finally:
        await resp.close()
        await staller.aclose()


async def test_a_posted_script_delivers_its_reply_or_its_failure(servers: Callable[..., RedisServer]) -> None:
    server = servers()
    replies: list[object] = []
    resp = client(server.url)
    raw = Redis.from_url(server.url)
    staller = Redis.from_url(server.url)

    def explode(reply: object) -> None:
        raise RuntimeError("a broken callback")

    try:
        await resp.post_evalsha("echo", ECHO, ["k"], ["v"], on_reply=replies.append)
        await resp.post_evalsha("echo", ECHO, ["x"], ["y"], on_reply=explode)  # logged, the FIFO goes on
        await resp.call("PING")
        await raw.script_flush()
        await resp.post_evalsha("echo", ECHO, ["k2"], ["v2"], on_reply=replies.append)  # NOSCRIPT, then EVAL
        await resp.call("PING")
        await resp.call("PING")
        assert replies == [[b"k", b"v"], [b"k2", b"v2"]]
        stall = asyncio.create_task(staller.execute_command("DEBUG", "SLEEP", "2"))  # type: ignore[no-untyped-call]
        await eventually(server.asleep, "the server in DEBUG SLEEP")
        await resp.post_evalsha("echo", ECHO, ["k3"], ["v3"], on_reply=replies.append)  # pending at once
        server.kill()
        await eventually(lambda: len(replies) == 3, "the posted script's failure delivered")
        assert isinstance(replies[2], StoreUnavailable) and resp.posted_failures == {"echo": 1}
        stall.cancel()
        await asyncio.gather(stall, return_exceptions=True)
    finally:
        await resp.close()
        await raw.aclose()
        await staller.aclose()

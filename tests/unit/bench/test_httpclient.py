"""The bench HTTP client's SSE scanner (pure; the client over real sockets: tests/integration/bench)."""

from __future__ import annotations

from extproc.bench.httpclient import SseScanner


def test_sse_scanner_handles_split_events_and_crlf() -> None:
    stream = (
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\r\n\r\n'
        b'data: {"choices":[{"delta":{"content": "Hel"}}]}\r\n\r\n'
        b": keep-alive comment\r\n\r\n"
        b'data: {"choices":[{"text":"lo"}]}\r\n\r\n'
        b'data: {"choices":[{"delta":{"reasoning_content":"hm","content":null}}]}\r\n\r\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )
    for step in (1, 7, len(stream)):
        scanner = SseScanner()
        for i, offset in enumerate(range(0, len(stream), step)):
            scanner.feed(stream[offset : offset + step], now_ns=1000 + i)
        assert scanner.chunks == 3, step
        assert (scanner.prompt_tokens, scanner.completion_tokens) == (5, 3)
    # Byte-by-byte feeding: TTFT is stamped by the feed that completes the first content event.
    assert scanner.first_content_ns is not None
    first_content_end = stream.index(b"\r\n\r\n", stream.index(b"Hel")) + 3
    scanner = SseScanner()
    for i in range(len(stream)):
        scanner.feed(stream[i : i + 1], now_ns=i)
    assert scanner.first_content_ns == first_content_end


def test_sse_scanner_ignores_null_usage() -> None:
    scanner = SseScanner()
    scanner.feed(b'data: {"choices":[{"delta":{"content":"a"}}],"usage": null}\n\n', now_ns=5)
    assert scanner.chunks == 1 and scanner.first_content_ns == 5
    assert scanner.completion_tokens is None


def test_sse_scanner_reads_anthropic_and_responses_streams() -> None:
    anthropic = (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","content":[],'
        b'"usage":{"input_tokens":9,"output_tokens":0}}}\n\n'
        b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
        b'"content_block":{"type":"text","text":""}}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"Hi"}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
        b'"usage":{"input_tokens":9,"output_tokens":4,"cache_read_input_tokens":6}}\n\n'
    )
    scanner = SseScanner()
    scanner.feed(anthropic, now_ns=1)
    assert scanner.chunks == 1 and (scanner.prompt_tokens, scanner.completion_tokens) == (9, 4)
    assert scanner.cached_tokens == 6
    responses = (
        b'event: response.created\ndata: {"type":"response.created","response":{"usage":null,"text":null}}\n\n'
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"Hi"}\n\n'
        b'event: response.completed\ndata: {"type":"response.completed","response":{"usage":'
        b'{"input_tokens":7,"input_tokens_details":{"cached_tokens":3},"output_tokens":2,"total_tokens":9}}}\n\n'
    )
    scanner = SseScanner()
    scanner.feed(responses, now_ns=1)
    assert scanner.chunks == 1 and (scanner.prompt_tokens, scanner.completion_tokens) == (7, 2)
    assert scanner.cached_tokens == 3
    chat = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":null}}\n\n'
    scanner = SseScanner()
    scanner.feed(chat, now_ns=1)
    assert scanner.prompt_tokens == 5 and scanner.cached_tokens is None  # the engine did not say

"""`extproc bench overhead`'s variants: which services and Envoys one run starts."""

from __future__ import annotations

import argparse
import json

from extproc.bench.overhead import _variants, configure
from extproc.bench.overhead_stack import request_spec


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(list(argv))


def test_service_env_adds_the_first_store_and_the_trivial_processor_with_that_environment() -> None:
    variants = _variants(parse("--store", "memory,redis", "--service-env", "GRPC_POLL_STRATEGY=poll,A=b"))
    assert not isinstance(variants, str)
    env = (("GRPC_POLL_STRATEGY", "poll"), ("A", "b"))
    by_name = {variant[0]: variant for variant in variants}
    assert list(by_name) == ["with_extproc[memory]", "with_extproc[redis]",
                             "with_extproc[memory]{GRPC_POLL_STRATEGY=poll,A=b}", "trivial",
                             "trivial{GRPC_POLL_STRATEGY=poll,A=b}"]
    assert by_name["with_extproc[memory]{GRPC_POLL_STRATEGY=poll,A=b}"][1:] == ("memory", 1, None, "", env, "lean")
    assert by_name["trivial{GRPC_POLL_STRATEGY=poll,A=b}"][5] == env
    assert by_name["with_extproc[memory]"][5] == () and by_name["trivial"][5] == ()


def test_service_env_without_a_value_is_refused() -> None:
    for bad in ("GRPC_POLL_STRATEGY", "=poll", "A=b,"):
        message = _variants(parse("--service-env", bad))
        assert isinstance(message, str) and "--service-env" in message


def test_a_second_front_end_runs_every_store_and_workers_variant_again() -> None:
    variants = _variants(parse("--store", "redis", "--workers", "1,2", "--front-ends", "lean,grpcio"))
    assert not isinstance(variants, str)
    assert [(v[0], v[1], v[2], v[6]) for v in variants] == [
        ("with_extproc[redis]", "redis", 1, "lean"), ("with_extproc[redis]x2", "redis", 2, "lean"),
        ("with_extproc[redis]{grpcio}", "redis", 1, "grpcio"), ("with_extproc[redis]x2{grpcio}", "redis", 2, "grpcio"),
        ("trivial", "trivial", 1, "lean")]
    for bad in ("", "lean,lean", "h2"):
        message = _variants(parse("--front-ends", bad))
        assert isinstance(message, str) and "--front-ends" in message


def test_a_system_prompt_is_shared_and_the_prompt_numbered_per_request() -> None:
    args = parse("--prompt-chars", "300", "--system-chars", "5000")
    spec = request_spec(args.prompt_chars, args.system_chars)
    first, second = (json.loads(spec(index).body)["messages"] for index in (1, 2))
    assert first[0] == second[0] and first[0]["role"] == "system" and len(first[0]["content"]) == 5000
    assert first[1]["content"] != second[1]["content"] and first[1]["content"].startswith("1: ")
    assert spec(1).body == spec(1).body and len(json.loads(request_spec(0)(3).body)["messages"]) == 1

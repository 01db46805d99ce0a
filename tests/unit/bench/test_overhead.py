"""`extproc bench overhead`'s variants: which services and Envoys one run starts."""

from __future__ import annotations

import argparse

from extproc.bench.overhead import _variants, configure


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
    assert by_name["with_extproc[memory]{GRPC_POLL_STRATEGY=poll,A=b}"][1:] == ("memory", 1, None, "", env)
    assert by_name["trivial{GRPC_POLL_STRATEGY=poll,A=b}"][5] == env
    assert by_name["with_extproc[memory]"][5] == () and by_name["trivial"][5] == ()


def test_service_env_without_a_value_is_refused() -> None:
    for bad in ("GRPC_POLL_STRATEGY", "=poll", "A=b,"):
        message = _variants(parse("--service-env", bad))
        assert isinstance(message, str) and "--service-env" in message

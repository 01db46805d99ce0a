from __future__ import annotations

import argparse

import pytest

from extproc.sim.cli import UsageError, build_specs, configure, parse_ports, run
from extproc.sim.profile import BUILTIN_PROFILES


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(list(argv))


def test_port_specs() -> None:
    assert parse_ports("8001-8003") == [8001, 8002, 8003]
    assert parse_ports("8001,8005") == [8001, 8005]
    assert parse_ports("8001-8002,9000") == [8001, 8002, 9000]
    for bad in ("80x", "9-1", "0", "70000", ""):
        with pytest.raises(UsageError):
            parse_ports(bad)


def test_pool_model_may_contain_slash_colon_and_equals() -> None:
    args = parse("--pool", "org/llama:8b=v2=9001-9002", "--lora", "org/llama:8b=v2=sql,chat",
                 "--stream-chunk-tokens", "4", "--seed", "3", "--error-rate", "0.1")
    specs = build_specs(args, BUILTIN_PROFILES["fast"])
    assert [(s.model, s.port) for s in specs] == [("org/llama:8b=v2", 9001), ("org/llama:8b=v2", 9002)]
    assert specs[0].lora_adapters == ("sql", "chat")
    assert specs[0].stream_chunk_tokens == 4 and specs[0].seed == 3 and specs[0].faults.error_rate == 0.1
    assert specs[0].host == "127.0.0.1"


@pytest.mark.parametrize("argv", [
    (),
    ("--pool", "m"),
    ("--pool", "m=8001", "--lora", "other=a"),
    ("--pool", "m=8001", "--stream-chunk-tokens", "0"),
    ("--pool", "m=8001", "--error-rate", "2"),
])
def test_bad_usage_is_reported(argv: tuple[str, ...]) -> None:
    with pytest.raises(UsageError):
        build_specs(parse(*argv), BUILTIN_PROFILES["fast"])


def test_run_returns_2_on_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(parse("--pool", "m=1-2-3")) == 2
    assert run(parse("--pool", "m=8001", "--profile", "nope")) == 2
    assert "extproc sim: error" in capsys.readouterr().err


def test_every_option_has_help() -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    for action in parser._actions:
        if action.dest != "help":
            assert action.help, action.dest

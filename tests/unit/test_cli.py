from __future__ import annotations

from pathlib import Path

import pytest

from extproc.cli import BENCHMARKS, main
from extproc.tenants import hash_key

COMMANDS = [[], ["bench"], ["envoy"], ["keys"], ["rollout"],
            ["serve"], ["validate"], ["envoy", "render"], ["sim"], ["demo"], ["keys", "hash"], ["keys", "new"],
            ["rollout", "status"], ["rollout", "promote"], *(["bench", name] for name in BENCHMARKS)]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_every_command_has_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_validate_reports_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = Path(__file__).parents[2] / "policies" / "example.yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools:\n  - name: Bad\n    model: m\n    endpoints: ['127.0.0.1:1']\n")
    assert main(["validate", str(good)]) == 0
    assert main(["validate", str(good), str(bad)]) == 1
    assert f"{bad}:2:" in capsys.readouterr().err


def test_render_writes_envoy_files(tmp_path: Path) -> None:
    policy = Path(__file__).parents[2] / "policies" / "example.yaml"
    assert main(["envoy", "render", "--config", str(policy), "--out", str(tmp_path), "--mount", "/etc/envoy"]) == 0
    assert (tmp_path / "bootstrap.yaml").read_text().count("/etc/envoy/lds.yaml") == 1


def test_keys_hash(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "hash", "secret"]) == 0
    assert capsys.readouterr().out.strip() == hash_key("secret")

"""Regenerate (or, with --check, verify) the Envoy configuration committed under envoy/.

standalone/<policy>/  `extproc envoy render` of each policies/*.yaml, as Envoy reads it from /etc/envoy/xds
istio/                the Helm chart's EnvoyFilter patches for the istio-gateway and istio-sidecar modes

Run by `make envoy`; `tests/xds/test_envoy_dir.py` fails when the committed files are stale.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PARTS = ("standalone", "istio")
MOUNT = Path("/etc/envoy/xds")
ISTIO_MODES = ("istio-gateway", "istio-sidecar")


def render(out: Path, helm: Path) -> None:
    from extproc.config import load_policy
    from extproc.xds import write_config

    for policy_file in sorted((REPO / "policies").glob("*.yaml")):
        write_config(load_policy(policy_file), out / "standalone" / policy_file.stem, mount=MOUNT)
    istio = out / "istio"
    istio.mkdir(parents=True, exist_ok=True)
    for mode in ISTIO_MODES:
        rendered = subprocess.run(
            [str(helm), "template", "extproc", str(REPO / "helm"), "--namespace", "llm", "--set", f"mode={mode}",
             "--show-only", "templates/envoyfilter.yaml"],
            capture_output=True, text=True, check=True, timeout=60)
        (istio / f"{mode.removeprefix('istio-')}-envoyfilter.yaml").write_text(rendered.stdout, encoding="utf-8")


def differences(expected: Path, actual: Path) -> list[str]:
    """Files missing, extra or different in `actual` compared with `expected`."""
    found: list[str] = []
    comparison = filecmp.dircmp(expected, actual)
    stack = [comparison]
    while stack:
        current = stack.pop()
        found += [f"missing: {Path(current.right) / name}" for name in current.left_only]
        found += [f"extra: {Path(current.right) / name}" for name in current.right_only]
        _, mismatch, errors = filecmp.cmpfiles(current.left, current.right, current.common_files, shallow=False)
        found += [f"stale: {Path(current.right) / name}" for name in (*mismatch, *errors)]
        stack += list(current.subdirs.values())
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the committed files; exit 1 if stale")
    parser.add_argument("--helm", type=Path, default=REPO / ".venv" / "bin" / "helm", help="the helm binary")
    args = parser.parse_args(argv)
    if not args.helm.is_file():
        print(f"helm binary not found at {args.helm} (helm/tools/install-helm.sh installs it)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch)
        render(fresh, args.helm)
        if args.check:
            stale = [line for part in PARTS for line in (
                differences(fresh / part, HERE / part) if (HERE / part).is_dir() else [f"missing: {part}"])]
            for line in stale:
                print(line)
            if stale:
                print("envoy/ is stale: run `make envoy` and commit the result", file=sys.stderr)
            return 1 if stale else 0
        for part in PARTS:
            shutil.rmtree(HERE / part, ignore_errors=True)
            shutil.copytree(fresh / part, HERE / part)
    print(f"wrote {', '.join(str(HERE / part) for part in PARTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

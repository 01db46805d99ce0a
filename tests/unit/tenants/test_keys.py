from __future__ import annotations

from pathlib import Path

import pytest

from extproc.config import ConfigError
from extproc.tenants import KeyRing, hash_key

FILE = """\
tenants:
  - name: acme
    tier: paid
    models: [small]
    keys:
      - {sha256: %s, label: prod}
      - {sha256: %s, revoked: true}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    return path


def test_lookup_by_hash_and_revocation(tmp_path: Path) -> None:
    ring = KeyRing.from_file(write(tmp_path, FILE % (hash_key("good"), hash_key("old"))), {"default", "paid"})
    tenant = ring.authenticate("good")
    assert tenant is not None and tenant.name == "acme" and tenant.tier == "paid"
    assert tenant.may_use("small") and not tenant.may_use("large")
    assert ring.authenticate("old") is None
    assert ring.authenticate("wrong") is None
    assert len(ring) == 1


def test_each_key_is_named_for_the_audit_log_without_revealing_it(tmp_path: Path) -> None:
    text = FILE.replace("revoked: true", "revoked: false") % (hash_key("good"), hash_key("other"))
    ring = KeyRing.from_file(write(tmp_path, text), {"default", "paid"})
    labelled, unlabelled = ring.authenticate("good"), ring.authenticate("other")
    assert labelled is not None and unlabelled is not None
    assert labelled.key == "prod"
    assert unlabelled.key == "sha256:" + hash_key("other")[:12]
    assert labelled.name == unlabelled.name == "acme"  # the same tenant, whichever key


def test_bad_files_are_rejected_with_location(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"keys.yaml:6: .*64 hex"):
        KeyRing.from_file(write(tmp_path, FILE % ("plaintext-key", hash_key("x"))), {"default", "paid"})
    with pytest.raises(ConfigError, match="unknown tier"):
        KeyRing.from_file(write(tmp_path, FILE % (hash_key("a"), hash_key("b"))), {"default"})
    dup = FILE % (hash_key("a"), hash_key("b")) + FILE.split("\n", 1)[1] % (hash_key("c"), hash_key("d"))
    with pytest.raises(ConfigError, match="duplicate tenant"):
        KeyRing.from_file(write(tmp_path, dup), {"default", "paid"})


def test_shipped_example_keys_file(tmp_path: Path) -> None:
    root = Path(__file__).parents[3]
    ring = KeyRing.from_file(root / "policies" / "tenants" / "example.yaml", {"default", "free", "paid"})
    assert ring.authenticate("foo") is not None and ring.authenticate("baz") is None

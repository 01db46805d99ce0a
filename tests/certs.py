"""Throwaway TLS certificates for tests, made with the `openssl` command line (EC P-256 keys: fast to make).

A test CA signs a server certificate for 127.0.0.1 (IP and DNS name `redis.test`) and a client certificate; a
second, unrelated CA signs a "rogue" client certificate that a server trusting only the first CA must refuse.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["Certs", "make_certs"]


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_ca: Path
    rogue_client_cert: Path
    rogue_client_key: Path


def _openssl(*args: object) -> None:
    binary = shutil.which("openssl") or pytest.fail("the openssl command is not installed (Debian: openssl)",
                                                     pytrace=False)
    subprocess.run([binary, *map(str, args)], check=True, capture_output=True, timeout=30)


def _ca(where: Path, name: str) -> tuple[Path, Path]:
    cert, key = where / f"{name}.crt", where / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
             "-out", cert, "-days", "1", "-subj", f"/CN={name}")
    return cert, key


def _signed(where: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    cert, key, csr, ext = (where / f"{name}{suffix}" for suffix in (".crt", ".key", ".csr", ".ext"))
    ext.write_text(extensions)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
             "-out", csr, "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial", "-out", cert,
             "-days", "1", "-extfile", ext)
    return cert, key


def make_certs(where: Path) -> Certs:
    ca = _ca(where, "test-ca")
    server = _signed(where, "server", ca, "subjectAltName=IP:127.0.0.1,DNS:redis.test\nextendedKeyUsage=serverAuth\n")
    client = _signed(where, "client", ca, "extendedKeyUsage=clientAuth\n")
    rogue_ca = _ca(where, "rogue-ca")
    rogue = _signed(where, "rogue-client", rogue_ca, "extendedKeyUsage=clientAuth\n")
    return Certs(ca[0], server[0], server[1], client[0], client[1], rogue_ca[0], rogue[0], rogue[1])

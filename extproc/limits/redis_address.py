"""Where and how to reach Redis: the URL (`limits.redis_url`), and TLS (`limits.redis_tls`), as one `Address`.

Every Redis connection of the service (the limits store, the replicas' fleet and calibration exchanges, the
rollout store) is made from one `Address`, so each gets the same credentials and TLS settings. TLS settings
are checked when the policy loads: every file is read and the TLS context built, so a missing, unreadable or
malformed certificate or key is a policy error with its file and line, never a surprise at start.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, field_validator, model_validator

from extproc.limits.resp_connection import Arg
from extproc.policy_types import Strict

__all__ = ["Address", "RedisTls", "RedisUrl", "parse_url"]


@dataclass(frozen=True, slots=True)
class RedisUrl:
    """`redis[s]://[user:password@]host[:port][/db]`, parsed."""

    tls: bool
    host: str
    port: int
    username: str | None
    password: str | None
    db: int


def parse_url(url: str) -> RedisUrl:
    """Parse a Redis URL; ValueError names what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"a Redis URL must start with redis:// or rediss:// (TLS), not {parts.scheme}:// "
                         "(Unix sockets are not supported: every replica reaches Redis over TCP)")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ValueError(f"the database in a Redis URL must be a number, got {path!r}")
    try:
        port = parts.port or 6379
    except ValueError:  # not a number, or out of range
        raise ValueError(f"the port in a Redis URL must be a number in 1-65535 ({parts.netloc.rpartition('@')[2]!r})"
                         ) from None
    return RedisUrl(parts.scheme == "rediss", parts.hostname or "127.0.0.1", port,
                    unquote(parts.username) if parts.username else None,
                    unquote(parts.password) if parts.password is not None else None, int(path) if path else 0)


class RedisTls(Strict):
    """TLS to Redis, for a `rediss://` URL (without this section a `rediss://` URL trusts the system's CAs and
    checks the server's name, and presents no client certificate)."""

    ca_file: str | None = Field(default=None, description="PEM file of the CAs that sign the server's certificate; "
                                                          "default: the system's CAs")
    cert_file: str | None = Field(default=None, description="PEM client certificate, for a server that requires "
                                                            "one (tls-auth-clients)")
    key_file: str | None = Field(default=None, description="PEM private key of cert_file; default: in cert_file")
    server_name: str | None = Field(default=None, min_length=1, max_length=253,
                                    description="the name the server's certificate must carry (also sent as SNI); "
                                                "default: the host being connected to")
    verify: Literal["full", "ca"] = Field(default="full",
                                          description="full: the certificate's CA and name; ca: its CA only")

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _readable(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value.startswith("/"):
            raise ValueError(f"{value!r} must be an absolute path")
        try:
            with open(value, "rb") as file:
                file.read(1)
        except OSError as exc:
            raise ValueError(f"{value}: {exc.strerror or exc}") from None
        return value

    @model_validator(mode="after")
    def _loads(self) -> RedisTls:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("key_file needs cert_file (the client certificate it belongs to)")
        self.context()  # reads every file now: errors carry the policy's file and line
        return self

    def context(self) -> ssl.SSLContext:
        """A client TLS context from these settings; ValueError names the file that does not load."""
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"ca_file {self.ca_file}: {_why(exc)}") from None
        if self.verify == "ca":
            context.check_hostname = False  # the chain is still verified (CERT_REQUIRED)
        if self.cert_file is not None:
            try:
                context.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                files = self.cert_file if self.key_file is None else f"{self.cert_file} / key_file {self.key_file}"
                raise ValueError(f"cert_file {files}: {_why(exc)}") from None
        return context


def _why(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return f"not a valid PEM certificate / key pair ({exc.reason or exc})"
    return exc.strerror or str(exc)


@dataclass(frozen=True, slots=True)
class Address:
    """Where and how to connect: host, port, credentials, database, and the TLS context (None: plain TCP)."""

    host: str
    port: int
    username: str | None = None
    password: str | None = None
    db: int = 0
    tls: ssl.SSLContext | None = None
    server_name: str | None = None  # checked against the certificate instead of `host` (TLS only)

    @classmethod
    def from_url(cls, url: str, tls: RedisTls | None = None) -> Address:
        """The address of `url`; `tls` configures a `rediss://` URL (ValueError with a `redis://` one)."""
        parsed = parse_url(url)
        if tls is not None and not parsed.tls:
            raise ValueError("TLS settings (limits.redis_tls) need a rediss:// URL")
        context = (tls.context() if tls is not None else ssl.create_default_context()) if parsed.tls else None
        return cls(parsed.host, parsed.port, parsed.username, parsed.password, parsed.db, context,
                   tls.server_name if tls is not None else None)

    @property
    def tls_server_name(self) -> str | None:
        """The name TLS checks the certificate against (and sends as SNI); None without TLS."""
        return (self.server_name or self.host) if self.tls is not None else None

    def handshake(self) -> list[tuple[Arg, ...]]:
        """Commands sent on every new connection before anything else."""
        commands: list[tuple[Arg, ...]] = []
        if self.password is not None:
            commands.append(("AUTH", self.username, self.password) if self.username else ("AUTH", self.password))
        if self.db:
            commands.append(("SELECT", self.db))
        return commands

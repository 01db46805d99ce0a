"""TLS on the gRPC port, with the certificate and key reloaded when their files change (cert-manager, a mounted
Secret rotating). gRPC asks for the current pair on every handshake (`dynamic_ssl_server_credentials`); the answer
is prepared off that path by a background check of the files, so a handshake does no file I/O. A pair that does
not load (half-written, or a key that does not match the certificate) is refused and the previous one stays.
With a client CA (`autoscaling.tls`, the KEDA scaler's own port) every client must present a certificate it
signed; the CA file is reloaded with the pair.

The lean front end (`service.front_end: lean`) terminates TLS in asyncio: `server_context()` is the listener's
context, and each handshake switches to the current pair's context in the SNI callback (OpenSSL calls it for every
ClientHello, with or without a server name), so a reload reaches new connections there too. ALPN offers h2."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from pathlib import Path

import grpc

from extproc.autoscale.config import ScalerTls
from extproc.config.epp import GrpcTls
from extproc.periodic import Periodic

__all__ = ["CertificateReloader"]

log = logging.getLogger(__name__)

_Stamp = tuple[tuple[int, int, int], ...]  # (inode, size, mtime_ns) of each file


class CertificateReloader:
    def __init__(self, config: GrpcTls | ScalerTls) -> None:
        self._config = config
        self._paths = (Path(config.cert_file), Path(config.key_file))
        self._client_ca = Path(config.client_ca_file) if isinstance(config, ScalerTls) else None
        self._stamp = self._stat()
        # An unreadable pair at start is an error: the service does not start.
        self.current, self.context = self._load()
        self._pending: grpc.ServerCertificateConfiguration | None = None
        self._loop = Periodic("tls-reload", self._round, config.reload_interval_s, log=log,
                              what=f"TLS certificate {config.cert_file} / key {config.key_file}",
                              expected=(OSError, ssl.SSLError))
        self.reloads_total = 0

    @property
    def failures_total(self) -> int:
        return self._loop.failures.failures_total

    def _stat(self) -> _Stamp:
        stamps = []
        for path in (*self._paths, *([self._client_ca] if self._client_ca else [])):
            info = os.stat(path)
            stamps.append((info.st_ino, info.st_size, info.st_mtime_ns))
        return tuple(stamps)

    def _load(self) -> tuple[grpc.ServerCertificateConfiguration, ssl.SSLContext]:
        cert, key = (path.read_bytes() for path in self._paths)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # TLS 1.2 at least, as HTTP/2 requires
        context.load_cert_chain(*self._paths)  # the key fits the cert
        context.set_alpn_protocols(["h2"])
        if self._client_ca is None:
            return grpc.ssl_server_certificate_configuration([(key, cert)]), context
        client_ca = self._client_ca.read_bytes()
        context.load_verify_locations(cadata=client_ca.decode("ascii", "replace"))  # a CA certificate at all
        context.verify_mode = ssl.CERT_REQUIRED
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=client_ca), context

    def server_context(self) -> ssl.SSLContext:
        """The lean front end's listening context: every handshake continues with the current pair's."""
        listener = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        listener.load_cert_chain(*self._paths)
        listener.set_alpn_protocols(["h2"])
        if self._client_ca is not None:
            listener.load_verify_locations(cafile=str(self._client_ca))
            listener.verify_mode = ssl.CERT_REQUIRED
        listener.sni_callback = self._switch
        return listener

    def _switch(self, connection: ssl.SSLObject, _name: str | None, _listener: ssl.SSLContext) -> None:
        connection.context = self.context

    def credentials(self) -> grpc.ServerCredentials:
        # The fetcher may answer None (keep the current pair), which grpc-stubs' signature leaves out.
        return grpc.dynamic_ssl_server_credentials(self.current, self._fetch,  # type: ignore[arg-type]
                                                   require_client_authentication=self._client_ca is not None)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC at each handshake: a new pair once, else None (keep the current one)."""
        pending, self._pending = self._pending, None
        return pending

    def check(self) -> bool:
        """Load the pair again if either file changed; True when new connections will get a new pair. Raises
        OSError / ssl.SSLError for a pair that does not load (the previous one stays)."""
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        loaded, context = self._load()
        self._stamp = stamp
        self.current = self._pending = loaded
        self.context = context
        self.reloads_total += 1
        log.info("TLS certificate reloaded from %s", self._paths[0])
        return True

    async def _round(self) -> None:
        await asyncio.to_thread(self.check)  # file reads off the event loop

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

"""TLS for traffic that leaves the host: context helpers over the standard ``ssl`` module.

The HMAC handshake runs inside TLS as well, so a TLS connection is both
encrypted and authenticated by the cluster token; client certificates are an
extra, optional check.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
from pathlib import Path

__all__ = ["server_context", "client_context", "generate_self_signed"]


def server_context(
    certfile: str | os.PathLike, keyfile: str | os.PathLike, *, client_cafile: str | os.PathLike | None = None
) -> ssl.SSLContext:
    """A TLS 1.2+ server context; with ``client_cafile``, clients must present a cert it signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    if client_cafile is not None:
        context.load_verify_locations(cafile=client_cafile)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(
    cafile: str | os.PathLike, *, certfile: str | os.PathLike | None = None, keyfile: str | os.PathLike | None = None
) -> ssl.SSLContext:
    """A TLS 1.2+ client context that trusts ``cafile`` and checks the host name; optional client cert."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if certfile is not None:
        context.load_cert_chain(certfile, keyfile)
    return context


def generate_self_signed(
    directory: str | os.PathLike,
    name: str = "aiorl",
    *,
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
    days: int = 1,
) -> tuple[Path, Path]:
    """Write ``<name>.crt`` / ``<name>.key`` (EC P-256, self-signed) into ``directory``.

    For tests, benchmarks and single-host trials; uses the ``openssl`` command.
    The key file is created 0600. Returns ``(certfile, keyfile)``.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("generate_self_signed needs the openssl command on PATH")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    san = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() or ":" in h else f"DNS:{h}" for h in hosts)
    old_umask = os.umask(0o077)
    try:
        subprocess.run(
            [
                openssl,
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                str(key),
                "-out",
                str(cert),
                "-days",
                str(days),
                "-subj",
                f"/CN={name}",
                "-addext",
                f"subjectAltName={san}",
            ],
            check=True,
            capture_output=True,
        )
    finally:
        os.umask(old_umask)
    return cert, key

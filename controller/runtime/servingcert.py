"""The certificate an HTTPS endpoint serves: from a directory, as cert-manager mounts a Secret, or
self-signed at start-up, as controller-runtime's metrics server does when it is given none.

Why: Python's ssl module loads a certificate and key only from files, and the operator's pod has a
read-only root filesystem with one writable path, /tmp. So a self-signed pair is written to a fresh
private directory under the temporary directory (key mode 0600). A mounted pair is read where it is
and read again when its files change (cert-manager renews a certificate by swapping the Secret
volume's files), so a renewal needs no restart: the next connection gets the new certificate. A
changed pair that does not load (caught half-way through an update) leaves the previous one in use.

The self-signed pair is made by a short-lived child process (`python -m controller.runtime.servingcert
DIRECTORY HOST...`): the `cryptography` package costs a process about 13 MB of resident memory once
imported, for good, and the operator needs it only for those few milliseconds.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"
# A self-signed certificate lives as long as the process; a year is far beyond any pod's life.
SELF_SIGNED_DAYS: Final = 365

Fingerprint = tuple[tuple[int, int, int], ...]


class CertificateError(Exception):
    """The certificate cannot be loaded or made; the message says which file or directory and why."""


def _tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # HTTP/1.1 only: the server speaks nothing else (controller-runtime turns HTTP/2 off as well).
    context.set_alpn_protocols(["http/1.1"])
    context.load_cert_chain(cert, key)
    return context


def self_signed_pair(directory: Path, hosts: Sequence[str]) -> tuple[Path, Path]:
    """Writes a new self-signed certificate for `hosts` (names and IP addresses) and its ECDSA P-256 key
    into `directory`; returns their paths. (Imports `cryptography`: the operator runs it in a child.)"""
    from cryptography import x509  # noqa: PLC0415 - see the module's docstring
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import NameOID  # noqa: PLC0415

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / CERT_FILE, directory / KEY_FILE
    key_bytes = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    descriptor = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(key_bytes)
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def default_hosts() -> list[str]:
    """What a self-signed certificate names: this host (a pod's name) and the loopback addresses."""
    return [socket.gethostname() or "localhost", "localhost", "127.0.0.1", "::1"]


class ServingCertificate:
    """The TLS context of an HTTPS server; `context()` is what `HttpServer(tls=...)` calls per connection."""

    def __init__(self, cert: Path, key: Path, *, self_signed: bool) -> None:
        self.cert = cert
        self.key = key
        self.self_signed = self_signed
        self._lock = threading.Lock()
        self._fingerprint = self._files_fingerprint()
        self._context = self._load()
        self._failed: Fingerprint | None = None

    @classmethod
    def from_directory(cls, directory: str | Path) -> ServingCertificate:
        """tls.crt and tls.key of `directory`, as a Secret volume (cert-manager's) holds them."""
        path = Path(directory)
        return cls(path / CERT_FILE, path / KEY_FILE, self_signed=False)

    @classmethod
    def generate(
        cls, hosts: Sequence[str] | None = None, scratch: str | Path | None = None
    ) -> ServingCertificate:
        """A self-signed pair in a new private directory under `scratch` (default: the system's
        temporary directory, /tmp in the operator's pod)."""
        place = scratch or tempfile.gettempdir()
        try:
            directory = Path(tempfile.mkdtemp(prefix="trainingjob-operator-serving-", dir=scratch))
        except OSError as error:
            reason = error.strerror or error
            raise CertificateError(
                f"cannot write a self-signed certificate under {place}: {reason}"
            ) from None
        command = [sys.executable, "-m", __name__, str(directory), *(hosts or default_hosts())]
        made = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if made.returncode != 0:
            reason = (made.stderr.strip().splitlines() or [f"exit code {made.returncode}"])[-1]
            raise CertificateError(f"cannot write a self-signed certificate under {place}: {reason}")
        return cls(directory / CERT_FILE, directory / KEY_FILE, self_signed=True)

    def describe(self) -> str:
        return "self-signed" if self.self_signed else f"from {self.cert.parent}"

    def context(self) -> ssl.SSLContext:
        """The current context: the files' again when they changed and load."""
        if self.self_signed:
            return self._context
        with self._lock:
            try:
                fingerprint = self._files_fingerprint()
            except CertificateError:
                return self._context  # mid-update; the next connection looks again
            if fingerprint in (self._fingerprint, self._failed):
                return self._context
            try:
                self._context = self._load()
            except CertificateError as error:
                self._failed = fingerprint
                logger.warning("keeping the previous serving certificate: %s", error)
                return self._context
            self._fingerprint, self._failed = fingerprint, None
            logger.info("serving certificate reloaded", extra={"certificate": str(self.cert)})
            return self._context

    def _files_fingerprint(self) -> Fingerprint:
        try:
            stats = [os.stat(path) for path in (self.cert, self.key)]
        except OSError as error:
            raise CertificateError(f"cannot read {error.filename}: {error.strerror or error}") from None
        return tuple((stat.st_mtime_ns, stat.st_ino, stat.st_size) for stat in stats)

    def _load(self) -> ssl.SSLContext:
        try:
            return _tls_context(self.cert, self.key)
        except ssl.SSLError as error:
            raise CertificateError(
                f"{self.cert} and {self.key} are not a usable certificate and key: {error.reason or error}"
            ) from None
        except OSError as error:
            raise CertificateError(
                f"cannot read {self.cert} or {self.key}: {error.strerror or error}"
            ) from None


def main(argv: Sequence[str]) -> int:
    """`python -m controller.runtime.servingcert DIRECTORY HOST...`: a self-signed pair in DIRECTORY."""
    directory, *hosts = argv
    try:
        self_signed_pair(Path(directory), hosts)
    except OSError as error:
        print(error.strerror or error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

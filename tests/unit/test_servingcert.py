"""The metrics endpoint's serving certificate (controller/runtime/servingcert.py): a self-signed pair
made at start-up in a private directory (key readable by the operator only, the pod's names in it), a
mounted pair read from its directory and read again when cert-manager renews it, a renewal caught
half-way keeping the previous pair, and a missing or broken pair refused with a message naming it.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from cryptography import x509

from controller.runtime.servingcert import CertificateError, ServingCertificate, self_signed_pair


def names(path: Path) -> list[str]:
    certificate = x509.load_pem_x509_certificate(path.read_bytes())
    san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    found = [str(name) for name in san.get_values_for_type(x509.DNSName)]
    return found + [str(address) for address in san.get_values_for_type(x509.IPAddress)]


def serial(certificate: ServingCertificate) -> int:
    return x509.load_pem_x509_certificate(certificate.cert.read_bytes()).serial_number


def test_a_self_signed_pair_in_a_private_directory(tmp_path: Path) -> None:
    certificate = ServingCertificate.generate(["pod-0", "localhost", "127.0.0.1", "::1"], scratch=tmp_path)
    assert certificate.self_signed
    assert certificate.describe() == "self-signed"
    directory = certificate.cert.parent
    assert directory.parent == tmp_path
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(certificate.key.stat().st_mode) == 0o600
    assert names(certificate.cert) == ["pod-0", "localhost", "127.0.0.1", "::1"]
    assert certificate.context() is certificate.context()


def test_a_self_signed_pair_where_nothing_can_be_written(tmp_path: Path) -> None:
    with pytest.raises(
        CertificateError, match=f"cannot write a self-signed certificate under {tmp_path / 'none'}"
    ):
        ServingCertificate.generate(scratch=tmp_path / "none")


def test_a_missing_or_broken_mounted_pair_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(
        CertificateError, match=f"cannot read {tmp_path / 'tls.crt'}: No such file or directory"
    ):
        ServingCertificate.from_directory(tmp_path)
    (tmp_path / "tls.crt").write_text("not a certificate\n")
    (tmp_path / "tls.key").write_text("not a key\n")
    with pytest.raises(CertificateError, match="are not a usable certificate and key"):
        ServingCertificate.from_directory(tmp_path)


def mount(source: Path, volume: Path) -> None:
    """What the kubelet does to a Secret volume on renewal: new files beside, then swapped in."""
    staging = volume / ".staging"
    staging.mkdir(exist_ok=True)
    for name in ("tls.crt", "tls.key"):
        shutil.copy(source / name, staging / name)
        os.replace(staging / name, volume / name)


def test_a_renewed_pair_is_read_again_and_a_half_written_one_is_not(tmp_path: Path) -> None:
    first, second, volume = tmp_path / "first", tmp_path / "second", tmp_path / "volume"
    for directory in (first, second, volume):
        directory.mkdir()
    self_signed_pair(first, ["one.example"])
    self_signed_pair(second, ["two.example"])
    mount(first, volume)
    certificate = ServingCertificate.from_directory(volume)
    assert not certificate.self_signed
    assert certificate.describe() == f"from {volume}"
    context = certificate.context()
    assert certificate.context() is context  # unchanged files: the same context

    # Half-way through a renewal: the new certificate beside the old key.
    shutil.copy(second / "tls.crt", volume / "tls.crt")
    assert certificate.context() is context
    os.replace(second / "tls.key", volume / "tls.key")
    renewed = certificate.context()
    assert renewed is not context
    assert names(volume / "tls.crt") == ["two.example"]

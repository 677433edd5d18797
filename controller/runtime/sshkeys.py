"""A fresh SSH key pair for an MPI job: the imperative shell's part of the job's Secret.

Why here: builders/mpi.py builds the Secret from key material it is given, so that the planner stays a
pure function; making a key takes randomness, which belongs to the shell. The operator's image has no
ssh-keygen, and `cryptography` is a dependency already (the metrics endpoint's certificate), so the key
is an Ed25519 key made with it, written in OpenSSH's formats (what ssh and sshd read). It is never
logged: it only goes into the Secret's create request.
"""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from builders.mpi import SshKey


def new_ssh_key(comment: str = "trainingjob-operator") -> SshKey:
    """An Ed25519 key pair in OpenSSH's formats; `comment` ends the public key's line."""
    private = Ed25519PrivateKey.generate()
    private_text = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public_text = (
        private.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return SshKey(private=private_text, public=f"{public_text} {comment}\n")

"""The member credential without TLS: a challenge-response keyed by the cluster secret.

PD nodes and range servers holding the cluster secret prove it on every connection before
a **member opcode** (registration, heartbeats, replica updates, drops) is served, with two
``AUTH`` frames: the member asks ``{"challenge": true}`` and gets a fresh nonce bound to
the connection (``{}`` from a server without a secret); it answers ``{"role": "member",
"nonce", "proof"}``, ``proof = HMAC-SHA256(member_key(secret), label || role || server
nonce || member nonce)``. The server checks it (:func:`check_member_auth`) and forgets its
nonce either way: a recorded proof never verifies again, one nonce gets one guess.
:func:`member_key` derives its own key, never the ``hmac-sha256`` streams' MAC keys
(``estream/wire/record/``).

Pure: the caller brings the random nonces.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Final

MEMBER_ROLE: Final = "member"
member_nonce_bytes: Final = 32
_KEY_LABEL: Final = b"estream member credential v1"
_PROOF_LABEL: Final = b"estream member proof v1\x00"


def member_key(secret: bytes) -> bytes:
    """The key member proofs are made with, derived from the cluster secret."""
    return hmac.new(secret, _KEY_LABEL, hashlib.sha256).digest()


def member_proof(key: bytes, server_nonce: bytes, member_nonce: bytes,
                 role: str = MEMBER_ROLE) -> bytes:
    """The proof a member sends for ``server_nonce`` (see the module docstring)."""
    message = _PROOF_LABEL + role.encode() + b"\x00" + server_nonce + member_nonce
    return hmac.new(key, message, hashlib.sha256).digest()


def challenge_header() -> dict[str, object]:
    """A member's first AUTH request: ask for the server's nonce."""
    return {"challenge": True}


def is_challenge(header: Mapping[str, object]) -> bool:
    """Whether an AUTH request asks for a nonce."""
    return header.get("challenge") is True


def is_member_auth(header: Mapping[str, object]) -> bool:
    """Whether an AUTH request carries a member proof (rather than a token)."""
    return "proof" in header


def server_nonce_of(answer: Mapping[str, object]) -> bytes | None:
    """The nonce of a server's answer to a challenge (None: the server has no secret, or
    the answer is malformed)."""
    return _hex(answer.get("nonce"), member_nonce_bytes)


def member_auth_header(key: bytes, server_nonce: bytes, member_nonce: bytes) -> dict[str, object]:
    """A member's second AUTH request, answering ``server_nonce``."""
    return {"role": MEMBER_ROLE, "nonce": member_nonce.hex(),
            "proof": member_proof(key, server_nonce, member_nonce).hex()}


def check_member_auth(key: bytes, server_nonce: bytes | None,
                      header: Mapping[str, object]) -> bool:
    """Whether ``header`` proves membership for ``server_nonce`` (None: no challenge was
    asked on this connection, so nothing verifies). Compared in constant time."""
    if server_nonce is None or header.get("role") != MEMBER_ROLE:
        return False
    member_nonce = _hex(header.get("nonce"), member_nonce_bytes)
    proof = _hex(header.get("proof"), hashlib.sha256().digest_size)
    if member_nonce is None or proof is None:
        return False
    return hmac.compare_digest(member_proof(key, server_nonce, member_nonce), proof)


def _hex(value: object, size: int) -> bytes | None:
    """``value`` as exactly ``size`` bytes of lower- or upper-case hex, else None."""
    if not isinstance(value, str) or len(value) != 2 * size:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None


__all__ = [
    "MEMBER_ROLE",
    "challenge_header",
    "check_member_auth",
    "is_challenge",
    "is_member_auth",
    "member_auth_header",
    "member_key",
    "member_nonce_bytes",
    "member_proof",
    "server_nonce_of",
]

"""The member credential's challenge-response (estream/wire/membership.py)."""

from __future__ import annotations

from estream.wire.membership import (
    MEMBER_ROLE,
    challenge_header,
    check_member_auth,
    is_challenge,
    is_member_auth,
    member_auth_header,
    member_key,
    member_proof,
    server_nonce_of,
)
from estream.wire.record import stream_key

SECRET = b"cluster secret"
KEY = member_key(SECRET)
SERVER_NONCE = bytes(range(32))
MEMBER_NONCE = bytes(range(32, 64))


def test_a_member_with_the_secret_proves_itself() -> None:
    header = member_auth_header(KEY, SERVER_NONCE, MEMBER_NONCE)
    assert is_member_auth(header) and not is_challenge(header)
    assert check_member_auth(KEY, SERVER_NONCE, header)


def test_the_secret_itself_never_is_in_the_proof() -> None:
    header = member_auth_header(KEY, SERVER_NONCE, MEMBER_NONCE)
    text = repr(header)
    assert SECRET.hex() not in text and KEY.hex() not in text and "cluster secret" not in text


def test_another_secret_does_not_prove_membership() -> None:
    header = member_auth_header(member_key(b"another secret"), SERVER_NONCE, MEMBER_NONCE)
    assert not check_member_auth(KEY, SERVER_NONCE, header)


def test_a_proof_for_another_nonce_is_refused() -> None:
    """Replay: a proof recorded on one connection answers that connection's nonce only."""
    recorded = member_auth_header(KEY, SERVER_NONCE, MEMBER_NONCE)
    assert not check_member_auth(KEY, bytes(32), recorded)


def test_without_a_challenge_nothing_verifies() -> None:
    header = member_auth_header(KEY, SERVER_NONCE, MEMBER_NONCE)
    assert not check_member_auth(KEY, None, header)


def test_the_role_is_bound_into_the_proof() -> None:
    header = member_auth_header(KEY, SERVER_NONCE, MEMBER_NONCE)
    assert not check_member_auth(KEY, SERVER_NONCE, {**header, "role": "admin"})
    other = member_proof(KEY, SERVER_NONCE, MEMBER_NONCE, "client").hex()
    assert not check_member_auth(KEY, SERVER_NONCE, {**header, "proof": other})


def test_malformed_fields_are_refused_without_raising() -> None:
    good = member_auth_header(KEY, SERVER_NONCE, MEMBER_NONCE)
    for bad in ({**good, "proof": "zz" * 32}, {**good, "proof": good["proof"][:-2]},
                {**good, "nonce": 7}, {**good, "nonce": "ab"}, {**good, "proof": None},
                {"role": MEMBER_ROLE}, {}):
        assert not check_member_auth(KEY, SERVER_NONCE, bad)


def test_challenge_and_nonce_parsing() -> None:
    assert is_challenge(challenge_header())
    assert not is_challenge({"challenge": "yes"}) and not is_challenge({"token": "t"})
    assert server_nonce_of({"nonce": SERVER_NONCE.hex()}) == SERVER_NONCE
    assert server_nonce_of({}) is None  # a server without the secret
    assert server_nonce_of({"nonce": "00"}) is None


def test_the_member_key_is_not_a_stream_mac_key() -> None:
    assert member_key(SECRET) != SECRET
    assert all(member_key(SECRET) != stream_key(SECRET, s) for s in range(4))

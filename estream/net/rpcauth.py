"""Who a server connection proved to be, and what it may send.

:class:`ConnectionAuth` is the part of the RPC server's connection
(:mod:`estream.net.rpcserver`) that answers AUTH: a token (its role from the server's
table), the cluster secret's challenge and proof (:mod:`estream.wire.membership`), or a
verified client certificate (mutual TLS: the role it names); a connection that has not
authenticated within the server's deadline is answered ``Unauthenticated`` and closed,
and each opcode is refused to a connection whose roles may not do what it does
(:mod:`estream.wire.roles`).

Side effects: replies and closes on the connection's transport.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import TYPE_CHECKING

from estream.net.rpcfields import Header
from estream.net.security import token_role, verified_peer_cert
from estream.wire.errors import EstreamError, Unauthenticated
from estream.wire.membership import (
    check_member_auth,
    is_challenge,
    is_member_auth,
    member_nonce_bytes,
)
from estream.wire.protocol import Frame, FrameFlags, Opcode, encode_error, encode_frame
from estream.wire.roles import (
    ALL_ROLES,
    MEMBER_ROLE,
    Action,
    action_of,
    certificate_role,
    permits_any,
)

if TYPE_CHECKING:
    from estream.net.rpcserver import RpcServer

log = logging.getLogger(__name__)


class ConnectionAuth:
    """The credentials of one server connection (a mixin of its protocol)."""

    server: RpcServer
    transport: asyncio.Transport | None

    def init_auth(self, server: RpcServer) -> None:
        self.authenticated = not server.tokens  # without tokens every connection is served
        # The roles of the credentials this connection proved (estream/wire/roles.py):
        # every role on a server without tokens, until a certificate names its own.
        self.roles: set[str] = {ALL_ROLES} if not server.tokens else set()
        self.member = False  # proved the cluster secret (estream/wire/membership.py)
        # Opcodes this connection was let send: credentials only ever add roles (a token,
        # the secret's proof, beside a certificate's), so what was let stays let, and each
        # request after an opcode's first is one set lookup (`_take`), not a role walk.
        self.permitted: set[int] = set()
        self.member_nonce: bytes | None = None  # the challenge asked on this connection
        self._auth_deadline: asyncio.TimerHandle | None = None

    def start_auth(self, transport: asyncio.Transport) -> None:
        """On connecting: a verified client certificate's role, or the deadline to
        authenticate by."""
        server = self.server
        cert = verified_peer_cert(transport)
        if cert is not None:  # mutual TLS: the certificate's role, whatever else
            role, problem = certificate_role(cert)
            self.authenticated, self.roles = True, {role}
            if problem is not None:
                server.warn_once(problem)
        if not self.authenticated:
            self._auth_deadline = asyncio.get_running_loop().call_later(
                server.auth_ms_max / 1000, self._auth_expired)

    def _reply(self, parts: list[bytes | memoryview]) -> None:
        raise NotImplementedError  # the connection's

    def _auth_expired(self) -> None:
        """The connection did not authenticate in time: answer so, and close it."""
        self._auth_deadline = None
        transport = self.transport
        if self.authenticated or transport is None or transport.is_closing():
            return
        server = self.server
        server.connections_refused["auth"] = server.connections_refused["auth"] + 1
        log.warning("%s: closing a connection that did not authenticate within %d ms",
                    server.name, server.auth_ms_max)
        self._reply(encode_error(0, 0, Unauthenticated(
            f"not authenticated within {server.auth_ms_max} ms")))
        transport.close()

    def _cancel_auth_deadline(self) -> None:
        if self._auth_deadline is not None:
            self._auth_deadline.cancel()
            self._auth_deadline = None

    def _refusal(self, opcode: int) -> Unauthenticated | None:
        """Why this connection may not send ``opcode`` (None: it may, and it is
        :attr:`permitted` from now on): member opcodes need the cluster secret's proof
        when the server holds it, else a role that may."""
        table = self.server.opcode_actions
        if table is None:
            self.permitted.add(opcode)
            return None
        action = action_of(table, opcode)
        if action is Action.MEMBER and self.server.member_key is not None:
            if self.member:
                self.permitted.add(opcode)
                return None
            return Unauthenticated("member opcode: needs the cluster secret (--secret-file, "
                                   "ESTREAM_SECRET_FILE)")
        if permits_any(self.roles, action):
            self.permitted.add(opcode)
            return None
        held = ", ".join(sorted(self.roles)) or "none"
        return Unauthenticated(f"permission denied: opcode {opcode} needs a token or "
                               f"certificate whose role may {action.value} (this "
                               f"connection's role: {held})")

    def _authenticate(self, frame: Frame) -> bool:
        """Answer AUTH, or refuse a request before authentication; False: closing."""
        if frame.opcode != Opcode.AUTH:
            error = Unauthenticated(
                "not authenticated: this cluster needs a token (SDK connect(token=...), CLI "
                "--token-file, ESTREAM_TOKEN_FILE or ESTREAM_TOKEN) or a client certificate "
                "signed by the cluster CA (tls_cert/tls_key, --tls-cert/--tls-key)"
            )
            self._reply(encode_error(frame.opcode, frame.request_id, error))
            return True
        try:
            header = frame.header()
        except EstreamError:
            header = {}
        if is_challenge(header) or is_member_auth(header):
            return self._authenticate_member(frame, header)
        role = token_role(self.server.tokens, header.get("token"))
        if not self.server.tokens or role is not None:
            self.authenticated = True
            if role is not None:
                self.roles.add(role)  # with a certificate's: either one's grants
            self._cancel_auth_deadline()
            self._reply(encode_frame(Opcode.AUTH, frame.request_id, {}, b"", FrameFlags.RESPONSE))
            return True
        self._reply(encode_error(frame.opcode, frame.request_id, Unauthenticated("bad token")))
        assert self.transport is not None
        self.transport.close()
        return False

    def _authenticate_member(self, frame: Frame, header: Header) -> bool:
        """Answer a member's challenge with a fresh nonce, or check its proof (one guess
        per nonce); a refused proof closes the connection. False: closing."""
        key = self.server.member_key
        if is_challenge(header):
            answer: Header = {}
            if key is not None:
                self.member_nonce = secrets.token_bytes(member_nonce_bytes)
                answer = {"nonce": self.member_nonce.hex()}
            self._reply(encode_frame(Opcode.AUTH, frame.request_id, answer, b"",
                                     FrameFlags.RESPONSE))
            return True
        nonce, self.member_nonce = self.member_nonce, None
        if key is not None and check_member_auth(key, nonce, header):
            self.member = self.authenticated = True
            self.roles.add(MEMBER_ROLE)
            self._cancel_auth_deadline()
            self._reply(encode_frame(Opcode.AUTH, frame.request_id, {}, b"", FrameFlags.RESPONSE))
            return True
        self._reply(encode_error(frame.opcode, frame.request_id, Unauthenticated(
            "bad member proof: not this cluster's secret")))
        assert self.transport is not None
        self.transport.close()
        return False


__all__ = ["ConnectionAuth"]

"""Transport security settings: TLS contexts, token checks, the Raft secret's defaults.

One frozen :class:`SecurityConfig` describes what a process offers and expects:

- **TLS** (``tls_cert`` + ``tls_key``, ``tls_ca``): a server with a certificate serves
  TLS 1.2+ only. With a CA it also asks clients for a certificate and verifies any one
  presented against that CA (a certificate from another CA fails the handshake); with
  ``require_client_cert`` a connection without one is refused (mutual TLS for everyone).
  A client verifies the server against ``tls_ca`` (or the system store) with hostname
  checking ON: an address given as an IP must be in the certificate's IP SANs.
- **Tokens** (``tokens``): a server with tokens serves a connection only once it has
  authenticated, either by presenting a client certificate verified against the CA (its
  role is the one it names: :func:`estream.wire.roles.certificate_role`) or with an
  ``AUTH`` frame carrying one of the tokens. ``token`` is the
  one a process presents as a client (cluster members: the first line of their token file).

:func:`server_context`, :func:`client_context` build :class:`ssl.SSLContext` objects (they
read the certificate files); everything else here is pure. Tokens are compared with
:func:`hmac.compare_digest`.

The **cluster secret** (:func:`add_secret_options`, :func:`load_cluster_secret`): the
per-stream MAC keys of ``hmac-sha256`` streams derive from it (``estream/wire/record.py``).
Clients hold it (``connect(secret=)``, ``ESTREAM_SECRET``); a range server given it
verifies those MACs on APPEND. It is also the **member credential**: PD nodes and range
servers given it prove it to each other (:mod:`estream.wire.membership`) and serve member
opcodes only to connections that did.

Side effects: :func:`server_context`, :func:`client_context`, :func:`load_token_file` and
:func:`load_cluster_secret` read files.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import secrets
import ssl
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from cryptography import x509

from estream.wire.errors import InvalidArgument
from estream.wire.roles import ALL_ROLES, MEMBER_ROLE, certificate_role, parse_token_line

TLS_MIN_VERSION: Final = ssl.TLSVersion.TLSv1_2
token_bytes_max: Final = 4096  # a longer AUTH token is refused before it is compared
DEV_RAFT_PASSWORD: Final = "estream-dev-secret"  # public: loopback development only


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """What one process offers (as a server) and presents (as a client)."""

    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    require_client_cert: bool = False
    tokens: frozenset[str] = frozenset()
    token_roles: Mapping[str, str] = field(default_factory=dict)  # token -> its role
    token: str | None = None
    protect_reads: bool = False  # admin API: reads need a token too (healthz stays open)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgument("--tls-cert and --tls-key go together", argument="tls_cert")
        if self.require_client_cert and (self.tls_ca is None or self.tls_cert is None):
            raise InvalidArgument(
                "--tls-require-client-cert needs --tls-cert, --tls-key and --tls-ca",
                argument="tls_require_client_cert")

    def __repr__(self) -> str:  # never print tokens
        return (f"SecurityConfig(tls_cert={self.tls_cert!r}, tls_ca={self.tls_ca!r}, "
                f"require_client_cert={self.require_client_cert}, "
                f"tokens={len(self.tokens)}, token={'***' if self.token else None})")


# --- tokens (pure) ----------------------------------------------------------------------


def parse_role_tokens(text: str) -> tuple[tuple[str, str], ...]:
    """``(role, token)`` pairs of a token file's text: one per line, ``ROLE:TOKEN`` or a
    bare token (every role: :func:`estream.wire.roles.parse_token_line`); blank lines and
    ``#`` comments skipped.

    >>> parse_role_tokens("# cluster\\nadmin:abc\\n\\n  def  \\n")
    (('admin', 'abc'), ('all', 'def'))
    """
    out = []
    for line in text.splitlines():
        token = line.strip()
        if token and not token.startswith("#"):
            out.append(parse_token_line(token))
    return tuple(out)


def parse_tokens(text: str) -> tuple[str, ...]:
    """The tokens of a token file's text, roles left off (what a client presents).

    >>> parse_tokens("# cluster\\nabc\\n\\n  client:def  \\n")
    ('abc', 'def')
    """
    return tuple(token for _, token in parse_role_tokens(text))


def token_role(token_roles: Mapping[str, str], presented: object) -> str | None:
    """The role of ``presented`` among ``token_roles`` (None: not one of them), in time
    independent of where they differ: every token is compared, no early exit."""
    if not isinstance(presented, str) or not presented or len(presented) > token_bytes_max:
        return None
    given = presented.encode()
    found: str | None = None
    for token, role in token_roles.items():
        if hmac.compare_digest(token.encode(), given):
            found = role
    return found


def token_matches(tokens: Collection[str], presented: object) -> bool:
    """Whether ``presented`` is one of ``tokens``, in time independent of where they differ.

    Every token is compared (no early exit on a match), so timing tells nothing about
    which one matched or how much of one did.
    """
    if not isinstance(presented, str) or not presented or len(presented) > token_bytes_max:
        return False
    given = presented.encode()
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(token.encode(), given)
    return matched


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def is_loopback(address: str) -> bool:
    """Whether ``host:port`` names a loopback address (127.0.0.0/8, ::1, localhost)."""
    host = address.rpartition(":")[0].strip("[]") or address
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def raft_password(configured: str | None, self_address: str,
                  peers: Iterable[str]) -> tuple[str, str]:
    """The Raft shared secret to use and why: ``(password, source)``.

    A configured secret wins. Without one, a one-node cluster gets a fresh random secret
    (no peer needs to know it, and the Raft port then refuses everyone); a multi-node
    cluster falls back to the public development secret, which authenticates nothing
    (``source`` says whether every Raft address is loopback, so the caller can warn).
    """
    if configured:
        return configured, "configured"
    peer_list = list(peers)
    if not peer_list:
        return secrets.token_urlsafe(32), "generated"
    if all(is_loopback(a) for a in [self_address, *peer_list]):
        return DEV_RAFT_PASSWORD, "development-loopback"
    return DEV_RAFT_PASSWORD, "development-exposed"


def exposure_warnings(addresses: Iterable[str], config: SecurityConfig,
                      raft_source: str | None = None) -> list[str]:
    """What ``--check-config`` warns about (the process would still start). Pure.

    ``addresses``: where the process listens; ``raft_source``: :func:`raft_password`'s
    source for a PD node."""
    found = []
    if raft_source == "development-exposed":
        found.append("no --password: Raft beyond loopback uses the PUBLIC development secret "
                     "(anyone who reaches the Raft port can join); set --password-file or "
                     "ESTREAM_PD_PASSWORD, e.g. from a Kubernetes Secret")
    exposed = [a for a in addresses if a and not is_loopback(a)]
    if exposed and not config.tokens and not config.require_client_cert:
        found.append(f"listening beyond loopback ({', '.join(exposed)}) with no --token-file "
                     "or --tls-require-client-cert: anyone who reaches the port is served")
    return found


# --- TLS contexts (read the certificate files) ------------------------------------------


def server_context(config: SecurityConfig) -> ssl.SSLContext | None:
    """The server side's TLS context, or None without a certificate (plain TCP)."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_MIN_VERSION
    _load(context.load_cert_chain, config.tls_cert, config.tls_key)
    if config.tls_ca is not None:
        _load(context.load_verify_locations, config.tls_ca)
        context.verify_mode = (ssl.CERT_REQUIRED if config.require_client_cert
                               else ssl.CERT_OPTIONAL)
    return context


def client_context(
    *, tls_ca: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
    tls: bool = False,
) -> ssl.SSLContext | None:
    """The client side's TLS context, or None when no TLS setting is given.

    ``tls_ca`` verifies the server (the system store without it; ``tls=True`` asks for TLS
    with the system store only); ``tls_cert``/``tls_key`` is the client certificate a
    cluster member presents. Hostname (or IP SAN) checking stays on.
    """
    if tls_ca is None and tls_cert is None and not tls:
        return None
    if (tls_cert is None) != (tls_key is None):
        raise InvalidArgument("tls_cert and tls_key go together", argument="tls_cert")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
    context.minimum_version = TLS_MIN_VERSION
    if tls_ca is not None:
        _load(context.load_verify_locations, tls_ca)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if tls_cert is not None:
        _load(context.load_cert_chain, tls_cert, tls_key)
    return context


def member_client_context(config: SecurityConfig) -> ssl.SSLContext | None:
    """The context a cluster member (a range server calling PD) connects with.

    A member that serves plain TCP calls plain TCP too (a cluster is TLS or not), so a
    stray ``ESTREAM_TLS_CA`` in the environment does not make it speak TLS to plain peers.
    """
    if config.tls_cert is None:
        return None
    return client_context(tls_ca=config.tls_ca, tls_cert=config.tls_cert,
                          tls_key=config.tls_key)


def verified_peer_cert(transport: Any) -> Mapping[str, object] | None:
    """The certificate the TLS peer presented, decoded (:meth:`ssl.SSLSocket.getpeercert`),
    if it verified against our CA; else None. Its role: :func:`estream.wire.roles.
    certificate_role`."""
    try:
        cert = transport.get_extra_info("peercert")
    except (AttributeError, ssl.SSLError):
        return None
    return cert if isinstance(cert, dict) and cert else None


def certificate_file_role(path: str | Path) -> tuple[str, str | None]:
    """What :func:`estream.wire.roles.certificate_role` says of the PEM certificate at
    ``path`` (reads it; ValueError or OSError if it is not one)."""
    cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return certificate_role({})
    uris = names.get_values_for_type(x509.UniformResourceIdentifier)
    return certificate_role({"subjectAltName": tuple(("URI", uri) for uri in uris)})


def member_certificate_warning(config: SecurityConfig, member_secret: bool) -> str | None:
    """Why other members would refuse this member's opcodes (registration, heartbeats,
    replica drops), or None: without the cluster secret a member proves itself by its
    certificate's role or its token's, and neither is ``member`` (a certificate made before
    roles names none). Reads the certificate."""
    if config.tls_cert is None or member_secret:
        return None
    if config.token is not None and config.token_roles.get(config.token) in (MEMBER_ROLE,
                                                                            ALL_ROLES):
        return None
    try:
        role, _ = certificate_file_role(config.tls_cert)
    except (OSError, ValueError):
        return None  # server_context() has said what is wrong with it
    if role == MEMBER_ROLE:
        return None
    return (f"this member's certificate {config.tls_cert} names role '{role}', not "
            "'member', and there is no cluster secret: other members refuse its member "
            "opcodes (registration, heartbeats, replica drops); make it again with "
            "`estream certs DIR` (same CA) or give every member --secret-file")


def _load(method: Any, *paths: str | None) -> None:
    try:
        method(*paths)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidArgument(f"cannot load TLS file {paths[0]}: {exc}",
                              argument="tls") from None


def member_token(pairs: Iterable[tuple[str, str]]) -> str | None:
    """The token a member presents to other members: its first one of the ``member`` role
    or a bare one, else its first (as before roles); None without tokens. Pure."""
    listed = list(pairs)
    mine = [t for r, t in listed if r in (MEMBER_ROLE, ALL_ROLES)] or [t for _, t in listed]
    return mine[0] if mine else None


def load_token_file(path: str | Path) -> tuple[str, ...]:
    """The tokens of a token file (see :func:`parse_tokens`); InvalidArgument if unusable."""
    return tuple(token for _, token in load_role_token_file(path))


def load_role_token_file(path: str | Path) -> tuple[tuple[str, str], ...]:
    """The ``(role, token)`` pairs of a token file (:func:`parse_role_tokens`)."""
    try:
        tokens = parse_role_tokens(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"cannot read token file {path}: {exc}",
                              argument="token_file") from None
    if not tokens:
        raise InvalidArgument(f"token file {path} holds no token", argument="token_file")
    return tokens


# --- command-line options shared by `estream pd` and `estream rangeserver` ---------------


def add_server_options(parser: argparse.ArgumentParser, *, admin: bool = False) -> None:
    """Add --tls-cert, --tls-key, --tls-ca, --tls-require-client-cert, --token-file."""
    parser.add_argument("--tls-cert", default=None, metavar="PEM",
                        help="serve TLS with this certificate (chain); also the member cert")
    parser.add_argument("--tls-key", default=None, metavar="PEM", help="its private key")
    parser.add_argument("--tls-ca", default=None, metavar="PEM",
                        help="CA that signs cluster members' certificates (verifies peers)")
    parser.add_argument("--tls-require-client-cert", action="store_true", default=False,
                        help="refuse connections without a certificate signed by --tls-ca")
    parser.add_argument("--token-file", default=None, metavar="FILE",
                        help="accepted client tokens, one per line; the first one is "
                             "presented to other members")
    if admin:
        parser.add_argument("--admin-protect-reads", action="store_true", default=False,
                            help="the admin API's GET endpoints need a token too")


def add_secret_options(parser: argparse.ArgumentParser, *, member: bool = False) -> None:
    """Add --secret and --secret-file: the cluster secret (env ``ESTREAM_SECRET``, the
    variable clients read, or ``ESTREAM_SECRET_FILE``). ``member``: a PD node's help."""
    what = ("the cluster secret: the member credential range servers and PD nodes prove "
            "(without it member opcodes are open)" if member else
            "the cluster secret that hmac-sha256 streams' MAC keys derive from: with it, "
            "APPENDs of such streams are verified, and it is the member credential proved "
            "to PD")
    parser.add_argument("--secret", default=None, metavar="SECRET",
                        help=f"{what} (prefer --secret-file or the environment: flags show "
                             "in ps)")
    parser.add_argument("--secret-file", default=None, metavar="FILE",
                        help="a file holding the cluster secret (surrounding whitespace "
                             "stripped)")


def load_cluster_secret(args: argparse.Namespace) -> bytes | None:
    """The cluster secret of parsed ``--secret`` / ``--secret-file`` (None: neither);
    InvalidArgument for both at once, an unreadable or an empty file."""
    secret: str | None = getattr(args, "secret", None) or None
    path: str | None = getattr(args, "secret_file", None) or None
    if secret is not None and path is not None:
        raise InvalidArgument("--secret and --secret-file exclude each other",
                              argument="secret_file")
    if path is not None:
        try:
            raw = Path(path).read_bytes().strip()
        except OSError as exc:
            raise InvalidArgument(f"cannot read secret file {path}: {exc.strerror or exc}",
                                  argument="secret_file") from None
        if not raw:
            raise InvalidArgument(f"secret file {path} is empty", argument="secret_file")
        return raw
    return secret.encode() if secret is not None else None


def config_from_args(args: argparse.Namespace) -> SecurityConfig:
    """The :class:`SecurityConfig` of parsed server options; InvalidArgument if unusable."""
    pairs: tuple[tuple[str, str], ...] = ()
    if args.token_file:
        pairs = load_role_token_file(args.token_file)
    config = SecurityConfig(
        tls_cert=args.tls_cert or None, tls_key=args.tls_key or None,
        tls_ca=args.tls_ca or None, require_client_cert=bool(args.tls_require_client_cert),
        tokens=frozenset(t for _, t in pairs), token_roles={t: r for r, t in pairs},
        token=member_token(pairs),
        protect_reads=bool(getattr(args, "admin_protect_reads", False)),
    )
    server_context(config)  # fail at start, with one line, on unreadable or bad files
    member_client_context(config)
    return config


__all__ = [
    "DEV_RAFT_PASSWORD",
    "SecurityConfig",
    "add_secret_options",
    "add_server_options",
    "bearer_token",
    "certificate_file_role",
    "client_context",
    "config_from_args",
    "is_loopback",
    "load_cluster_secret",
    "load_role_token_file",
    "load_token_file",
    "member_certificate_warning",
    "member_client_context",
    "member_token",
    "parse_role_tokens",
    "parse_tokens",
    "raft_password",
    "server_context",
    "token_matches",
    "token_role",
    "verified_peer_cert",
]

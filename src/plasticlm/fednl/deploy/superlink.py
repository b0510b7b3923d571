"""plasticlm's SuperLink: Flower's own SuperLink app (``flwr.superlink.main.create_app`` of the
pinned flwr 1.42) behind an operator gate, so that only the operator commands the federation.

In Flower 1.42 the Fleet routes (``/v1/fleet/...``, the SuperNodes), the Control routes
(``/v1/control/...``: ``flwr run``, ``flwr supernode register``, ``flwr ls``) and the runtime
routes (``/v1/runtime/...``, the ServerApp) share one HTTP port, and open-source Control
authentication is a no-op. :class:`OperatorGate`, the outermost ASGI layer, lets through the
Fleet routes and ``/health`` from anyone and every other route only to the operator: a
loopback peer whose socket belongs to the SuperLink's own uid (Linux,
:mod:`plasticlm.fednl.deploy.peer_uid`), or a request carrying the operator secret (over TLS, or
from loopback); anything else is a 403 before a byte of the body is read. Loopback alone
proves nothing: every local user is on it. Run it as
``python -m plasticlm.fednl.deploy.superlink [--operator-secret-file F] <flower-superlink flags>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hmac
import ipaddress
import logging
import os
import re
import secrets
import socket
import sys
from pathlib import Path

import uvicorn
from flwr.cli.constant import (
    ACCESS_TOKEN_STORE_KEY,
    AUTHN_TYPE_STORE_KEY,
    REFRESH_TOKEN_STORE_KEY,
)
from flwr.common.constant import (
    FLWR_INTERNAL_GRPC_CONTROL_API,
    FLWR_INTERNAL_GRPC_FLEET_API,
    AuthnType,
)
from flwr.supercore.control.control_http_client import ControlHttpClient
from flwr.supercore.credential_store.file_credential_store import FileCredentialStore
from flwr.supercore.http_logging import get_uvicorn_log_config
from flwr.supercore.interceptors.http.runtime_version import RuntimeVersionHttpInterceptor
from flwr.supercore.logger import console_handler
from flwr.superlink.cli.flower_superlink import SuperLinkLifespan, _parse_superlink_lifespan_config
from flwr.superlink.main import create_app

from plasticlm.errors import PlasticError
from plasticlm.fednl.deploy import peer_uid as peers
from plasticlm.listener import DEFAULT_LIMITS

log = logging.getLogger("plasticlm.fednl")
OPERATOR_HEADER = "x-plasticlm-operator"
MIN_SECRET_CHARS = 32
# One path segment of lower-case letters and dashes: no "..", no "/", no percent-decoded
# tricks can turn a Fleet-looking path into another route.
_FLEET = re.compile(r"/v1/fleet/[a-z][a-z-]*")
_PUBLIC = {"/health"}
_REFUSAL = (b'{"detail":"only the operator may use this route (the SuperLink\'s own user on '
            b'loopback, or the operator secret)"}')
# Flower's CLI sends a stored access token as a bearer token (what ``flwr login`` stores):
# how ``flwr`` itself carries the operator secret (see store_operator_secret)
_BEARER = b"bearer "


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (a peer address as ASGI gives it) is a loopback address; an IPv4
    address mapped into IPv6 (``::ffff:127.0.0.1``, a dual-stack socket) counts as itself."""
    try:
        ip = ipaddress.ip_address(host or "")
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _public(scope: dict) -> bool:
    """A Fleet route or ``/health``: open to anyone."""
    path = scope.get("path", "")
    return bool(_FLEET.fullmatch(path)) or path in _PUBLIC


class OperatorGate:
    """Pure ASGI middleware in front of the SuperLink app.

    Passes ``/v1/fleet/<name>`` and ``/health`` from anyone (node authentication, when on,
    is Flower's own, inside); every other HTTP or WebSocket route only to the operator:

    - a loopback TCP peer whose client socket belongs to ``owner_uid`` (default: this
      process's effective uid), as ``uid_of(client, server)`` finds it; where the system
      lists no socket owners (``peer_uid.AVAILABLE`` False: not Linux) any loopback peer,
      the rule before uids were known, with a warning at start;
    - or a request carrying ``secret``, exactly once, in ``X-Plasticlm-Operator`` or as
      ``Authorization: Bearer`` (Flower's CLI), over TLS or from a loopback peer (traffic on
      loopback is not visible to other unprivileged users); never in the clear from
      elsewhere. The credential is taken out before Flower's app sees the request.

    A refused request gets 403 and its body is never read. Other scopes (lifespan) pass
    unchanged. ``secret=None``: the owner's uid only.
    """

    def __init__(self, app, secret: bytes | None = None, owner_uid: int | None = None,
                 uid_of=peers.peer_uid, uids_known: bool = peers.AVAILABLE):
        if secret is not None and len(secret) < MIN_SECRET_CHARS:
            raise PlasticError(f"the operator secret has {len(secret)} characters; it needs at "
                               f"least {MIN_SECRET_CHARS} (make_operator_secret makes one)")
        self.app, self.secret, self.uid_of, self.uids_known = app, secret, uid_of, uids_known
        self.owner_uid = os.geteuid() if owner_uid is None else owner_uid

    def allows(self, scope: dict) -> bool:
        if _public(scope):
            return True
        client = scope.get("client")
        loopback = bool(client) and is_loopback(client[0])
        if self._has_secret(scope, loopback):
            return True
        if not loopback:
            return False
        if not self.uids_known:
            return True
        server = scope.get("server")
        return bool(server) and self.uid_of(tuple(client), tuple(server)) == self.owner_uid

    def _credentials(self, scope: dict) -> list[bytes]:
        given = []
        for k, v in scope.get("headers", ()):
            k = k.lower()
            if k == OPERATOR_HEADER.encode():
                given.append(v)
            elif k == b"authorization" and v[:len(_BEARER)].lower() == _BEARER:
                given.append(v[len(_BEARER):])
        return given

    def _has_secret(self, scope: dict, loopback: bool) -> bool:
        if self.secret is None or not (loopback or scope.get("scheme") in ("https", "wss")):
            return False
        given = self._credentials(scope)
        return len(given) == 1 and hmac.compare_digest(given[0], self.secret)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or _public(scope):
            await self.app(scope, receive, send)
        elif self.allows(scope):
            # the secret goes no further: Flower's app, its logs and its plugins never see it
            headers = [(k, v) for k, v in scope.get("headers", ())
                       if k.lower() not in (OPERATOR_HEADER.encode(), b"authorization")]
            await self.app(dict(scope, headers=headers), receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accept: a 403
        else:
            await send({"type": "http.response.start", "status": 403,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(_REFUSAL)).encode()),
                                    (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": _REFUSAL})


def make_operator_secret(path: str | Path) -> Path:
    """A new random operator secret in ``path`` (created 0600, replacing an older one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    return path


def read_operator_secret(path: str | Path) -> bytes:
    """The secret in ``path``; refused when others may read the file or it is too short."""
    path = Path(path)
    try:
        mode, text = path.stat().st_mode, path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise PlasticError(f"cannot read the operator secret {path}: {e}") from None
    if mode & 0o077:
        raise PlasticError(f"the operator secret {path} is readable by others "
                           f"(mode {mode & 0o777:o}); chmod 600 it")
    if len(text) < MIN_SECRET_CHARS:
        raise PlasticError(f"the operator secret in {path} has {len(text)} characters; it "
                           f"needs at least {MIN_SECRET_CHARS}")
    return text.encode()


class OperatorSecretHeader:
    """A Flower HTTP client interceptor that sends the operator secret with each call."""

    def __init__(self, secret: bytes):
        self.secret = secret.decode()

    def intercept(self, context, call_next):
        context.request.headers[OPERATOR_HEADER] = self.secret
        return call_next(context)


def store_operator_secret(flwr_home: str | Path, address: str, secret_file: str | Path) -> None:
    """Let ``flwr`` (run with ``FLWR_HOME=flwr_home``) send the operator secret to the
    connection whose address is ``address``: Flower's CLI keeps the tokens of ``flwr login``
    in ``FLWR_HOME/credentials.yaml`` (0600) and sends the access token of a connection as
    ``Authorization: Bearer`` with every Control call, which the gate takes as the secret."""
    secret = read_operator_secret(secret_file)
    store = FileCredentialStore(Path(flwr_home) / "credentials.yaml")
    store.set(AUTHN_TYPE_STORE_KEY % address, AuthnType.OIDC.encode())
    store.set(ACCESS_TOKEN_STORE_KEY % address, secret)
    # Flower's CLI loads a token pair; the gate answers 403, never 401, so it is never used
    store.set(REFRESH_TOKEN_STORE_KEY % address, b"unused")


def operator_client(address: str, root_certificates: str | Path,
                    secret_file: str | Path) -> ControlHttpClient:
    """Flower's Control API client for an operator away from the SuperLink's host:
    ``address`` host:port over TLS, sending the operator secret (``flwr`` itself sends it
    when :func:`store_operator_secret` has put it in its FLWR_HOME)."""
    return ControlHttpClient.from_server_address(
        address, insecure=False, root_certificates=str(root_certificates),
        interceptors=[OperatorSecretHeader(read_operator_secret(secret_file)),
                      RuntimeVersionHttpInterceptor(component_name="flwr CLI")])


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as e:
        raise PlasticError(f"the SuperLink cannot listen on {host}:{port}: {e}") from None


def _resolve(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        try:
            return socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0]
        except OSError as e:
            raise PlasticError(f"the SuperLink's --host {host} does not resolve: {e}") from None


def serve(flower_args: list[str], secret: bytes | None) -> None:
    """Parse ``flower_args`` with ``flower-superlink``'s own parser (a private function of the
    pinned flwr 1.42), build Flower's app and serve it behind :class:`OperatorGate` until
    SIGINT/SIGTERM.

    A specific non-loopback ``--host`` is served on 127.0.0.1 as well, on the same port: the
    SuperExec and its ServerApps, which Flower points at the SuperLink's host, then reach
    the runtime routes over loopback, and so can the operator's ``flwr``.
    """
    for var in (FLWR_INTERNAL_GRPC_CONTROL_API, FLWR_INTERNAL_GRPC_FLEET_API):
        if os.environ.get(var) == "1":  # Flower's legacy gRPC APIs would bypass the gate
            raise PlasticError(f"{var}=1 starts a gRPC API outside the operator gate; unset it")
    sys.argv = ["flower-superlink", *flower_args]   # Flower's parser reads sys.argv
    config = _parse_superlink_lifespan_config()
    host = _resolve(config.host)
    sockets = [_listen(host, config.port)]
    if not is_loopback(host) and not ipaddress.ip_address(host).is_unspecified:
        sockets.append(_listen("127.0.0.1", config.port))
        config = dataclasses.replace(config, host="127.0.0.1")
    if not peers.AVAILABLE:
        log.warning("this system lists no socket owners: any local user on loopback is taken "
                    "for the operator of this SuperLink")
    app = OperatorGate(create_app(config, SuperLinkLifespan), secret)
    # proxy_headers off: the gate judges the TCP peer, never a header (or FORWARDED_ALLOW_IPS)
    server = uvicorn.Server(uvicorn.Config(
        app, host=host, port=config.port, lifespan="on", proxy_headers=False, access_log=True,
        log_config=get_uvicorn_log_config(console_handler.level), workers=1,
        ssl_keyfile=config.ssl_keyfile, ssl_certfile=config.ssl_certfile,
        # header size and time, idle keep-alive and open connections bounded before the gate
        **DEFAULT_LIMITS.uvicorn_options()))
    server.run(sockets=sockets)


def main(argv: list[str] | None = None) -> int:
    """``python -m plasticlm.fednl.deploy.superlink``: plasticlm's flags, then Flower's."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--operator-secret-file", type=Path, default=None)
    ours, flower_args = parser.parse_known_args(argv)
    try:
        secret = (read_operator_secret(ours.operator_secret_file)
                  if ours.operator_secret_file else None)
        serve(flower_args, secret)
    except PlasticError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

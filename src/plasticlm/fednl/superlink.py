"""plasticlm's SuperLink: Flower's own SuperLink app (``flwr.superlink.main.create_app`` of the
pinned flwr 1.42) behind an operator gate, so that only the operator commands the federation.

In Flower 1.42 the Fleet routes (``/v1/fleet/...``, the SuperNodes), the Control routes
(``/v1/control/...``: ``flwr run``, ``flwr supernode register``, ``flwr ls``) and the runtime
routes (``/v1/runtime/...``, the ServerApp) share one HTTP port, and open-source Control
authentication is a no-op. :class:`OperatorGate`, the outermost ASGI layer, lets through the
Fleet routes and ``/health`` from anyone and every other route only from loopback or with the
operator secret in the ``X-Plasticlm-Operator`` header (over TLS); anything else is a 403
before a byte of the body is read. Run it as
``python -m plasticlm.fednl.superlink [--operator-secret-file F] <flower-superlink flags>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hmac
import ipaddress
import os
import re
import secrets
import socket
import sys
from pathlib import Path

import uvicorn
from flwr.common.constant import FLWR_INTERNAL_GRPC_CONTROL_API, FLWR_INTERNAL_GRPC_FLEET_API
from flwr.supercore.control.control_http_client import ControlHttpClient
from flwr.supercore.http_logging import get_uvicorn_log_config
from flwr.supercore.interceptors.http.runtime_version import RuntimeVersionHttpInterceptor
from flwr.supercore.logger import console_handler
from flwr.superlink.cli.flower_superlink import SuperLinkLifespan, _parse_superlink_lifespan_config
from flwr.superlink.main import create_app

from plasticlm.errors import PlasticError
from plasticlm.listener import DEFAULT_LIMITS

OPERATOR_HEADER = "x-plasticlm-operator"
MIN_SECRET_CHARS = 32
# One path segment of lower-case letters and dashes: no "..", no "/", no percent-decoded
# tricks can turn a Fleet-looking path into another route.
_FLEET = re.compile(r"/v1/fleet/[a-z][a-z-]*")
_PUBLIC = {"/health"}
_REFUSAL = b'{"detail":"only the operator may use this route (loopback or operator secret)"}'


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


class OperatorGate:
    """Pure ASGI middleware in front of the SuperLink app.

    Passes ``/v1/fleet/<name>`` and ``/health`` from anyone (node authentication, when on,
    is Flower's own, inside); every other HTTP or WebSocket route only when the TCP peer is
    loopback or the request carries ``secret`` in ``X-Plasticlm-Operator`` over TLS (never
    in the clear). A refused request gets 403 and its body is never read. Other scopes
    (lifespan) pass unchanged. ``secret=None``: loopback only.
    """

    def __init__(self, app, secret: bytes | None = None):
        if secret is not None and len(secret) < MIN_SECRET_CHARS:
            raise PlasticError(f"the operator secret has {len(secret)} characters; it needs at "
                               f"least {MIN_SECRET_CHARS} (make_operator_secret makes one)")
        self.app, self.secret = app, secret

    def allows(self, scope: dict) -> bool:
        path = scope.get("path", "")
        if _FLEET.fullmatch(path) or path in _PUBLIC:
            return True
        client = scope.get("client")
        if client and is_loopback(client[0]):
            return True
        return self._has_secret(scope)

    def _has_secret(self, scope: dict) -> bool:
        if self.secret is None or scope.get("scheme") not in ("https", "wss"):
            return False
        given = [v for k, v in scope.get("headers", ()) if k.lower() == OPERATOR_HEADER.encode()]
        return len(given) == 1 and hmac.compare_digest(given[0], self.secret)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self.allows(scope):
            await self.app(scope, receive, send)
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


def operator_client(address: str, root_certificates: str | Path,
                    secret_file: str | Path) -> ControlHttpClient:
    """Flower's Control API client for an operator away from the SuperLink's host:
    ``address`` host:port over TLS, sending the operator secret (``flwr`` itself cannot add a
    header: from elsewhere it goes through an SSH tunnel to the SuperLink's loopback)."""
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
    """``python -m plasticlm.fednl.superlink``: plasticlm's flags, then Flower's."""
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

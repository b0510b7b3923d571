"""Transmitters and fusers that are not in this process: a peer service reached over HTTP
(:class:`RemotePeer`), caches that arrived in a request (:class:`Received`), and the fuser
registry, as a folder or a service (:func:`fuser_source`)."""

from __future__ import annotations

import copy
import functools
import threading
import time
from pathlib import Path

import httpx
import torch

from plasticlm.errors import PlasticError
from plasticlm.refine.cache import KVLayout
from plasticlm.refine.fusers.fuser import Fuser
from plasticlm.refine.peer import Transmission, text_digest
from plasticlm.refine.wire.codec import MAX_PAYLOAD_BYTES, PayloadError, decode_bundle, decode_fuser
from plasticlm.refine.wire.fuser_registry import check_name, load_registered, name_in_url
from plasticlm.refine.wire.serving import CONNECT_TIMEOUT


class PeerUnavailable(PlasticError):
    """A peer did not answer in time, refused the request, or could not be reached."""


def _headers(token: str | None) -> dict[str, str]:
    # identity: an answer's size on the wire is its size in memory (no compression bomb)
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return {"Accept-Encoding": "identity", **auth}


def http_client(timeout: float, verify: str | bool = True,
                connect: float = CONNECT_TIMEOUT) -> httpx.Client:
    """The HTTP client peers use: ``connect`` and ``timeout`` (read, write, pool) seconds;
    ``verify``: a CA bundle path for a private TLS CA. Redirects are never followed, so the
    token goes only to the address it was configured for."""
    return httpx.Client(timeout=httpx.Timeout(timeout, connect=min(connect, timeout)),
                        verify=verify, follow_redirects=False)


def call_peer(client: httpx.Client, method: str, url: str, token: str | None,
              max_bytes: int = MAX_PAYLOAD_BYTES, **kw) -> httpx.Response:
    """One request to a peer or registry, its answer read up to ``max_bytes`` (a peer cannot
    fill this process's memory); :class:`PeerUnavailable` names what went wrong."""
    try:
        request = client.build_request(method, url, headers=_headers(token), **kw)
        streamed = client.send(request, stream=True, follow_redirects=False)
        try:
            body = _read_limited(streamed, url, max_bytes)
            headers = [(k, v) for k, v in streamed.headers.items()
                       if k.lower() not in ("content-encoding", "content-length")]
            r = httpx.Response(streamed.status_code, headers=headers, content=body,
                               request=request)
        finally:
            streamed.close()
    except httpx.TimeoutException:
        raise PeerUnavailable(f"{url}: no answer within {client.timeout.read} s") from None
    except httpx.HTTPError as e:
        raise PeerUnavailable(f"{url}: unreachable ({type(e).__name__})") from None
    if r.is_redirect:
        raise PeerUnavailable(f"{url}: HTTP {r.status_code} redirect, not followed (the token "
                              "goes only to the configured address)")
    if not r.is_success:
        try:
            detail = r.json().get("detail", r.text)
        except (ValueError, AttributeError):
            detail = r.text
        raise PeerUnavailable(f"{url}: HTTP {r.status_code}: {str(detail)[:300]}")
    return r


def _read_limited(r: httpx.Response, url: str, max_bytes: int) -> bytes:
    declared = r.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise PeerUnavailable(f"{url}: an answer of {declared} bytes exceeds the limit of "
                              f"{max_bytes}")
    chunks, size = [], 0
    for chunk in r.iter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise PeerUnavailable(f"{url}: the answer exceeds the limit of {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class RemotePeer:
    """A transmitter served by ``plasticlm refine serve`` at ``url``; its caches travel
    through the codec (quantised as ``quant``) and are checked on arrival."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0,
                 quant: str = "bf16", verify: str | bool = True,
                 max_bytes: int = MAX_PAYLOAD_BYTES, connect: float = CONNECT_TIMEOUT):
        self.url = url.rstrip("/")
        self.token, self.quant, self.max_bytes = token, quant, max_bytes
        self.client = http_client(timeout, verify, connect)
        self._info: dict | None = None

    def using(self, quant: str) -> RemotePeer:
        """This peer (same connection), asked for caches quantised as ``quant``."""
        other = copy.copy(self)
        other.quant = quant
        return other

    def connect(self) -> RemotePeer:
        """This peer, once it has answered ``/info`` (:class:`PeerUnavailable` if not)."""
        _ = self.info
        return self

    @property
    def info(self) -> dict:
        if self._info is None:
            info = call_peer(self.client, "GET", f"{self.url}/info", self.token,
                             self.max_bytes).json()
            try:
                check_name(info.get("name") if isinstance(info, dict) else None,
                           "the name it gives")
            except PlasticError as e:
                raise PeerUnavailable(f"{self.url}: {e}") from None
            self._info = info
        return self._info

    @property
    def name(self) -> str:
        return self.info["name"]

    @functools.cached_property
    def layout(self) -> KVLayout:
        i = self.info
        return KVLayout(i["model_type"], i["num_layers"], i["num_kv_heads"], i["head_dim"],
                        torch.tensor(i["inv_freq"]), float(i["rope_scaling"]))

    def prefill(self, text: str, draft_tokens: int = 0, layers: list[int] | None = None,
                share: str = "all") -> Transmission:
        t0 = time.perf_counter()
        r = call_peer(self.client, "POST", f"{self.url}/prefill", self.token, self.max_bytes,
                  json={"text": text, "draft_tokens": draft_tokens, "layers": layers,
                        "share": share, "quant": self.quant})
        total = time.perf_counter() - t0
        _, (sent,) = decode_bundle(r.content, self.max_bytes)
        prefill = float(r.headers.get("x-prefill-seconds", 0.0))
        sent.seconds = {"prefill": prefill, "transfer": max(0.0, total - prefill)}
        sent.wire_bytes = len(r.content)   # the text sent is counted by the mode
        if sent.text_sha256 != text_digest(text):
            raise PayloadError(f"{self.url} sent a cache of another text")
        return sent

    def generate(self, text: str, max_new_tokens: int, stop: tuple[str, ...] = ("\n",)) -> str:
        r = call_peer(self.client, "POST", f"{self.url}/generate", self.token, self.max_bytes,
                  json={"text": text, "max_new_tokens": max_new_tokens, "stop": list(stop)})
        return r.json()["text"]


class Received:
    """A transmitter whose cache (or t2t background) came with the request: it can only
    give back what it sent, for the text it sent it for."""

    def __init__(self, transmission: Transmission | None = None, background: str = "",
                 name: str = ""):
        self.transmission, self.background = transmission, background
        self.name = transmission.cache.model_name if transmission else name

    @property
    def layout(self) -> KVLayout:
        if self.transmission is None:
            raise PayloadError(f"{self.name} sent no cache")
        return self.transmission.cache.layout

    def prefill(self, text: str, draft_tokens: int = 0, layers: list[int] | None = None,
                share: str = "all") -> Transmission:
        tr = self.transmission
        if tr is None:
            raise PayloadError(f"{self.name} sent a background text, not a cache")
        if tr.text_sha256 != text_digest(text):
            raise PayloadError(f"the cache from {self.name} was made for another text than "
                               "the prompt (or its rephrasing)")
        missing = sorted(set(layers or []) - set(tr.layers))
        if missing:
            raise PayloadError(f"the cache from {self.name} lacks layers {missing}, which the "
                               "fuser reads")
        if (share == "draft") != bool(tr.first):
            raise PayloadError(f"the cache from {self.name} does not share what the fuser "
                               f"reads (share={share!r})")
        return tr

    def generate(self, text: str, max_new_tokens: int, stop: tuple[str, ...] = ("\n",)) -> str:
        return self.background


class FuserSource:
    """Fusers per ordered pair, from a registry folder or a registry service (fetched once,
    then kept)."""

    def __init__(self, where: str, token: str | None = None, timeout: float = 30.0,
                 verify: str | bool = True, connect: float = CONNECT_TIMEOUT):
        self.where = where
        self.remote = where.startswith(("http://", "https://"))
        if not self.remote and not Path(where).is_dir():
            raise PlasticError(f"fuser registry {where} is not a folder or an http(s) URL")
        self.token = token
        self.client = http_client(timeout, verify, connect) if self.remote else None
        self._cache: dict[tuple[str, str], Fuser] = {}
        self._lock = threading.Lock()

    def fuser(self, transmitter: str, receiver: str) -> Fuser:
        key = (transmitter, receiver)
        with self._lock:
            if key not in self._cache:
                self._cache[key] = self._fetch(*key)
            return self._cache[key]

    def _fetch(self, transmitter: str, receiver: str) -> Fuser:
        if not self.remote:
            return load_registered(self.where, transmitter, receiver)
        url = (f"{self.where.rstrip('/')}/fusers/{name_in_url(transmitter, 'transmitter')}/"
               f"{name_in_url(receiver, 'receiver')}")
        try:
            r = call_peer(self.client, "GET", url, self.token)
        except PeerUnavailable as e:
            raise PlasticError(f"no fuser {transmitter} -> {receiver} from the registry: {e}"
                               ) from None
        return decode_fuser(r.content)

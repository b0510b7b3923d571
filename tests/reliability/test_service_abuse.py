"""FedRefine services abused as an attacker would: oversized and hostile requests to every
endpoint of a peer (`refine serve`) and of the registry, each refused with its 4xx/503 before
the body is read or any model runs, with memory bounded while it is refused; crafted model
names that would redirect the token; tokens too short to be secret; clients without
timeouts. In process (httpx's ASGI transport) and over a real uvicorn on 127.0.0.1."""

import asyncio
import socket
import threading
import time
import tracemalloc
from contextlib import contextmanager

import httpx
import psutil
import pytest
import uvicorn

from plasticlm.cli import main
from plasticlm.config import from_dict
from plasticlm.errors import PlasticError
from plasticlm.models import build_tiny, train_bpe_tokenizer
from plasticlm.refine.peer import Peer
from plasticlm.refine.wire.codec import encode_bundle
from plasticlm.refine.wire.remote import FuserSource, PeerUnavailable, RemotePeer, http_client
from plasticlm.refine.wire.service import peer_app, registry_app
from plasticlm.refine.wire.serving import ServiceConfig

pytestmark = pytest.mark.usefixtures("one_thread")

TOKEN = "abuse-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RAW_AUTH = (b"authorization", AUTH["Authorization"].encode())
MB = 2**20
PEER_POSTS = ("/prefill", "/generate", "/answer", "/ask")
LIMITS = dict(max_payload_bytes=MB, max_choices=4, max_choice_tokens=8, max_prompt_tokens=32,
              max_new_tokens=8)


@pytest.fixture(scope="module")
def peer() -> Peer:
    """A random tiny Qwen3 with a byte-level BPE tokenizer: real tokenizing and forwards, no
    training (the guards refuse before either matters)."""
    tok = train_bpe_tokenizer(["the cat sat on the mat. the dog ran to the park."] * 20,
                              vocab_size=300)
    model = build_tiny("qwen3", vocab_size=len(tok), hidden_size=32, num_layers=2,
                       num_heads=2, num_kv_heads=1, head_dim=16)
    return Peer("tiny", model, tok)


def _config(**kw) -> ServiceConfig:
    return ServiceConfig(token=TOKEN, **{**LIMITS, **kw})


def _call(app, method: str, path: str, **kw) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                     base_url="http://peer") as c:
            return await c.request(method, path, **kw)
    return asyncio.run(go())


@contextmanager
def bounded(limit_mb: float):
    """Fails unless Python's peak allocations (tracemalloc) and the process's RSS (sampled
    every 2 ms) grow by less than ``limit_mb`` inside the block."""
    proc, stop, peak = psutil.Process(), threading.Event(), [0]
    base = proc.memory_info().rss

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss - base)
            time.sleep(0.002)
    sampler = threading.Thread(target=sample, daemon=True)
    tracemalloc.start()
    sampler.start()
    try:
        yield
    finally:
        _, py_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        stop.set()
        sampler.join()
    assert py_peak < limit_mb * MB, f"Python allocations peaked at {py_peak / MB:.1f} MB"
    assert peak[0] < limit_mb * MB, f"RSS grew by {peak[0] / MB:.1f} MB"


def _chunks(n_mb: int, sent: list[int]):
    chunk = b"x" * MB     # one buffer sent n_mb times: the client holds 1 MB, not n_mb
    for _ in range(n_mb):
        sent[0] += 1
        yield chunk


def _stream(n_mb: int, sent: list[int]):
    """An async chunked body of ``n_mb`` MB (no Content-Length), counting what is sent."""
    async def body():
        for chunk in _chunks(n_mb, sent):
            yield chunk
    return body()


# --- the body: declared and streamed sizes, the token before either ---------------------------

def _raw(app, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, int]:
    """(status, receive calls) of one POST straight through ASGI, with a body that counts
    every read and would be endless."""
    reads, status = [0], []

    async def receive():
        reads[0] += 1
        return {"type": "http.request", "body": b"x" * 65536, "more_body": True}

    async def send(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": headers, "http_version": "1.1",
             "scheme": "http", "server": ("peer", 80), "client": ("10.0.0.9", 5)}
    asyncio.run(app(scope, receive, send))
    return status[0], reads[0]


@pytest.mark.parametrize("path", PEER_POSTS)
def test_huge_declared_length_and_a_missing_token_are_refused_before_any_read(peer, path):
    app = peer_app(peer, None, _config())
    huge = [(b"content-length", str(10**12).encode())]
    assert _raw(app, path, [*huge, RAW_AUTH]) == (413, 0)
    assert _raw(app, path, huge) == (401, 0)                                 # no token
    assert _raw(app, path, [*huge, (b"authorization", b"Bearer " + b"x" * 27)]) == (401, 0)
    assert _raw(app, path, [*huge, RAW_AUTH, RAW_AUTH]) == (401, 0)          # two tokens
    for bad in (b"-5", b"12, 12", b"0x10"):
        assert _raw(app, path, [(b"content-length", bad), RAW_AUTH]) == (400, 0)
    assert _raw(registry_app(".", _config()), "/pairs", huge) == (401, 0)


@pytest.mark.parametrize("path", PEER_POSTS)
def test_a_200_mb_chunked_body_is_refused_while_it_streams(peer, path):
    app, sent = peer_app(peer, None, _config()), [0]
    with bounded(16):
        r = _call(app, "POST", path, content=_stream(200, sent), headers=AUTH)
    assert r.status_code == 413 and "exceeds the limit" in r.json()["detail"]
    assert sent[0] <= 3          # read up to the limit (1 MB) and one chunk past it
    sent[0] = 0
    assert _call(app, "POST", path, content=_stream(200, sent)).status_code == 401
    assert sent[0] == 0          # without the token not one byte is read


@contextmanager
def _uvicorn(app):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_over_uvicorn_the_refusal_closes_the_connection_with_memory_bounded(peer):
    with _uvicorn(peer_app(peer, None, _config())) as port:
        url, sent = f"http://127.0.0.1:{port}", [0]
        with bounded(48):
            r = httpx.post(f"{url}/answer", content=_chunks(200, sent), headers=AUTH,
                           timeout=30)
        assert r.status_code == 413 and r.headers["connection"] == "close"
        assert sent[0] < 50      # the server closed: the client stopped sending
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /ask HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n"
                      b"Authorization: " + AUTH["Authorization"].encode() + b"\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 413")
        assert httpx.get(f"{url}/health").status_code == 200   # and it keeps serving


# --- what a request may ask: choices, tokens --------------------------------------------------

def _ask(**kw) -> dict:
    return {"prompt": "the cat sat on the", "mode": "alone", "choices": ["mat", "park"], **kw}


HOSTILE = {
    "too many choices": (_ask(choices=["mat"] * 5), "max_choices"),
    "a too long choice": (_ask(choices=["mat", "the cat sat " * 20]), "max_choice_tokens"),
    "too many prompt tokens": (_ask(prompt="the dog ran " * 40), "max_prompt_tokens"),
    "too many new tokens": (_ask(choices=[], max_new_tokens=9), "max_new_tokens"),
}


@pytest.mark.parametrize("what", HOSTILE)
def test_choices_and_tokens_past_their_limits_are_refused(peer, what):
    body, setting = HOSTILE[what]
    app = peer_app(peer, None, _config())
    assert _call(app, "POST", "/ask", json=_ask(), headers=AUTH).status_code == 200
    with bounded(16):
        r = _call(app, "POST", "/ask", json=body, headers=AUTH)
    assert r.status_code == 413 and setting in r.json()["detail"], r.text
    # the same request inside an /answer bundle (t2t: a background text, no cache)
    bundle = encode_bundle([], {**body, "background": ["a park"], "mode": "t2t"}, "bf16")
    r = _call(app, "POST", "/answer", content=bundle, headers=AUTH)
    assert r.status_code == 413 and setting in r.json()["detail"], r.text


def test_prefill_and_generate_limits(peer):
    app = peer_app(peer, None, _config())
    long = "the dog ran " * 40
    for path, body in [("/prefill", {"text": long}), ("/generate", {"text": long}),
                       ("/prefill", {"text": "the cat", "draft_tokens": 9}),
                       ("/generate", {"text": "the cat", "max_new_tokens": 9})]:
        r = _call(app, "POST", path, json=body, headers=AUTH)
        assert r.status_code == 413, (path, body, r.text)
    assert _call(app, "POST", "/generate", json={"text": "the cat", "max_new_tokens": 8},
                 headers=AUTH).status_code == 200


# --- requests in flight -----------------------------------------------------------------------

SHORT = {"text": "the cat", "max_new_tokens": 4}


def test_a_concurrent_flood_gets_503_beyond_max_concurrent(peer, monkeypatch):
    release, entered = threading.Event(), []

    def held(text, max_new_tokens, stop):
        entered.append(text)
        release.wait(timeout=20)
        return "held"
    monkeypatch.setattr(peer, "generate", held)
    app = peer_app(peer, None, _config(max_concurrent=2))

    async def flood():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                     base_url="http://peer", timeout=30) as c:
            tasks = [asyncio.create_task(c.post("/generate", json=SHORT, headers=AUTH)) for _ in range(10)]
            for _ in range(300):       # until those beyond the limit have their answer
                if sum(t.done() for t in tasks) >= 8:
                    break
                await asyncio.sleep(0.01)
            release.set()
            return await asyncio.gather(*tasks)
    answers = asyncio.run(flood())
    assert sorted(r.status_code for r in answers) == [200] * 2 + [503] * 8
    assert len(entered) == 2 and all(r.headers.get("retry-after") == "1"
                                     for r in answers if r.status_code == 503)
    assert _call(app, "POST", "/generate", json=SHORT, headers=AUTH).json() == {"text": "held"}                                   # the slots were given back


# --- names, redirects, timeouts: the token goes only where it was configured to go -----------

CRAFTED = ["../admin", "..", "a/b", "x?token=1", "x#frag", ".hidden", "a" * 200, "", "a b",
           "caf\u00e9", "%2e%2e"]


def test_crafted_names_never_reach_a_url():
    seen = []

    def registry(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(404, json={"detail": "no such fuser"})
    source = FuserSource("http://registry.example:8700", TOKEN)
    source.client = httpx.Client(transport=httpx.MockTransport(registry))
    for name in CRAFTED:
        for pair in ((name, "receiver"), ("receiver", name)):
            with pytest.raises(PlasticError, match="is not a model name"):
                source.fuser(*pair)
    assert seen == []
    with pytest.raises(PlasticError, match="404"):
        source.fuser("transmitter-llama", "receiver")
    assert seen == ["http://registry.example:8700/fusers/transmitter-llama/receiver"]


def test_the_registry_refuses_crafted_names_in_its_path(tmp_path):
    app = registry_app(str(tmp_path), _config())
    for segment in ("%2E%2E", ".hidden", "a%3Fb", "a%23b", "a" * 200, "a%20b"):
        r = _call(app, "GET", f"/fusers/{segment}/receiver", headers=AUTH)
        assert r.status_code == 400 and "is not a model name" in r.json()["detail"], segment
    assert _call(app, "GET", "/fusers/a%2Fb/receiver", headers=AUTH).status_code == 404
    r = _call(app, "GET", "/fusers/transmitter/receiver", headers=AUTH)
    assert r.status_code == 404 and "no fuser transmitter -> receiver" in r.json()["detail"]


def _answering(status: int, body: bytes = b"{}", headers: tuple = (), seen=None):
    """A bare ASGI service answering every request the same way (``seen``: what reached it)."""
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if seen is not None:
            seen.append((scope["path"], dict(scope["headers"]).get(b"authorization")))
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), *headers]})
        await send({"type": "http.response.body", "body": body})
    return app


def test_redirects_and_hostile_peer_names_are_not_followed():
    stolen = []
    with _uvicorn(_answering(200, seen=stolen)) as evil:
        away = (b"location", f"http://127.0.0.1:{evil}/steal".encode())
        with _uvicorn(_answering(307, headers=(away,))) as port:
            url = f"http://127.0.0.1:{port}"
            with pytest.raises(PlasticError, match="redirect, not followed"):
                FuserSource(url, TOKEN).fuser("transmitter", "receiver")
            with pytest.raises(PeerUnavailable, match="redirect, not followed"):
                RemotePeer(url, TOKEN).connect()
        assert stolen == []
    with _uvicorn(_answering(200, b'{"name": "../admin"}')) as port:
        with pytest.raises(PeerUnavailable, match="'../admin' is not a model name"):
            RemotePeer(f"http://127.0.0.1:{port}", TOKEN).connect()


def _flooding(n_mb: int, declared: bool):
    """A hostile peer answering every request with ``n_mb`` MB (chunked, or declared)."""
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        size = [(b"content-length", str(n_mb * MB).encode())] if declared else []
        await send({"type": "http.response.start", "status": 200, "headers": size})
        chunk = b"x" * MB
        for _ in range(n_mb):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    return app


@pytest.mark.parametrize("declared", [False, True], ids=["chunked", "declared"])
def test_a_peer_answering_200_mb_is_cut_off_at_the_limit(declared):
    with _uvicorn(_flooding(200, declared)) as port:
        with bounded(48), pytest.raises(PeerUnavailable, match="exceeds the limit of 1048576"):
            RemotePeer(f"http://127.0.0.1:{port}", TOKEN, 30.0, max_bytes=MB).connect()


def test_every_client_has_connect_and_read_timeouts():
    for client in (http_client(7.0), RemotePeer("http://127.0.0.1:9", TOKEN, 7.0).client,
                   FuserSource("http://127.0.0.1:9", TOKEN, 7.0, connect=2.0).client):
        assert client.timeout.read == 7.0 and 0 < client.timeout.connect <= 5.0
        assert client.follow_redirects is False
    silent = socket.socket()           # accepts connections, never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    try:
        t0 = time.perf_counter()
        with pytest.raises(PeerUnavailable, match="no answer within 0.5 s"):
            RemotePeer(f"http://127.0.0.1:{silent.getsockname()[1]}", TOKEN, 0.5).connect()
        assert time.perf_counter() - t0 < 5
    finally:
        silent.close()


# --- the token at start-up ----------------------------------------------------------------------

def _never_serve(*args, **kw):
    pytest.fail("the service started: the token should have been refused first")


@pytest.mark.parametrize("token", ["", "short-token"])
def test_an_empty_or_short_token_is_refused_at_start_up(token, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr("plasticlm.refine.wire.serving.serve", _never_serve)
    monkeypatch.setenv("PLASTICLM_TOKEN", token)
    for argv in (["refine", "registry", "--folder", str(tmp_path)],
                 ["refine", "serve", "--model", "sandbox:receiver"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "PLASTICLM_TOKEN is" in err[0] and "at least 16" in err[0]
    with pytest.raises(PlasticError, match="config token: .*at least 16"):
        from_dict(ServiceConfig, {"token": token})


def test_no_token_beyond_loopback_and_no_token_on_the_command_line(monkeypatch, capsys,
                                                                   tmp_path):
    monkeypatch.setattr("plasticlm.refine.wire.serving.serve", _never_serve)
    monkeypatch.delenv("PLASTICLM_TOKEN", raising=False)
    assert main(["refine", "registry", "--folder", str(tmp_path), "--host", "0.0.0.0"]) == 2
    assert "serving on 0.0.0.0 needs a token" in capsys.readouterr().err
    monkeypatch.setenv("PLASTICLM_TOKEN", TOKEN)
    assert main(["refine", "registry", "--folder", str(tmp_path), "--set",
                 f"token={TOKEN}"]) == 2
    assert "read from $PLASTICLM_TOKEN only" in capsys.readouterr().err

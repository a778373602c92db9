"""Runs one vLLM engine (``vllm.LLM``, in this process) through a script of
phases and reports what it generated and what vLLM's counters saw.

This is how kvc's tests and benchmarks drive a real engine: one engine per
process (vLLM keeps process-wide state), started the way a server starts
it, with or without kvc's connector::

    python -m kvc.vllm_engine spec.json result.json

``spec.json``::

    {"model": "/models/llama", "dtype": "bfloat16", "block_size": 32,
     "kv_cache_dtype": "auto",   # or fp8 (E4M3), fp8_e5m2
     "tensor_parallel_size": 1,  # > 1: worker processes, a core each
     "prefix_caching": false, "max_model_len": 1024,
     "connector": {"stores": ["file:///tmp/store"], ...},   # or null
     "role": "kv_both",    # the connector's kv_role (kv_producer, kv_consumer)
     "failure_policy": "recompute",
     "transfer": null,     # or another connector's KVTransferConfig fields
     "lora": {"max_rank": 8, "adapters": {"a": "/adapters/a"}},  # or absent
     "settle": true,       # kvc's saves written after each generate phase
     "kv_events": false,   # vLLM publishes KV events; the phases report them
     "phases": [
       {"generate": [{"tokens": [1, 2, ...], "salt": "a", "lora": "a"},
                     ...],
        "max_tokens": 8},
       {"abort": {"generate": [...], "steps": 3, "abort": [0]},
        "max_tokens": 8},              # aborts prompt 0 after 3 steps
       {"settle": true},               # kvc's saves written
       {"corrupt": "/tmp/store"},      # flips bytes in one stored object
       {"remove": "/tmp/store"}        # the store goes away
     ]}

``result.json``: ``{"start_seconds": s, "phases": [{"outputs": [[token,
...], ...], "seconds": s, "ttft": [s, ...], "prefill_seconds": [s, ...],
"decisions": [...], "counters": {name: delta}} or {"error": "..."}]}``:
per request its first token's latency and its time from scheduled to first
token (vLLM's request stats), and the decisions the scheduler-side
connector made in the phase (``kvc.vllm.DecisionRecord``). Counters are vLLM's own (``LLM.get_metrics``):
``vllm:prefix_cache_hits``, ``vllm:external_prefix_cache_hits`` and their
queries, and kvc's ``vllm:kvc_*`` (``vllm:kvc_decisions{strategy=S}`` per
strategy), as the phase changed them. With ``kv_events``, each phase's
``events``: the KV events a subscriber received during it (``{"type":
"stored" | "removed" | "cleared", "medium": ..., "block_hashes": [...],
"tokens": n}``). With kvc's connector, also
``prefill_steps`` (the steps its scheduler side timed vLLM's prefill by:
``[tokens, seconds]`` each) and ``prefill_fit`` (``[a, b]``: seconds =
a + b * tokens, or null), and ``counters``: every counter as the run
left it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["corrupt_one_object", "main", "run_engine", "stored_objects"]

_COUNTERS = ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries",
             "vllm:external_prefix_cache_hits",
             "vllm:external_prefix_cache_queries", "vllm:num_preemptions")


def _counters(llm: Any) -> dict[str, float]:
    """vLLM's counters of _COUNTERS and kvc's (``vllm:kvc_*``; a
    histogram's as ``NAME_count`` and ``NAME_sum``), summed over their
    labels but ``strategy``, which names its own."""
    values = dict.fromkeys(_COUNTERS, 0.0)
    for metric in llm.get_metrics():
        name = metric.name
        if name.startswith("vllm:kvc_") and "strategy" in metric.labels:
            name += "{strategy=%s}" % metric.labels["strategy"]
        if hasattr(metric, "count"):  # a histogram: its count and sum
            if name.startswith("vllm:kvc_"):
                for part in ("count", "sum"):
                    key = f"{name}_{part}"
                    values[key] = values.get(key, 0.0) + \
                        float(getattr(metric, part))
        elif name in values or name.startswith("vllm:kvc_"):
            values[name] = values.get(name, 0.0) + \
                float(getattr(metric, "value", 0) or 0)
    return values


class _EventSubscriber:
    """A KV-aware router's view of the engine: subscribes to vLLM's KV event
    publisher (ZMQ) and keeps what it receives, decoded."""

    def __init__(self, endpoint: str) -> None:
        import threading

        import zmq

        self._socket: Any = zmq.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.connect(endpoint)
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._running = True
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        while self._running:
            if not self._socket.poll(50):
                continue
            _, _, payload = self._socket.recv_multipart()
            batch = decoder.decode(payload)
            with self._lock:
                self._events.extend(_event_json(e) for e in batch.events)

    def take(self, settle: float = 0.5) -> list[dict[str, Any]]:
        """What arrived so far, after ``settle`` seconds for the last."""
        time.sleep(settle)
        with self._lock:
            events, self._events = self._events, []
        return events

    def close(self) -> None:
        self._running = False
        self._thread.join()
        self._socket.close(linger=0)


def _event_json(event: Any) -> dict[str, Any]:
    def hashes() -> list[Any]:
        return [h.hex() if isinstance(h, bytes) else h
                for h in event.block_hashes]

    kind = type(event).__name__
    if kind == "BlockStored":
        return {"type": "stored", "medium": event.medium,
                "block_hashes": hashes(), "tokens": len(event.token_ids)}
    if kind == "BlockRemoved":
        return {"type": "removed", "medium": event.medium,
                "block_hashes": hashes()}
    return {"type": "cleared"}


def stored_objects(store: Path) -> list[Path]:
    """The stored objects of a file:// store's directory, in name order:
    not its layout records, nor writes still in its temporary folder."""
    return sorted(p for p in store.rglob("*")
                  if p.is_file() and "layouts" not in p.parts
                  and ".tmp" not in p.parts)


def corrupt_one_object(store: Path) -> Path:
    """Flips 16 bytes in the middle of one stored object of a file:// store
    (not a layout record), one of a whole chunk (the largest: a prompt's
    partial last chunk, which a load of whole chunks never reads, is
    smaller); returns its path."""
    objects = stored_objects(store)
    if not objects:
        raise FileNotFoundError(f"{store} holds no object")
    largest = max(p.stat().st_size for p in objects)
    whole = [p for p in objects if p.stat().st_size == largest]
    victim = whole[len(whole) // 2]
    data = bytearray(victim.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0xFF
    victim.write_bytes(bytes(data))
    return victim


def run_engine(spec: dict[str, Any]) -> dict[str, Any]:
    """Starts the engine ``spec`` describes and runs its phases."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm.config import KVTransferConfig

    transfer = None
    if spec.get("transfer") is not None:
        transfer = KVTransferConfig(**spec["transfer"])
    elif spec.get("connector") is not None:
        transfer = KVTransferConfig(
            kv_connector="KvcConnector", kv_connector_module_path="kvc.vllm",
            kv_role=spec.get("role", "kv_both"),
            kv_load_failure_policy=spec.get("failure_policy", "recompute"),
            kv_connector_extra_config=spec["connector"])
    began = time.perf_counter()
    subscriber = None
    if spec.get("kv_events"):
        endpoint = f"ipc://{tempfile.mkdtemp(prefix='kvc-events-')}/events"
        subscriber = _EventSubscriber(endpoint)
        spec = {**spec, "kv_events_endpoint": endpoint}
    try:
        llm = _start(spec, transfer)
    except Exception as error:  # noqa: BLE001 - reported to the caller
        return {"start_error": f"{type(error).__name__}: {error}"}
    result: dict[str, Any] = {"start_seconds": time.perf_counter() - began,
                              "phases": []}
    try:
        _run_phases(llm, spec, result, subscriber)
    finally:
        if subscriber is not None:
            subscriber.close()
    # Counters as the run left them (some move between phases: a save's
    # writes end while the engine settles).
    result["counters"] = _counters(llm)
    connector = _scheduler_connector(llm)
    if connector is not None:
        # The prefill steps kvc priced vLLM by, and the fit through them.
        clock = connector.prefill_clock
        result["prefill_steps"] = clock.samples
        result["prefill_fit"] = clock.fit
    return result


def _run_phases(llm: Any, spec: dict[str, Any], result: dict[str, Any],
                subscriber: _EventSubscriber | None) -> None:
    """Runs the spec's phases (until one fails), each with the KV events
    that arrived during it."""
    for phase in spec["phases"]:
        _run_phase(llm, spec, phase, result)
        if subscriber is not None and result["phases"]:
            result["phases"][-1]["events"] = subscriber.take()
        if "error" in result["phases"][-1]:
            break


def _run_phase(llm: Any, spec: dict[str, Any], phase: dict[str, Any],
               result: dict[str, Any]) -> None:
    """Runs one phase, its report appended to ``result``'s phases."""
    if "corrupt" in phase:
        corrupt_one_object(Path(phase["corrupt"]))
        result["phases"].append({})
        return
    if "remove" in phase:
        shutil.rmtree(phase["remove"], ignore_errors=True)
        result["phases"].append({})
        return
    if "abort" in phase:
        result["phases"].append(_abort(llm, phase))
        return
    if "reset_prefix_cache" in phase:
        result["phases"].append({"reset": _reset_prefix_cache(llm)})
        return
    if "settle" in phase:
        result["phases"].append({"settled": _settle(llm)})
        return
    result["phases"].append(_generate(
        llm, phase, (spec.get("lora") or {}).get("adapters", {})))
    if "error" not in result["phases"][-1] and spec.get("settle", True):
        # What the phase saved is in the store before the next one.
        _settle(llm)


def _reset_prefix_cache(llm: Any, steps: int = 1000) -> bool:
    """Empties vLLM's prefix cache. Blocks a connector's save still holds
    are freed at a step of the engine, which the offline engine takes only
    while it has requests: it is stepped until they are."""
    for _ in range(steps):
        if llm.reset_prefix_cache():
            return True
        llm.llm_engine.step()
        time.sleep(0.001)
    return False


def _settle(llm: Any, seconds: float = 300.0) -> bool:
    """Steps the engine until kvc's worker reported every save done, then
    waits for their writes: what was saved is in the store."""
    from vllm.distributed.kv_transfer import (get_kv_transfer_group,
                                              has_kv_transfer_group)

    from .vllm import KvcConnector

    if not has_kv_transfer_group():
        return True
    worker = get_kv_transfer_group()
    if not isinstance(worker, KvcConnector):
        return True
    deadline = time.monotonic() + seconds
    while worker.saves_in_flight and time.monotonic() < deadline:
        llm.llm_engine.step()
        time.sleep(0.001)
    return not worker.saves_in_flight and \
        worker.flush_saves(max(0.0, deadline - time.monotonic()))


def _start(spec: dict[str, Any], transfer: Any) -> Any:
    from vllm import LLM
    from vllm.config import KVEventsConfig

    events = None if not spec.get("kv_events_endpoint") else KVEventsConfig(
        enable_kv_cache_events=True, publisher="zmq",
        endpoint=spec["kv_events_endpoint"])
    lora = spec.get("lora")
    adapters: dict[str, Any] = {} if lora is None else dict(
        enable_lora=True, max_lora_rank=int(lora.get("max_rank", 8)),
        max_loras=max(1, len(lora["adapters"])))
    tp = int(spec.get("tensor_parallel_size", 1))
    if tp > 1:
        # vLLM's CPU workers bind their threads to NUMA nodes, one each
        # unless told which cores: here a core of this process's each.
        cores = sorted(os.sched_getaffinity(0))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(
            str(cores[rank % len(cores)]) for rank in range(tp)))
    return LLM(model=spec["model"], skip_tokenizer_init=True,
               tensor_parallel_size=tp,
               dtype=spec.get("dtype", "bfloat16"),
               kv_cache_dtype=spec.get("kv_cache_dtype", "auto"),
               block_size=int(spec.get("block_size", 32)),
               max_model_len=int(spec.get("max_model_len", 1024)),
               max_num_seqs=int(spec.get("max_num_seqs", 16)),
               enable_prefix_caching=bool(spec.get("prefix_caching", True)),
               distributed_executor_backend="uni" if tp == 1 else "mp",
               enforce_eager=True,
               disable_log_stats=False, seed=0,
               num_gpu_blocks_override=spec.get("num_gpu_blocks"),
               kv_transfer_config=transfer, kv_events_config=events,
               **adapters)


def _generate(llm: Any, phase: dict[str, Any],
              adapters: dict[str, str]) -> dict[str, Any]:
    """Generates the phase's prompts (greedy) as one batch."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    prompts, loras = [], []
    names = sorted(adapters)
    for p in phase["generate"]:
        prompt = TokensPrompt(prompt_token_ids=list(p["tokens"]))
        if p.get("salt"):
            prompt["cache_salt"] = str(p["salt"])
        prompts.append(prompt)
        name = p.get("lora")
        loras.append(None if name is None else LoRARequest(
            name, names.index(name) + 1, adapters[name]))
    params = SamplingParams(max_tokens=int(phase.get("max_tokens", 8)),
                            temperature=0.0, ignore_eos=True)
    connector = _scheduler_connector(llm)
    decided = len(connector.decisions) if connector is not None else 0
    before = _counters(llm)
    began = time.perf_counter()
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False,
                               lora_request=loras if any(loras) else None)
    except Exception as error:  # noqa: BLE001 - reported to the caller
        return {"error": f"{type(error).__name__}: {error}"}
    seconds = time.perf_counter() - began
    after = _counters(llm)
    ttft, prefill = [], []
    for out in outputs:
        stats = getattr(out, "metrics", None)
        ttft.append(float(getattr(stats, "first_token_latency", 0) or 0))
        prefill.append(float(getattr(stats, "first_token_ts", 0) -
                             getattr(stats, "scheduled_ts", 0)))
    decisions = [] if connector is None else \
        [dataclasses.asdict(d) for d in list(connector.decisions)[decided:]]
    return {
        "outputs": [list(o.outputs[0].token_ids) for o in outputs],
        "finish_reasons": [o.outputs[0].finish_reason for o in outputs],
        "seconds": seconds, "ttft": ttft, "prefill_seconds": prefill,
        "decisions": decisions,
        "counters": {k: v - before.get(k, 0.0) for k, v in after.items()}}


def _abort(llm: Any, phase: dict[str, Any]) -> dict[str, Any]:
    """Adds the phase's prompts, steps the engine ``steps`` times, aborts
    the prompts at ``abort`` (indices), and steps until every request
    ended and no block is held; each request's tokens (None: aborted)
    and vLLM's free blocks against its pool's."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=int(phase.get("max_tokens", 8)),
                            temperature=0.0, ignore_eos=True)
    engine = llm.llm_engine
    ids = [f"abort-{i}-{time.monotonic_ns()}" for i in range(
        len(phase["abort"]["generate"]))]
    for rid, p in zip(ids, phase["abort"]["generate"]):
        engine.add_request(rid, TokensPrompt(prompt_token_ids=p["tokens"]),
                           params)
    outputs: dict[str, list[int]] = {}
    for _ in range(int(phase["abort"]["steps"])):
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
    engine.abort_request([ids[i] for i in phase["abort"]["abort"]])
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
    pool = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager \
        .block_pool
    for _ in range(1000):  # saves still holding blocks free at a step
        if pool.get_num_free_blocks() == pool.num_gpu_blocks - 1:
            break
        engine.step()
        time.sleep(0.001)
    return {"outputs": [outputs.get(rid) if i not in phase["abort"]["abort"]
                        else None for i, rid in enumerate(ids)],
            "free_blocks": pool.get_num_free_blocks(),
            "blocks": pool.num_gpu_blocks}


def _scheduler_connector(llm: Any) -> Any:
    """The engine's scheduler-side KvcConnector (one process: the engine
    core runs in this one), or None."""
    from .vllm import KvcConnector

    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    connector = getattr(getattr(core, "scheduler", None), "connector", None)
    return connector if isinstance(connector, KvcConnector) else None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m kvc.vllm_engine SPEC.json RESULT.json",
              file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    result = run_engine(spec)
    Path(args[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

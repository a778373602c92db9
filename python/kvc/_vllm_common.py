"""What both sides of kvc's vLLM connector share (:mod:`kvc.vllm`): the
specs the scheduler side sends the workers and the metadata they send
back, and :class:`ConnectorSide`, which reads ``kv_connector_extra_config``
and keeps the kvc Connectors (one per tenant) and the stats both sides
count into.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)

from ._errors import Error
from ._vllm_cpu import FP8_FORMATS
from .connector import CacheLayout, Connector, Decision, Model, target_json
from .vllm_metrics import KvcConnectorStats

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


@dataclass
class LoadSpec:
    """A request's load this step: its prompt but the last token (kvc, like
    vLLM, leaves the server at least one token to compute), how many it
    loads and how many vLLM already holds, its block table, and how (the
    scheduler's decision: the worker decides nothing again)."""

    request_id: str
    tokens: list[int]
    loaded: int
    tokens_on_device: int
    block_ids: list[int]
    decision: Decision
    """The scheduler's decision, which the worker runs as it stands."""
    tenant: str = ""
    asynchronous: bool = False
    cancelled: bool = False


@dataclass
class SaveSpec:
    """A request whose prompt's KV is complete after this step."""

    request_id: str
    tokens: list[int]
    block_ids: list[int]
    tenant: str = ""


@dataclass(frozen=True)
class DecisionRecord:
    """What the scheduler side decided for a request, and against what."""

    request_id: str
    tokens: int
    tokens_on_device: int
    load_tokens: int
    """Tokens resident once the load ends (``tokens_on_device`` when
    vLLM prefills the rest)."""
    predicted_seconds: float
    """The best load's first token, as kvc's planner prices it."""
    recompute_seconds: float | None
    """vLLM's prefill of the tokens past its own: measured
    (:class:`kvc.prefill.PrefillClock`), or the target's price; None while
    not yet measured."""
    why: str
    load_ratio: float = 1.0
    """How much longer than predicted the engine's steps that loaded were
    measured to take (:class:`kvc.prefill.LoadClock`): the load was weighed
    at ``predicted_seconds * load_ratio``."""


@dataclass
class KvcConnectorMetadata(KVConnectorMetadata):
    """What the scheduler side tells the workers for one step."""

    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)


@dataclass
class KvcWorkerMetadata(KVConnectorWorkerMetadata):
    """What the workers tell the scheduler side after a step."""

    save_seconds: float = 0.0
    """Seconds the step spent handing its saves to kvc (on vLLM's CPU
    build, copying them out of vLLM's blocks): kvc's own work, which the
    scheduler takes out of the step's time before it prices vLLM's prefill
    from it."""
    saving: bool = False
    """Whether a save's copies or writes ran in the background during the
    step: they may have slowed it (on a CPU they share its cores), so the
    step prices vLLM's prefill only while no cleaner one does."""
    saves_ended: dict[str, bool] = field(default_factory=dict)
    """Requests whose saves' writes ended since the last step, and whether
    every object was written (the scheduler announces them: KV events)."""
    lost: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """Per request loaded this step, the token ranges its load could not
    read from the stores."""

    def aggregate(self, other: KVConnectorWorkerMetadata
                  ) -> KVConnectorWorkerMetadata:
        if not isinstance(other, KvcWorkerMetadata):
            return self
        # Ranks run side by side: the step waited for the slowest; a save
        # is written when every rank's is.
        ended = dict(self.saves_ended)
        for req_id, ok in other.saves_ended.items():
            ended[req_id] = ended.get(req_id, True) and ok
        lost = {r: list(v) for r, v in self.lost.items()}
        for req_id, ranges in other.lost.items():
            lost.setdefault(req_id, []).extend(ranges)
        return KvcWorkerMetadata(max(self.save_seconds, other.save_seconds),
                                 self.saving or other.saving, ended, lost)


class ConnectorSide:
    """The connector's configuration, read once, and what both sides use:
    a kvc Connector per tenant (made on first use, given the registered
    caches on a worker) and the stats."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 transfer: "KVTransferConfig",
                 kv_cache_config: "KVCacheConfig | None") -> None:
        self._vllm_config = vllm_config
        parallel = vllm_config.parallel_config
        # Tensor parallelism: each rank holds kv_heads / tp of the heads;
        # rank 0's worker loads and saves whole objects for all of them
        # (_vllm_worker.py), so that engines of every TP size share them.
        self._tp = int(parallel.tensor_parallel_size)
        self._tp_rank = 0
        if role == KVConnectorRole.WORKER and self._tp > 1:
            from vllm.distributed.parallel_state import get_tp_group

            self._tp_rank = int(get_tp_group().rank_in_group)
        if parallel.pipeline_parallel_size != 1:
            raise _refuse(f"pipeline parallelism (pipeline_parallel_size "
                          f"{parallel.pipeline_parallel_size})")
        extra = dict(transfer.kv_connector_extra_config or {})
        self._block_size = vllm_config.cache_config.block_size
        stores = extra.pop("stores", None)
        if not stores:
            raise Error("kv_connector_extra_config needs 'stores': a list of "
                        "store URLs", "invalid_argument")
        options: dict[str, Any] = {
            "target": json.loads(target_json(extra.pop("target", "cpu-2core"))),
            "chunk_tokens": int(extra.pop("chunk_tokens", 256)),
            "layer_group": int(extra.pop("layer_group", 1)),
            "codec": extra.pop("codec", "raw"),
            "strategies": list(extra.pop("strategies", ["joint"])),
            "device": extra.pop("device", "cpu"),
            "bundles": list(extra.pop("bundles", [])),
        }
        tenant = str(extra.pop("tenant", ""))
        policy = extra.pop("policy", "cheapest")
        prefill = extra.pop("prefill", "measured")
        if prefill not in ("measured", "target"):
            raise Error(f"prefill {prefill!r}: 'measured' (vLLM's own steps) "
                        "or 'target'", "invalid_argument")
        model = extra.pop("model", vllm_config.model_config.model)
        # P/D disaggregation over shared stores: a producer (kv_role
        # kv_producer) saves and loads nothing, a consumer loads and saves
        # nothing; kv_both does both.
        kv_role = getattr(transfer, "kv_role", None) or "kv_both"
        self._save = bool(extra.pop("save", True)) and \
            kv_role in ("kv_producer", "kv_both")
        self._loads = kv_role in ("kv_consumer", "kv_both")
        self._async = bool(extra.pop("async_load", False))
        # Off until a GPU has run it (docs/vllm.md): the host waits.
        self._stream_waits = bool(extra.pop("stream_waits", False))
        staging = extra.pop("staging_blocks", None)
        self._staging_blocks = None if staging is None else int(staging)
        if extra:
            raise Error("kv_connector_extra_config: unknown keys "
                        f"{sorted(extra)}", "invalid_argument")
        model_config = vllm_config.model_config
        if getattr(model_config, "use_mla", False):
            raise _refuse("MLA models (latent KV)")
        cache_dtype = str(vllm_config.cache_config.cache_dtype)
        # fp8 caches are loaded and saved through vLLM's own CPU cache write
        # (_vllm_cpu.py); kvc's CUDA device writes bf16 and f16 only.
        if cache_dtype not in ("auto", "bfloat16", "float16", "float32") \
                and (cache_dtype not in FP8_FORMATS or
                     options["device"] != "cpu"):
            raise _refuse(f"a {cache_dtype} KV cache (cache_dtype) on "
                          f"device {options['device']}")
        self._cache_dtype = cache_dtype
        if kv_cache_config is not None:  # vLLM gives it; older callers may not.
            groups = kv_cache_config.kv_cache_groups
            spec = groups[0].kv_cache_spec if len(groups) == 1 else None
            # A window as long as the context (Mistral's 4096 in a shorter
            # one) is full attention.
            window = getattr(spec, "sliding_window", None)
            if spec is None or type(spec).__name__ not in (
                    "FullAttentionSpec", "SlidingWindowSpec") or \
                    (window and window < model_config.max_model_len):
                raise _refuse("hybrid, sliding-window or state-space models "
                              "(every layer must be full attention)")
        if options["chunk_tokens"] % self._block_size:
            raise Error(f"chunk_tokens {options['chunk_tokens']} is not a "
                        f"multiple of vLLM's block size {self._block_size}",
                        "invalid_argument")
        # Stored chunks are keyed by the tenant, the weights (the model's
        # fingerprint) and the dtype the engine keeps KV in (an fp8 engine's
        # values are not a bf16 engine's); per request also by its salt and
        # adapter (_tenant_of).
        dtype = cache_dtype if cache_dtype != "auto" else \
            str(model_config.dtype).removeprefix("torch.")
        self._tenant = f"{tenant}|dtype={dtype}"
        self._policy = policy
        self._prefill = prefill
        if role == KVConnectorRole.SCHEDULER:
            # The scheduler decides; the worker loads exactly what it decided.
            options.update(policy=policy)
        else:
            options.update(policy="always", recompute_failures=False)
        self._model = Model(model)
        if self._tp > 1:
            if options["device"] != "cpu" or self._async:
                raise _refuse(f"tensor parallelism (tensor_parallel_size "
                              f"{self._tp}) on device {options['device']}"
                              f"{' with async_load' if self._async else ''}")
            if self._model.kv_heads % self._tp:
                raise _refuse(f"tensor parallelism (tensor_parallel_size "
                              f"{self._tp}) over {self._model.kv_heads} KV "
                              "heads")
        self._stores = list(stores)
        self._medium = "CPU" if all(str(u).startswith("mem://")
                                    for u in self._stores) else "STORAGE"
        self._options = options
        # One kvc Connector per tenant, made when a request first needs it.
        self._kvcs: dict[str, Connector] = {}
        self._caches: list[torch.Tensor] = []
        self._layout: CacheLayout = "keys_first"
        if self._leads():
            self._kvc_for(self._tenant)
        self._layers = self._model.layers
        self._chunk_tokens = options["chunk_tokens"]
        # Both sides' counters (workers: also updated by the save waiter).
        self._stats = KvcConnectorStats()
        self._stats_lock = threading.Lock()

    def _leads(self) -> bool:
        """Whether this side runs kvc Connectors: the scheduler, and the
        worker of tensor-parallel rank 0 (the others only exchange their
        heads with it)."""
        return self._tp_rank == 0

    def _kvc_for(self, tenant: str) -> Connector:
        """The kvc Connector of ``tenant``, made (and, on a worker, given
        the registered caches) on first use."""
        kvc = self._kvcs.get(tenant)
        if kvc is None:
            kvc = Connector(self._model, self._stores, tenant=tenant,
                            **self._options)
            if self._caches:
                kvc.register_caches(self._caches, layout=self._layout)
            self._kvcs[tenant] = kvc
        return kvc

    def _tenant_of(self, request: "Request") -> str | None:
        """The tenant that keys ``request``'s chunks: the connector's, with
        the request's cache salt and LoRA adapter; None for a request kvc
        cannot key (multimodal inputs), which neither loads nor saves."""
        if getattr(request, "mm_features", None):
            return None
        tenant = self._tenant
        salt = getattr(request, "cache_salt", None)
        if salt:
            tenant += f"|salt={salt}"
        lora = getattr(request, "lora_request", None)
        if lora is not None:
            tenant += f"|lora={lora.lora_name}@{lora.lora_path}"
        return tenant

    def get_kv_connector_stats(self) -> KvcConnectorStats | None:
        with self._stats_lock:
            if self._stats.is_empty():
                return None
            stats, self._stats = self._stats, KvcConnectorStats()
        return stats

    def shutdown(self) -> None:
        for kvc in self._kvcs.values():
            kvc.close()


def layer_index(name: str) -> int:
    """The layer of a vLLM attention layer's name
    (``model.layers.7.self_attn.attn`` -> 7)."""
    found = re.findall(r"\.(\d+)\.", f".{name}.")
    if not found:
        raise Error(f"no layer index in the layer name {name!r}",
                    "invalid_argument")
    return int(found[0])


def _refuse(what: str) -> Error:
    return Error(f"kvc's vLLM connector does not run {what} (docs/vllm.md: "
                 "Not supported)", "unimplemented")


SAVE_SUFFIX = "/save"


def save_id(req_id: str) -> str:
    """The request a vLLM request's save is in kvc: apart from its load,
    so that either can end or fail without the other."""
    return req_id + SAVE_SUFFIX


def cancel(kvc: Connector, req_id: str) -> None:
    """Stops and forgets ``req_id`` in ``kvc``, if it knows it."""
    try:
        kvc.cancel(req_id)
    except Error:
        pass  # Already forgotten.

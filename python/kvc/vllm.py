"""kvc as a vLLM KV connector (``KVConnectorBase_V1``, vLLM 0.32).

vLLM loads it from its ``kv_transfer_config``::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvcConnector",
        "kv_connector_module_path": "kvc.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"stores": ["file:///var/kvc"]}}'

The scheduler side asks a kvc Connector what the stores hold of a prompt
and whether loading beats vLLM's own prefill (``get_num_new_matched_tokens``);
the worker side loads the decided tokens layer by layer into vLLM's paged
KV memory while the forward pass runs (``wait_for_layer_load``) and saves
each prompt's whole chunks once its prefill wrote them (``wait_for_save``,
after the forward pass; the copies and writes run in the background).
Blocks a load could not fill intact are reported to vLLM, which recomputes
them. Every request's chunks are keyed by its tenant: the configured
tenant, the cache's dtype, vLLM's ``cache_salt`` and the LoRA adapter, so
that requests of different salts or adapters never share KV. On vLLM's CPU
build, whose caches are packed per instruction set, kvc loads and saves
through staging blocks (:mod:`kvc._vllm_cpu`).

For a KV-aware router, the scheduler side publishes vLLM's KV events
(``take_events``): ``BlockStored`` with vLLM's block hashes once a save's
objects are written (medium ``STORAGE``, or ``CPU`` when every store is a
``mem://`` tier), ``BlockRemoved`` for the blocks of chunks a load could
not read. Its stats (``get_kv_connector_stats``, :mod:`kvc.vllm_metrics`)
are logged by vLLM and exported as Prometheus counters ``vllm:kvc_*``.
docs/vllm.md lists the extra-config keys and what is not supported.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

from ._errors import Error
from ._vllm_cpu import PackedCpuCache
from .connector import CacheLayout, Connector, Decision, Model, target_json
from .prefill import LoadClock, PrefillClock, mean_first_token, scaled_target
from .vllm_metrics import KvcConnectorStats, KvcPromMetrics

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = init_logger(__name__)

__all__ = ["KvcConnector", "KvcConnectorMetadata", "KvcWorkerMetadata",
           "DecisionRecord"]

_SAVE_DRAIN_SECONDS = 30.0
# The measured prefill is applied to the target again when it moves by more.
_RECALIBRATE_DRIFT = 0.1
# Requests behind a load that its pricing runs through vLLM's steps; those
# further back are each held up by the load's or the prefill's seconds.
_QUEUE_HORIZON = 128


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


def _layer_index(name: str) -> int:
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


class KvcConnector(KVConnectorBase_V1):
    """vLLM's KV connector over kvc (see the module's documentation)."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig") -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        parallel = vllm_config.parallel_config
        if parallel.tensor_parallel_size != 1:
            raise _refuse(f"tensor parallelism (tensor_parallel_size "
                          f"{parallel.tensor_parallel_size})")
        if parallel.pipeline_parallel_size != 1:
            raise _refuse(f"pipeline parallelism (pipeline_parallel_size "
                          f"{parallel.pipeline_parallel_size})")
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
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
        kv_role = getattr(self._kv_transfer_config, "kv_role", None) or \
            "kv_both"
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
        if cache_dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise _refuse(f"a {cache_dtype} KV cache (cache_dtype)")
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
        # fingerprint) and the dtype the engine computes KV in; per request
        # also by its salt and adapter (_tenant_of).
        dtype = cache_dtype if cache_dtype != "auto" else \
            str(model_config.dtype).removeprefix("torch.")
        self._tenant = f"{tenant}|dtype={dtype}"
        # policy cheapest against vLLM's measured prefill (PrefillClock).
        self._measured = role == KVConnectorRole.SCHEDULER and \
            policy == "cheapest" and prefill == "measured"
        self._clock = PrefillClock()
        self._load_clock = LoadClock()
        self._base_target: dict[str, Any] = options["target"]
        self._target_factor: float | None = None
        self._forward_prices: dict[int, float] = {}
        # The step being timed: when it began, its prompt tokens, and the
        # predicted seconds of its loads (0: it loads nothing).
        self._step: tuple[float, int, float] | None = None
        self.decisions: deque[DecisionRecord] = deque(maxlen=4096)
        if role == KVConnectorRole.SCHEDULER:
            # The scheduler decides; the worker loads exactly what it decided.
            options.update(policy=policy)
        else:
            options.update(policy="always", recompute_failures=False)
        self._model = Model(model)
        self._stores = list(stores)
        self._medium = "CPU" if all(str(u).startswith("mem://")
                                    for u in self._stores) else "STORAGE"
        self._options = options
        # One kvc Connector per tenant, made when a request first needs it.
        self._kvcs: dict[str, Connector] = {}
        self._caches: list[torch.Tensor] = []
        self._layout: CacheLayout = "keys_first"
        self._kvc_for(self._tenant)
        self._layers = self._model.layers
        self._chunk_tokens = options["chunk_tokens"]
        # Scheduler side: each request's tenant, and what
        # get_num_new_matched_tokens found vLLM holds.
        self._tenants: dict[str, str] = {}
        self._on_device: dict[str, int] = {}
        self._decided: dict[str, Decision] = {}
        self._pending_loads: dict[str, LoadSpec] = {}
        # vLLM's queue as a load is weighed against it (_queue_seconds):
        # its token budget per step; requests not yet scheduled, in arrival
        # order, and how many of their tokens the stores hold; what this
        # step's pass took so far, as (tokens, load seconds); the prompt
        # tokens of requests prefilled in parts, and what they have left
        # this step.
        self._budget = int(vllm_config.scheduler_config.max_num_batched_tokens) \
            if role == KVConnectorRole.SCHEDULER else 0
        self._waiting: dict[str, "Request"] = {}
        self._stored: dict[str, int] = {}
        self._this_step: list[tuple[int, float]] = []
        self._partial: dict[str, int] = {}
        self._carried: list[int] = []
        self._prefills: dict[str, SaveSpec] = {}
        self._saving: set[str] = set()
        # Finished requests whose blocks a save still holds.
        self._holding: set[str] = set()
        # KV events and stats. Scheduler side: the live requests (their
        # block hashes), the BlockStored of each save sent to the workers
        # until they report its writes, and the events not yet taken.
        self._requests: dict[str, "Request"] = {}
        self._announce: dict[str, BlockStored] = {}
        self._events: list[KVCacheEvent] = []
        # Both sides' counters (workers: also updated by the save waiter).
        self._stats = KvcConnectorStats()
        self._stats_lock = threading.Lock()
        # Worker side.
        self._packed: PackedCpuCache | None = None
        # Requests' staging blocks (a packed CPU cache): per load, its
        # staging table and the layers not yet packed into vLLM's blocks;
        # per save, its staging table.
        self._load_staging: dict[str, tuple[list[int], set[int]]] = {}
        self._save_staging: dict[str, list[int]] = {}
        # Requests whose save kvc runs (as its request _save_id(id)), until
        # it is waited for or stopped.
        self._save_ids: set[str] = set()
        self._save_waiter = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="kvc-save-wait")
        self._kvc_of: dict[str, Connector] = {}
        self._loading: list[LoadSpec] = []
        self._receiving: dict[str, LoadSpec] = {}
        self._loads_ended: set[str] = set()
        self._registered = False
        self._load_errors: set[int] = set()
        self._saves_started: set[str] = set()
        self._saves_copied: set[str] = set()
        # Saves whose writes ended (the save waiter's thread adds), and the
        # ranges this step's loads could not read: for the scheduler.
        self._saves_ended: dict[str, bool] = {}
        self._lost: dict[str, list[tuple[int, int]]] = {}
        self._finished_requests: set[str] = set()
        self._on_cuda = False
        # The step's time in wait_for_save's saves, and whether earlier
        # saves ran beside its forward pass (build_connector_worker_meta).
        self._save_seconds = 0.0
        self._saving_beside = False
        # Saves' writes being waited for off the forward pass.
        self._writes: set[Future[None]] = set()

    @property
    def prefill_clock(self) -> PrefillClock:
        """vLLM's prefill as the scheduler side measured it."""
        return self._clock

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

    # ==============================
    # Scheduler side
    # ==============================

    def on_new_request(self, request: "Request") -> None:
        self._waiting[request.request_id] = request
        self._requests[request.request_id] = request
        tenant = self._tenant_of(request)
        if tenant is not None:
            self._tenants[request.request_id] = tenant

    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int
                                   ) -> tuple[int | None, bool]:
        external, asynchronous, taken = self._match(request,
                                                    num_computed_tokens)
        # What this step's pass took, as the next request's load sees it.
        self._this_step.append(taken)
        return external, asynchronous

    def _match(self, request: "Request", num_computed_tokens: int
               ) -> tuple[int, bool, tuple[int, float]]:
        """The tokens kvc loads for ``request`` past vLLM's own, whether
        asynchronously, and what the request takes of the step, as
        (tokens it computes, its load's seconds)."""
        prompt = list(request.prompt_token_ids or [])
        # vLLM computes at least the prompt's last token itself.
        tokens = prompt[:len(prompt) - 1]
        tenant = self._tenants.get(request.request_id)
        prefill = (len(prompt) - num_computed_tokens, 0.0)
        if tenant is None or len(tokens) <= num_computed_tokens:
            return 0, False, prefill
        if not self._loads:
            self._record(request.request_id, len(prompt), num_computed_tokens,
                         None, None, "recomputes: a producer (kv_role "
                         "kv_producer) loads nothing")
            return 0, False, prefill
        recompute = None
        ratio = 1.0
        if self._measured:
            # Priced against vLLM's measured prefill of what it would
            # compute: nothing loads until that is measured.
            recompute = self._clock.seconds(len(prompt) - num_computed_tokens) \
                if self._target_factor is not None else None
            if recompute is None:
                self._record(request.request_id, len(prompt),
                             num_computed_tokens, None, None,
                             "recomputes: vLLM's prefill is not measured yet "
                             f"({self._clock.steps} steps seen)")
                return 0, False, prefill
            # A request's load is weighed against its prefill, then against
            # what it would do to the requests beside it (_queue_seconds).
            # The planner's load is weighed as steps that loaded ran against
            # their prediction: predicted x ratio < recompute, which C++
            # sees as predicted < recompute / ratio.
            ratio = self._load_clock.ratio
        try:
            decision = self._kvc_for(tenant).decide(
                request.request_id, tokens, num_computed_tokens,
                None if recompute is None else recompute / ratio)
        except Error as error:
            logger.warning("kvc: request %s: %s; vLLM prefills it",
                           request.request_id, error)
            return 0, False, prefill
        why = decision.why if recompute is None else \
            _in_measured_terms(decision, ratio, prefill[0], recompute)
        load = (len(prompt) - decision.load_tokens,
                decision.predicted_seconds * ratio)
        loads = decision.loads
        if loads and recompute is not None and not self._async:
            queued = self._queue_seconds(request.request_id, load, prefill)
            if queued is not None and queued[1] <= queued[0]:
                # Its load would hold up the requests beside it for longer
                # than its prefill would.
                _cancel(self._kvc_for(tenant), request.request_id)
                loads = False
                waiting = queued[2]
                why = (f"recomputes: its load ({load[1] * 1e3:.2f} ms) "
                       f"would hold up the {waiting} requests of vLLM's "
                       f"queue: their mean first token "
                       f"{queued[0] / waiting * 1e3:.2f} ms against "
                       f"{queued[1] / waiting * 1e3:.2f} ms if vLLM "
                       "prefills it")
        self._record(request.request_id, len(prompt), num_computed_tokens,
                     decision, recompute if self._measured else
                     decision.recompute_seconds, why, ratio, loads)
        logger.debug("kvc: request %s: %s", request.request_id, why)
        self._on_device[request.request_id] = num_computed_tokens
        if not loads:
            return 0, False, prefill
        self._decided[request.request_id] = decision
        external = max(0, decision.load_tokens - num_computed_tokens)
        return external, self._async and external > 0, load

    def _record(self, request_id: str, prompt_tokens: int, on_device: int,
                decision: Decision | None, recompute: float | None,
                why: str, load_ratio: float = 1.0,
                loads: bool | None = None) -> None:
        if loads is None:
            loads = decision is not None and decision.loads
        with self._stats_lock:
            self._stats.decided(
                decision.strategy if decision is not None and loads else None,
                max(0, decision.load_tokens - on_device)
                if decision is not None and loads else 0)
        self.decisions.append(DecisionRecord(
            request_id, prompt_tokens, on_device,
            decision.load_tokens if decision is not None and loads
            else on_device,
            decision.predicted_seconds if decision is not None else 0.0,
            recompute, why, load_ratio))

    def _queue_seconds(self, request_id: str, load: tuple[int, float],
                       prefill: tuple[int, float]
                       ) -> tuple[float, float, int] | None:
        """The summed first-token seconds of vLLM's queue from this step on
        (the prefills carried into it, the requests its pass took so far,
        this one, and those waiting behind it) if this request loads, and
        if vLLM prefills it, and how many requests that is; None when no
        other request is in it.

        A synchronous load holds up the end of the step it joins, and every
        request behind it; a prefill takes the step's token budget and holds
        up those behind it only (:func:`mean_first_token`). So whether a
        load pays depends on how many of the requests behind it load too:
        if this one loads, the best number of them (the first 1, 2, 4, ...
        of those the stores hold) is taken, each load priced as this one
        per token; if it does not, none of them is (each will weigh itself
        when vLLM asks). Past the first ``_QUEUE_HORIZON`` requests behind
        it, each is held up by the load's seconds or the prefill's
        per-token ones."""
        behind: list[tuple[tuple[int, float], tuple[int, float] | None]] = []
        after = False
        beyond = 0
        per_token_load = load[1] / max(1, prefill[0] - load[0])
        for waiting in list(self._waiting):
            if after and len(behind) < _QUEUE_HORIZON:
                tokens, stored = self._stored_of(waiting)
                behind.append(((tokens, 0.0), None if stored <= 0 else
                               (tokens - stored, per_token_load * stored)))
            elif after:
                beyond += 1
            after = after or waiting == request_id
        ahead = [(tokens, 0.0) for tokens in self._carried] + self._this_step
        if not ahead and not behind:
            return None
        count = len(ahead) + 1 + len(behind)

        def clock(tokens: int) -> float:
            return self._clock.seconds(tokens) or 0.0

        def total(own: tuple[int, float], loading: int) -> float:
            queue = ahead + [own]
            for prefilled, loaded in behind:
                if loaded is not None and loading > 0:
                    queue.append(loaded)
                    loading -= 1
                else:
                    queue.append(prefilled)
            return count * mean_first_token(queue, self._budget, clock)

        loadable = sum(loaded is not None for _, loaded in behind)
        counts = {0, loadable}
        counts.update(1 << i for i in range(loadable.bit_length()))
        with_load = min(total(load, k) for k in counts if k <= loadable)
        per_token = (self._clock.fit or (0.0, 0.0))[1]
        return (with_load + beyond * load[1],
                total(prefill, 0) + beyond * per_token * prefill[0],
                count + beyond)

    def _stored_of(self, request_id: str) -> tuple[int, int]:
        """A waiting request's prompt tokens, and how many of them the
        stores hold (looked up once)."""
        request = self._waiting[request_id]
        prompt = list(request.prompt_token_ids or [])
        if request_id not in self._stored:
            tenant = self._tenants.get(request_id)
            try:
                self._stored[request_id] = 0 if tenant is None else \
                    self._kvc_for(tenant).lookup(prompt[:-1]).tokens
            except Error:
                self._stored[request_id] = 0
        return len(prompt), self._stored[request_id]

    def update_state_after_alloc(self, request: "Request",
                                 blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        if num_external_tokens <= 0:
            return
        on_device = self._on_device.get(request.request_id, 0)
        loaded = on_device + num_external_tokens
        self._pending_loads[request.request_id] = LoadSpec(
            request.request_id, list(request.prompt_token_ids or [])[:-1],
            loaded, on_device, list(blocks.get_block_ids()[0]),
            self._decided[request.request_id],
            tenant=self._tenants[request.request_id], asynchronous=self._async)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput"
                             ) -> KVConnectorMetadata:
        meta = KvcConnectorMetadata()
        # Loads of this step's allocations: a synchronous one's request runs
        # this step; an asynchronous one's waits until the worker reports it.
        meta.loads = list(self._pending_loads.values())
        self._pending_loads.clear()
        self._queue_after(scheduler_output)
        for new in scheduler_output.scheduled_new_reqs:
            blocks = list(new.block_ids[0])
            prompt = list(new.prompt_token_ids or [])
            tenant = self._tenants.get(new.req_id)
            if self._save and tenant is not None and \
                    len(prompt) >= self._chunk_tokens and \
                    not self._stored_whole(tenant, prompt):
                self._prefills[new.req_id] = SaveSpec(new.req_id, prompt,
                                                      blocks, tenant)
                self._save_when_done(meta, new.req_id, new.num_computed_tokens,
                                     scheduler_output)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            spec = self._prefills.get(req_id)
            if spec is None:
                continue
            added = cached.new_block_ids[i]
            if added is not None:
                spec.block_ids.extend(added[0])
            self._save_when_done(meta, req_id, cached.num_computed_tokens[i],
                                 scheduler_output)
        # A step is timed when every request in it computes prompt tokens (a
        # decode schedules one) and no load runs between steps: as a
        # prefill (PrefillClock) when it loads nothing, else against its
        # predicted seconds (LoadClock, _step_seconds).
        scheduled = scheduler_output.num_scheduled_tokens
        synchronous = [load for load in meta.loads if not load.asynchronous]
        self._step = None
        if self._measured and scheduled and min(scheduled.values()) > 1 and \
                len(synchronous) == len(meta.loads):
            # Tokens the loads' requests compute are in their predictions.
            others = sum(scheduled.values()) - sum(
                scheduled.get(load.request_id, 0) for load in meta.loads)
            self._step = (time.perf_counter(), sum(scheduled.values()),
                          self._step_seconds(meta.loads, others))
        meta.preempted = list(getattr(scheduler_output, "preempted_req_ids",
                                      None) or [])
        for req_id in meta.preempted:
            # The worker stops its save before vLLM reuses the blocks
            # (handle_preemptions), and reports nothing for it.
            self._prefills.pop(req_id, None)
            self._saving.discard(req_id)
            self._announce.pop(req_id, None)
        return meta

    def _queue_after(self, out: "SchedulerOutput") -> None:
        """vLLM's queue as this step leaves it (_queue_seconds)."""
        self._this_step = []
        self._carried = []
        left: dict[str, int] = {}
        for new in out.scheduled_new_reqs:
            self._waiting.pop(new.req_id, None)
            self._stored.pop(new.req_id, None)
            self._partial[new.req_id] = len(new.prompt_token_ids or [])
            left[new.req_id] = self._partial[new.req_id] - \
                new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if req_id in self._partial:
                left[req_id] = self._partial[req_id] - \
                    cached.num_computed_tokens[i]
        for req_id, tokens in left.items():
            tokens -= out.num_scheduled_tokens.get(req_id, 0)
            if tokens > 0:
                self._carried.append(tokens)
            else:
                del self._partial[req_id]

    def _step_seconds(self, loads: list[LoadSpec], others: int) -> float:
        """A step's predicted seconds when it loads: its loads' predicted
        first tokens, one after another (they share the stores' link), then
        the prefill of the ``others`` tokens its other requests compute.
        Measured in this engine (docs/results.md): a step's loads and its
        other requests' prefills did not overlap (three loads of 100 ms and
        a 74 ms prefill took 180 ms), as vLLM's pass waits at each layer for
        every load's rows of it."""
        if not loads:
            return 0.0
        return sum(load.decision.predicted_seconds for load in loads) + \
            (self._clock.seconds(others) or 0.0)

    def _stored_whole(self, tenant: str, prompt: list[int]) -> bool:
        """Whether the stores hold every whole chunk of ``prompt`` already
        (a save would write nothing: the workers are not asked to copy
        it out)."""
        whole = len(prompt) // self._chunk_tokens * self._chunk_tokens
        try:
            return self._kvc_for(tenant).lookup(prompt).tokens >= whole
        except Error:
            return False

    def _save_when_done(self, meta: KvcConnectorMetadata, req_id: str,
                        computed: int, out: "SchedulerOutput") -> None:
        spec = self._prefills[req_id]
        if computed + out.num_scheduled_tokens.get(req_id, 0) < len(spec.tokens):
            return
        del self._prefills[req_id]
        meta.saves.append(SaveSpec(req_id, spec.tokens, list(spec.block_ids),
                                   spec.tenant))
        self._saving.add(req_id)
        stored = self._stored_event(req_id, spec.tokens)
        if stored is not None:
            self._announce[req_id] = stored

    def _block_hashes(self, req_id: str, first: int, last: int) -> list[Any]:
        """vLLM's hashes of the request's blocks [first, last), as its KV
        events carry them (those it has computed)."""
        request = self._requests.get(req_id)
        hashes = list(getattr(request, "block_hashes", None) or [])
        return [maybe_convert_block_hash(h) for h in hashes[first:last]]

    def _stored_event(self, req_id: str, tokens: list[int]
                      ) -> BlockStored | None:
        """The BlockStored of a save of ``tokens``: the blocks of its whole
        chunks (what kvc stores), with vLLM's hashes of them."""
        blocks = len(tokens) // self._chunk_tokens * self._chunk_tokens // \
            self._block_size
        hashes = self._block_hashes(req_id, 0, blocks)
        if len(hashes) < blocks or not blocks:
            return None
        lora = getattr(self._requests[req_id], "lora_request", None)
        return BlockStored(
            block_hashes=hashes, parent_block_hash=None,
            token_ids=list(tokens[:blocks * self._block_size]),
            block_size=self._block_size,
            lora_id=None if lora is None else lora.lora_int_id,
            medium=self._medium,
            lora_name=None if lora is None else lora.lora_name)

    def update_connector_output(self,
                                connector_output: "KVConnectorOutput") -> None:
        if self._step is not None:
            began, tokens, predicted = self._step
            self._step = None
            # vLLM's step, without what kvc's saves added to it.
            worker = connector_output.kv_connector_worker_meta
            ours = worker if isinstance(worker, KvcWorkerMetadata) \
                else KvcWorkerMetadata()
            seconds = time.perf_counter() - began - ours.save_seconds
            if predicted > 0:
                if not ours.saving:
                    self._load_clock.observe(predicted, seconds)
            else:
                self._clock.observe(tokens, seconds, clean=not ours.saving)
                self._calibrate()
        for req_id in connector_output.finished_sending or ():
            self._saving.discard(req_id)
            self._holding.discard(req_id)
        worker = connector_output.kv_connector_worker_meta
        if isinstance(worker, KvcWorkerMetadata):
            self._note_events(worker)

    def _note_events(self, worker: KvcWorkerMetadata) -> None:
        """KV events of what the workers reported: saves written, chunks
        the loads could not read."""
        for req_id, written in worker.saves_ended.items():
            stored = self._announce.pop(req_id, None)
            if written and stored is not None:
                self._events.append(stored)
        for req_id, ranges in worker.lost.items():
            blocks: set[int] = set()
            for begin, end in ranges:
                blocks.update(range(begin // self._block_size,
                                    -(-end // self._block_size)))
            hashes = [h for b in sorted(blocks)
                      for h in self._block_hashes(req_id, b, b + 1)]
            if hashes:
                self._events.append(BlockRemoved(block_hashes=hashes,
                                                 medium=self._medium))

    def take_events(self) -> list[KVCacheEvent]:
        events, self._events = self._events, []
        return events

    def get_kv_connector_stats(self) -> KvcConnectorStats | None:
        with self._stats_lock:
            if self._stats.is_empty():
                return None
            stats, self._stats = self._stats, KvcConnectorStats()
        return stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None
                                 ) -> KvcConnectorStats:
        return KvcConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: "VllmConfig",
                           metric_types: dict[Any, Any], labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]
                           ) -> KvcPromMetrics:
        return KvcPromMetrics(vllm_config, metric_types, labelnames,
                              per_engine_labelvalues)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig"
                                    ) -> str | None:
        # On a GPU, kvc reads and writes a block's rows token by token, each
        # token's heads side by side: [block_size, heads, head_dim] (NHD).
        # vLLM's CPU build packs its own layout, which kvc stages.
        if vllm_config.device_config.device_type == "cpu":
            return None
        return "NHD"

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]
                                         ) -> bool:
        # Loads are waited for layer by layer (wait_for_layer_load), which
        # a replayed CUDA graph would skip.
        return True

    def _calibrate(self) -> None:
        """Prices vLLM's forward pass, which a layer-wise load runs beside,
        at its measured speed: the target's compute scaled so that kvc's
        planner prices a prefill of the steps' typical size as the clock
        measured it. The scheduler's kvc Connectors are made anew (they
        hold no load or save) when the scale moves by more than 10%."""
        # The steps' typical size, to 64 tokens (its price is kept).
        tokens = -(-self._clock.typical_tokens() // 64) * 64
        measured = self._clock.seconds(tokens)
        if measured is None or measured <= 0:
            return
        priced = self._forward_price(tokens)
        if priced is None:
            return
        factor = priced / measured
        if self._target_factor is not None and \
                abs(factor / self._target_factor - 1) <= _RECALIBRATE_DRIFT:
            return
        logger.info("kvc: vLLM prefills %d tokens in %.2f ms (%s prices "
                    "%.2f ms): its compute is priced %.3gx", tokens,
                    measured * 1e3, self._base_target.get("name", "the target"),
                    priced * 1e3, factor)
        self._target_factor = factor
        self._options["target"] = scaled_target(self._base_target, factor)
        for kvc in self._kvcs.values():
            kvc.close()
        self._kvcs = {}

    def _forward_price(self, tokens: int) -> float | None:
        """The base target's price of vLLM's pass over ``tokens`` tokens as
        the planner prices the pass a load leaves it: one chunk of them all
        (cached per size)."""
        if tokens not in self._forward_prices:
            chunk = -(-tokens // 16) * 16
            try:
                with Connector(self._model, ["mem://"],
                               target=self._base_target, policy="never",
                               chunk_tokens=chunk) as pricer:
                    self._forward_prices[tokens] = pricer.decide(
                        "kvc-prefill-price", [0] * tokens, 0).recompute_seconds
            except Error as error:
                logger.warning("kvc: pricing a prefill of %d tokens: %s",
                               tokens, error)
                return None
        return self._forward_prices[tokens]

    def request_finished(self, request: "Request", block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        req_id = request.request_id
        self._prefills.pop(req_id, None)
        self._pending_loads.pop(req_id, None)
        self._waiting.pop(req_id, None)
        self._stored.pop(req_id, None)
        self._partial.pop(req_id, None)
        self._on_device.pop(req_id, None)
        self._decided.pop(req_id, None)
        self._requests.pop(req_id, None)
        tenant = self._tenants.pop(req_id, None)
        if tenant is not None:
            _cancel(self._kvc_for(tenant), req_id)
        # A save still copying out of the blocks holds them until the
        # worker reports it (get_finished).
        if req_id in self._saving:
            self._holding.add(req_id)
        return req_id in self._saving, None

    def has_pending_push_work(self) -> bool:
        # Saves still reading finished requests' blocks: the engine keeps
        # stepping until the workers report them, and frees the blocks then.
        return bool(self._holding)

    def has_pending_block_frees(self) -> bool:
        # Under block pressure, vLLM waits for those blocks rather than
        # preempting a running request.
        return bool(self._holding)

    # ==============================
    # Worker side
    # ==============================

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        by_layer = sorted(kv_caches.items(), key=lambda kv: _layer_index(kv[0]))
        tensors = [t for _, t in by_layer]
        if len(tensors) != self._layers:
            raise Error(f"vLLM registered {len(tensors)} KV caches for a model "
                        f"of {self._layers} layers", "failed_precondition")
        first = tensors[0]
        if first.dim() == 5 and first.shape[0] == 2:
            self._layout = "keys_first"
        elif first.dim() == 5 and first.shape[1] == 2:
            self._layout = "blocks_first"
        elif first.dim() == 4 and first.device.type == "cpu" and \
                tuple(first.shape[1:]) == (self._model.kv_heads,
                                           self._block_size,
                                           2 * self._model.head_dim):
            # vLLM's CPU build: [blocks, heads, block_size, 2 * head_dim],
            # packed per instruction set; kvc works on staging blocks.
            self._packed = PackedCpuCache(
                tensors, _cpu_attention_isa(self._vllm_config, by_layer[0][0],
                                            first),
                self._staging_blocks)
            if self._packed.lossy:
                logger.warning("kvc: vLLM's KV cache is %s; kvc stores it as "
                               "%s (rounded)", first.dtype,
                               self._packed.staging_dtype)
            self._layout = "blocks_first"
            tensors = self._packed.staging
        else:
            raise Error(f"a KV cache of shape {tuple(first.shape)}: kvc reads "
                        "[2, blocks, block_size, heads, head_dim], "
                        "[blocks, 2, block_size, heads, head_dim] and vLLM's "
                        "CPU [blocks, heads, block_size, 2 * head_dim], of "
                        f"the model's {self._model.kv_heads} KV heads of "
                        f"{self._model.head_dim} and vLLM's block size "
                        f"{self._block_size}", "unimplemented")
        self._on_cuda = first.is_cuda
        self._caches = tensors
        for kvc in self._kvcs.values():
            kvc.register_caches(tensors, layout=self._layout)
        self._registered = True

    def start_load_kv(self, forward_context: "ForwardContext",
                      **kwargs: Any) -> None:
        meta = self._metadata()
        for load in meta.loads:
            kvc = self._kvc_for(load.tenant)
            self._kvc_of[load.request_id] = kvc
            try:
                # As the scheduler decided: nothing is priced again.
                kvc.decide_as(load.request_id, load.tokens,
                              load.tokens_on_device, load.decision)
                kvc.start_load(load.request_id, self._load_table(load))
                if load.asynchronous:
                    self._receiving[load.request_id] = load
                else:
                    self._loading.append(load)
            except Error as error:
                logger.warning("kvc: request %s: load not started: %s",
                               load.request_id, error)
                self._fail(load)
                self._forget_load(load.request_id)
                if load.asynchronous:
                    self._loads_ended.add(load.request_id)

    def wait_for_layer_load(self, layer_name: str) -> None:
        layer = _layer_index(layer_name)
        # With stream_waits on a GPU, vLLM's stream waits for the layer (a
        # wait on device memory the load raises), not the host: the forward
        # pass queues on. Else the host waits.
        stream = torch.cuda.current_stream().cuda_stream \
            if self._on_cuda and self._stream_waits else None
        for load in self._loading:
            kvc = self._kvc_of[load.request_id]
            try:
                if stream is None:
                    kvc.wait_layer(load.request_id, layer)
                else:
                    kvc.wait_layer_on(load.request_id, layer, stream)
            except Error:
                pass  # The load's failed blocks are collected after it.
            self._pack(load, [layer])

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: Any, **kwargs: Any) -> None:
        # Saved in wait_for_save, after the forward pass: kvc's copies and
        # writes never run beside it (on a CPU they slow it down, and
        # vLLM's prefill would be priced at that slower speed). The blocks
        # stay as written: the scheduler holds them until the save ends.
        return

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata
                                ) -> None:
        super().bind_connector_metadata(connector_metadata)
        self._saving_beside = self._saves_running()

    def wait_for_save(self) -> None:
        # The step's saves copy out and write in the background; the
        # scheduler holds their blocks until get_finished reports them.
        meta = self._metadata()
        self._saving_beside |= self._saves_running()
        if meta.saves:
            began = time.perf_counter()
            try:
                if self._on_cuda:
                    # kvc reads the blocks on its own stream: the forward
                    # pass's writes on vLLM's stream must have landed.
                    torch.cuda.current_stream().synchronize()
                for layer in range(self._layers):
                    self._save_layer(meta, layer)
            finally:
                self._save_seconds += time.perf_counter() - began
        self._end_loads()

    def _save_layer(self, meta: KvcConnectorMetadata, layer: int) -> None:
        for save in meta.saves:
            kvc = self._kvc_for(save.tenant)
            self._kvc_of[save.request_id] = kvc
            if save.request_id in self._saves_copied:
                continue  # Refused at an earlier layer.
            try:
                blocks = self._save_table(save, layer)
                kvc.save_layer(_save_id(save.request_id), save.tokens, layer,
                               blocks)
                self._save_ids.add(save.request_id)
                self._saves_started.add(save.request_id)
            except Error as error:
                logger.warning("kvc: request %s: layer %d not saved: %s",
                               save.request_id, layer, error)
                self._forget_save(save.request_id)
                # Nothing reads its blocks: reported done once it finishes,
                # so that the scheduler frees them.
                self._saves_started.add(save.request_id)
                self._saves_copied.add(save.request_id)

    def build_connector_worker_meta(self) -> KvcWorkerMetadata | None:
        seconds, self._save_seconds = self._save_seconds, 0.0
        saving, self._saving_beside = self._saving_beside, False
        with self._stats_lock:
            ended, self._saves_ended = self._saves_ended, {}
        lost, self._lost = self._lost, {}
        return KvcWorkerMetadata(seconds, saving, ended, lost) \
            if saving or seconds > 0 or ended or lost else None

    def _wait_save(self, kvc: Connector, req_id: str) -> None:
        """Waits for the writes of ``req_id``'s save (on the save waiter)
        and notes how it ended, for the scheduler and the stats."""
        try:
            metrics: dict[str, Any] | None = kvc.wait_save(_save_id(req_id))
        except Error as error:
            logger.warning("kvc: request %s: save failed: %s", req_id, error)
            metrics = None
        with self._stats_lock:
            self._stats.saved(metrics)
            self._saves_ended[req_id] = metrics is not None

    def _saves_running(self) -> bool:
        """Whether a save's copies or writes may be running (saves run as
        one stretch: running when the step began or before its own saves
        were handed over, they ran beside its forward pass)."""
        return bool(self._save_ids) or \
            any(not write.done() for write in list(self._writes))

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata
                           ) -> None:
        assert isinstance(kv_connector_metadata, KvcConnectorMetadata)
        for req_id in kv_connector_metadata.preempted:
            if req_id in self._saves_started:
                # Its blocks are about to be reused: stop the save and wait
                # until it no longer reads them.
                self._forget_save(req_id)
                self._drain(req_id)

    def get_finished(self, finished_req_ids: set[str]
                     ) -> tuple[set[str] | None, set[str] | None]:
        self._finished_requests |= finished_req_ids
        for req_id in finished_req_ids & self._receiving.keys():
            # Aborted while loading: stopped, and reported once it ended
            # (vLLM holds the blocks until then; its staging blocks come
            # back then too, as it may write them until it ends).
            self._receiving[req_id].cancelled = True
            kvc = self._kvc_of.get(req_id)
            if kvc is not None:
                _cancel(kvc, req_id)
        self._poll()
        done = {r for r in self._saves_copied if r in self._finished_requests}
        for req_id in done:
            kvc = self._kvc_of.get(req_id)
            if kvc is not None and req_id in self._save_ids:
                # Its writes may take long behind a slow link: waited for
                # off the forward pass.
                self._save_ids.discard(req_id)
                write = self._save_waiter.submit(self._wait_save, kvc, req_id)
                self._writes.add(write)
                write.add_done_callback(self._writes.discard)
            self._forget(req_id)
            self._saves_copied.discard(req_id)
            self._saves_started.discard(req_id)
            self._finished_requests.discard(req_id)
        # Finished requests that saved nothing need no report.
        self._finished_requests &= self._saves_started
        received = set()
        for req_id in list(self._receiving):
            if req_id in self._loads_ended:
                load = self._receiving.pop(req_id)
                if load.cancelled:
                    self._forget_load(req_id)
                    if req_id not in self._saves_started:
                        self._kvc_of.pop(req_id, None)
                else:
                    self._end_load(load)
                received.add(req_id)
        received |= self._loads_ended - received
        self._loads_ended.clear()
        return (done or None), (received or None)

    def flush_saves(self, timeout: float = 300.0) -> bool:
        """Waits until the writes of every save reported done so far have
        ended (for benchmarks and tests that read the store next); whether
        they did within ``timeout`` seconds."""
        try:
            self._save_waiter.submit(lambda: None).result(timeout)
            return True
        except TimeoutError:
            return False

    @property
    def saves_in_flight(self) -> int:
        """Saves whose requests have not been reported done yet."""
        return len(self._saves_started)

    def get_block_ids_with_load_errors(self) -> set[int]:
        self._end_loads()
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        self._save_waiter.shutdown(wait=True)
        for kvc in self._kvcs.values():
            kvc.close()


    # -- Worker helpers -------------------------------------------------------

    def _metadata(self) -> KvcConnectorMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvcConnectorMetadata)
        if (meta.loads or meta.saves) and not self._registered:
            raise Error("vLLM's KV caches are not registered "
                        "(register_kv_caches)", "failed_precondition")
        return meta

    def _load_table(self, load: LoadSpec) -> list[int]:
        """The block table kvc loads ``load`` into: vLLM's, or staging
        blocks in its place (a packed CPU cache)."""
        if self._packed is None:
            return load.block_ids
        needed = -(-load.loaded // self._block_size)
        staging = self._packed.take(needed)
        if staging is None:
            raise Error(f"{needed} staging blocks are not free "
                        "(staging_blocks)", "resource_exhausted")
        self._load_staging[load.request_id] = (staging, set(range(self._layers)))
        return staging

    def _save_table(self, save: SaveSpec, layer: int) -> list[int]:
        """The block table kvc saves ``layer`` of ``save`` from: vLLM's, or
        staging blocks that now hold the layer (a packed CPU cache)."""
        if self._packed is None:
            return save.block_ids
        needed = -(-len(save.tokens) // self._block_size)
        staging = self._save_staging.get(save.request_id)
        if staging is None:
            staging = self._packed.take(needed)
            if staging is None:
                raise Error(f"{needed} staging blocks are not free "
                            "(staging_blocks)", "resource_exhausted")
            self._save_staging[save.request_id] = staging
        self._packed.unpack(layer, save.block_ids[:needed], staging)
        return staging

    def _pack(self, load: LoadSpec, layers: list[int]) -> None:
        """Packs ``layers`` of ``load`` from staging into vLLM's blocks
        (a packed CPU cache), each once: the blocks past the tokens vLLM
        held."""
        staged = self._load_staging.get(load.request_id)
        if staged is None or self._packed is None:
            return
        staging, unpacked = staged
        first = load.tokens_on_device // self._block_size
        for layer in layers:
            if layer in unpacked:
                unpacked.discard(layer)
                self._packed.pack(layer, staging[first:],
                                  load.block_ids[first:len(staging)])

    def _release_load(self, req_id: str) -> None:
        staged = self._load_staging.pop(req_id, None)
        if staged is not None and self._packed is not None:
            self._packed.give(staged[0])

    def _end_loads(self) -> None:
        """Waits for this step's synchronous loads."""
        for load in self._loading:
            self._end_load(load)
        self._loading = []

    def _end_load(self, load: LoadSpec) -> None:
        """Waits for ``load``, packs what it wrote into vLLM's blocks, and
        collects the blocks it left unwritten."""
        kvc = self._kvc_of[load.request_id]
        try:
            metrics = kvc.wait_load(load.request_id)
            logger.debug("kvc: request %s loaded: %s", load.request_id,
                         metrics)
            failed = kvc.failed_blocks(load.request_id)
            staged = self._load_staging.get(load.request_id)
            if staged is not None:
                # Staging ids back to vLLM's.
                where = {s: b for s, b in zip(staged[0], load.block_ids)}
                failed = [where[b] for b in failed]
            self._pack(load, list(range(self._layers)))
            self._load_errors.update(failed)
            lost = [(int(b), int(e)) for b, e in metrics.get("fallback_tokens", [])]
            if lost:
                self._lost[load.request_id] = lost
        except Error as error:
            logger.warning("kvc: request %s: load failed: %s",
                           load.request_id, error)
            metrics = None
            self._fail(load)
        with self._stats_lock:
            self._stats.loaded(load.loaded - load.tokens_on_device, metrics)
        self._forget_load(load.request_id)

    def _forget(self, req_id: str) -> None:
        """Forgets the request's load and save."""
        self._forget_load(req_id)
        self._forget_save(req_id)
        self._kvc_of.pop(req_id, None)

    def _forget_load(self, req_id: str) -> None:
        """Stops the request's load (its own request in kvc: its save goes
        on) and returns its staging blocks."""
        kvc = self._kvc_of.get(req_id)
        if kvc is not None:
            _cancel(kvc, req_id)
        self._release_load(req_id)

    def _forget_save(self, req_id: str) -> None:
        """Stops the request's save. Its staging blocks come back when kvc
        no longer reads them (_poll), or now if it never did."""
        kvc = self._kvc_of.get(req_id)
        if kvc is not None and req_id in self._save_ids:
            self._save_ids.discard(req_id)
            _cancel(kvc, _save_id(req_id))
        elif self._packed is not None and req_id in self._save_staging:
            self._packed.give(self._save_staging.pop(req_id))

    def _fail(self, load: LoadSpec) -> None:
        """Every block the load was to write past vLLM's own tokens."""
        first = load.tokens_on_device // self._block_size
        last = -(-load.loaded // self._block_size)
        self._load_errors.update(load.block_ids[first:last])

    def _poll(self) -> None:
        """Collects the saves that no longer read their blocks and the
        asynchronous loads that ended."""
        for kvc in self._kvcs.values():
            finished = kvc.finished()
            for save_id in finished.saves:
                req_id = save_id.removesuffix(_SAVE_SUFFIX)
                # It reads neither vLLM's blocks nor its staging blocks.
                if self._packed is not None and req_id in self._save_staging:
                    self._packed.give(self._save_staging.pop(req_id))
                if req_id in self._saves_started:
                    self._saves_copied.add(req_id)
            self._loads_ended.update(
                r for r in finished.loads if r in self._receiving)

    def _drain(self, req_id: str) -> None:
        deadline = time.monotonic() + _SAVE_DRAIN_SECONDS
        while req_id not in self._saves_copied:
            self._poll()
            if time.monotonic() > deadline:
                raise Error(f"request {req_id}: a cancelled save still reads "
                            "its blocks", "internal")
            time.sleep(0.001)
        self._saves_copied.discard(req_id)
        self._saves_started.discard(req_id)


_SAVE_SUFFIX = "/save"


def _in_measured_terms(decision: Decision, ratio: float, tokens: int,
                       recompute: float) -> str:
    """The decision's reason, in the measured terms it was weighed in."""
    why = decision.why
    if " predicted at " not in why:
        return why
    head = why.split(" is predicted at ")[0].split(": first token")[0]
    load = (f"{decision.predicted_seconds * ratio * 1e3:.2f} ms (the "
            f"planner's {decision.predicted_seconds * 1e3:.2f} ms x "
            f"{ratio:.2f}, as loads ran)")
    prefill = (f"vLLM's measured prefill of {tokens} tokens, "
               f"{recompute * 1e3:.2f} ms")
    return f"{head}: first token predicted at {load} against {prefill}" \
        if decision.loads else \
        f"{head} is predicted at {load}, not faster than {prefill}"


def _save_id(req_id: str) -> str:
    """The request a vLLM request's save is in kvc: apart from its load,
    so that either can end or fail without the other."""
    return req_id + _SAVE_SUFFIX


def _cancel(kvc: Connector, req_id: str) -> None:
    """Stops and forgets ``req_id`` in ``kvc``, if it knows it."""
    try:
        kvc.cancel(req_id)
    except Error:
        pass  # Already forgotten.


def _cpu_attention_isa(vllm_config: "VllmConfig", layer_name: str,
                       cache: torch.Tensor) -> str:
    """The instruction set vLLM's CPU attention writes ``cache`` for: the
    one its metadata builder gave the layer, else the one it would pick."""
    layers = vllm_config.compilation_config.static_forward_context
    isa = getattr(layers.get(layer_name), "isa", None)
    if isa:
        return str(isa)
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    _, _, block_size, width = cache.shape
    return str(_get_attn_isa(cache.dtype, block_size, width // 2,
                             str(vllm_config.cache_config.cache_dtype)))

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
build, whose caches are packed per instruction set (fp8 ones too), kvc
loads and saves through staging blocks (:mod:`kvc._vllm_cpu`); with
tensor parallelism there, rank 0's worker loads and saves whole objects
and exchanges each rank's heads with it (:mod:`kvc._vllm_worker`).

For a KV-aware router, the scheduler side publishes vLLM's KV events
(``take_events``): ``BlockStored`` with vLLM's block hashes once a save's
objects are written (medium ``STORAGE``, or ``CPU`` when every store is a
``mem://`` tier), ``BlockRemoved`` for the blocks of chunks a load could
not read. Its stats (``get_kv_connector_stats``, :mod:`kvc.vllm_metrics`)
are logged by vLLM and exported as Prometheus counters ``vllm:kvc_*``.
docs/vllm.md lists the extra-config keys and what is not supported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_events import KVCacheEvent

from ._vllm_common import (
    DecisionRecord,
    KvcConnectorMetadata,
    KvcWorkerMetadata,
    LoadSpec,
    SaveSpec,
)
from ._vllm_scheduler import SchedulerSide
from ._vllm_worker import WorkerSide
from .prefill import PrefillClock
from .vllm_metrics import KvcConnectorStats, KvcPromMetrics

if TYPE_CHECKING:
    from collections import deque

    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["KvcConnector", "KvcConnectorMetadata", "KvcWorkerMetadata",
           "DecisionRecord", "LoadSpec", "SaveSpec"]


class KvcConnector(KVConnectorBase_V1):
    """vLLM's KV connector over kvc (see the module's documentation).

    As vLLM's own connectors do, it hands each call to its role's side:
    :class:`~kvc._vllm_scheduler.SchedulerSide` in the scheduler,
    :class:`~kvc._vllm_worker.WorkerSide` in each worker. The
    configuration is read (and refused) when either is made."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig") -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.connector_scheduler: SchedulerSide | None = None
        self.connector_worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = SchedulerSide(
                vllm_config, self._kv_transfer_config, kv_cache_config)
        else:
            self.connector_worker = WorkerSide(
                vllm_config, self._kv_transfer_config, kv_cache_config,
                self._get_connector_metadata)

    @property
    def _scheduler(self) -> SchedulerSide:
        if self.connector_scheduler is None:
            raise RuntimeError("a scheduler-side call on a worker's connector")
        return self.connector_scheduler

    @property
    def _worker(self) -> WorkerSide:
        if self.connector_worker is None:
            raise RuntimeError("a worker-side call on the scheduler's connector")
        return self.connector_worker

    @property
    def _side(self) -> SchedulerSide | WorkerSide:
        side = self.connector_scheduler or self.connector_worker
        assert side is not None
        return side

    @property
    def decisions(self) -> "deque[DecisionRecord]":
        """What the scheduler side decided, the latest 4096 requests."""
        return self._scheduler.decisions

    @property
    def prefill_clock(self) -> PrefillClock:
        """vLLM's prefill as the scheduler side measured it."""
        return self._scheduler.prefill_clock

    # ==============================
    # Scheduler side
    # ==============================

    def on_new_request(self, request: "Request") -> None:
        self._scheduler.on_new_request(request)

    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int
                                   ) -> tuple[int | None, bool]:
        return self._scheduler.get_num_new_matched_tokens(request,
                                                          num_computed_tokens)

    def update_state_after_alloc(self, request: "Request",
                                 blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        self._scheduler.update_state_after_alloc(request, blocks,
                                                 num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput"
                             ) -> KVConnectorMetadata:
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self,
                                connector_output: "KVConnectorOutput") -> None:
        self._scheduler.update_connector_output(connector_output)

    def request_finished(self, request: "Request", block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler.request_finished(request, block_ids)

    def take_events(self) -> list[KVCacheEvent]:
        return self._scheduler.take_events()

    def has_pending_push_work(self) -> bool:
        return self._scheduler.has_pending_push_work()

    def has_pending_block_frees(self) -> bool:
        return self._scheduler.has_pending_block_frees()

    # ==============================
    # Worker side
    # ==============================

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: "ForwardContext",
                      **kwargs: Any) -> None:
        self._worker.start_load_kv(forward_context, **kwargs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: Any, **kwargs: Any) -> None:
        self._worker.save_kv_layer(layer_name, kv_layer, attn_metadata,
                                   **kwargs)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata
                                ) -> None:
        super().bind_connector_metadata(connector_metadata)
        self._worker.bind_connector_metadata()

    def wait_for_save(self) -> None:
        self._worker.wait_for_save()

    def build_connector_worker_meta(self) -> KvcWorkerMetadata | None:
        return self._worker.build_connector_worker_meta()

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata
                           ) -> None:
        self._worker.handle_preemptions(kv_connector_metadata)

    def get_finished(self, finished_req_ids: set[str]
                     ) -> tuple[set[str] | None, set[str] | None]:
        return self._worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.get_block_ids_with_load_errors()

    def flush_saves(self, timeout: float = 300.0) -> bool:
        """Waits until the writes of every save reported done so far have
        ended (for benchmarks and tests that read the store next); whether
        they did within ``timeout`` seconds."""
        return self._worker.flush_saves(timeout)

    @property
    def saves_in_flight(self) -> int:
        """Saves whose requests have not been reported done yet."""
        return self._worker.saves_in_flight

    # ==============================
    # Both sides
    # ==============================

    def get_kv_connector_stats(self) -> KvcConnectorStats | None:
        return self._side.get_kv_connector_stats()

    def shutdown(self) -> None:
        self._side.shutdown()

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

"""The worker side of kvc's vLLM connector (:mod:`kvc.vllm`): loads the
scheduler's decisions into vLLM's paged KV memory layer by layer while the
forward pass runs, saves prompts' whole chunks after it (copies and writes
in the background), and reports the blocks a load could not fill.

With tensor parallelism (vLLM's CPU build) only rank 0 runs kvc, on
staging blocks of every KV head. Every rank takes part in the same
exchanges, decided by the step's metadata and by what rank 0 sends first
(the loads it started): per layer of a load, rank 0's staging blocks go to
every rank, which packs its heads (``_pack``); per layer of a save, every
rank's heads come to rank 0 (``_gather_heads``). Each exchange carries a
tag (the request, the layer, the blocks), so that ranks out of step never
pack or store another request's heads.
"""

from __future__ import annotations

import time
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger

from ._errors import Error
from ._vllm_common import (
    SAVE_SUFFIX,
    ConnectorSide,
    KvcConnectorMetadata,
    KvcWorkerMetadata,
    LoadSpec,
    SaveSpec,
    cancel,
    layer_index,
    save_id,
)
from ._vllm_cpu import FP8_FORMATS, PackedCpuCache, Scales
from .connector import Connector

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.kv_cache_interface import KVCacheConfig

# Under the connector's name, as vLLM's users configure it.
logger = init_logger("kvc.vllm")

_SAVE_DRAIN_SECONDS = 30.0


class WorkerSide(ConnectorSide):
    """The connector's worker side (:class:`kvc.vllm.KvcConnector`
    delegates to it); ``metadata`` gives the step's
    :class:`KvcConnectorMetadata` as vLLM bound it."""

    def __init__(self, vllm_config: "VllmConfig",
                 transfer: "KVTransferConfig",
                 kv_cache_config: "KVCacheConfig | None",
                 metadata: Callable[[], KVConnectorMetadata]) -> None:
        super().__init__(vllm_config, KVConnectorRole.WORKER, transfer,
                         kv_cache_config)
        self._get_connector_metadata = metadata
        self._packed: PackedCpuCache | None = None
        # Tensor parallelism (tp > 1): the loads started on rank 0 and, on
        # the other ranks, each load's staging block count and the layers
        # not yet packed into vLLM's blocks.
        self._rank_loads: dict[str, tuple[int, set[int]]] = {}
        # Requests' staging blocks (a packed CPU cache): per load, its
        # staging table and the layers not yet packed into vLLM's blocks;
        # per save, its staging table.
        self._load_staging: dict[str, tuple[list[int], set[int]]] = {}
        self._save_staging: dict[str, list[int]] = {}
        # Requests whose save kvc runs (as its request save_id(id)), until
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

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        by_layer = sorted(kv_caches.items(), key=lambda kv: layer_index(kv[0]))
        tensors = [t for _, t in by_layer]
        if len(tensors) != self._layers:
            raise Error(f"vLLM registered {len(tensors)} KV caches for a model "
                        f"of {self._layers} layers", "failed_precondition")
        first = tensors[0]
        # A tensor-parallel rank holds its share of the KV heads; rank 0
        # stages all of them.
        heads = self._model.kv_heads // self._tp
        if self._tp > 1 and not (first.dim() == 4 and
                                 first.device.type == "cpu"):
            raise Error(f"tensor parallelism (tensor_parallel_size {self._tp})"
                        f" over caches of shape {tuple(first.shape)} on "
                        f"{first.device}: kvc runs it in vLLM's CPU build "
                        "only", "unimplemented")
        if self._cache_dtype in FP8_FORMATS and first.device.type != "cpu":
            raise Error(f"a {self._cache_dtype} KV cache on {first.device}: "
                        "kvc loads fp8 caches in vLLM's CPU build only",
                        "unimplemented")
        if first.dim() == 5 and first.shape[0] == 2:
            self._layout = "keys_first"
        elif first.dim() == 5 and first.shape[1] == 2:
            self._layout = "blocks_first"
        elif first.dim() == 4 and first.device.type == "cpu" and \
                tuple(first.shape[1:]) == (heads, self._block_size,
                                           2 * self._model.head_dim):
            # vLLM's CPU build: [blocks, heads, block_size, 2 * head_dim],
            # packed per instruction set; kvc works on staging blocks (rank
            # 0's hold every head; the other ranks' are never used).
            leads = self._leads()
            self._packed = PackedCpuCache(
                tensors, _cpu_attention_isa(self._vllm_config, by_layer[0][0],
                                            first),
                self._staging_blocks if leads else 1, self._cache_dtype,
                _kv_scales(self._vllm_config, [n for n, _ in by_layer]),
                staging_heads=self._model.kv_heads,
                first_head=self._tp_rank * heads)
            if self._packed.lossy:
                logger.warning("kvc: vLLM's KV cache is %s (%s); kvc stores "
                               "it as %s (rounded)", first.dtype,
                               self._cache_dtype, self._packed.staging_dtype)
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
        for load in meta.loads if self._leads() else []:
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
        if self._tp > 1 and meta.loads:
            # Every rank packs the loads rank 0 started, each layer from
            # rank 0's staging blocks (_pack).
            started = _tp_group().broadcast_object(
                {load.request_id: len(self._load_staging[load.request_id][0])
                 for load in self._loading} if self._leads() else None)
            if not self._leads():
                self._loading = [load for load in meta.loads
                                 if load.request_id in started]
                self._rank_loads = {
                    req_id: (count, set(range(self._layers)))
                    for req_id, count in started.items()}

    def wait_for_layer_load(self, layer_name: str) -> None:
        layer = layer_index(layer_name)
        # With stream_waits on a GPU, vLLM's stream waits for the layer (a
        # wait on device memory the load raises), not the host: the forward
        # pass queues on. Else the host waits.
        stream = torch.cuda.current_stream().cuda_stream \
            if self._on_cuda and self._stream_waits else None
        for load in self._loading:
            kvc = self._kvc_of.get(load.request_id)
            try:
                # Rank 0 loads; the other ranks wait for its blocks (_pack).
                if kvc is None:
                    pass
                elif stream is None:
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

    def bind_connector_metadata(self) -> None:
        """vLLM bound the step's metadata: whether saves were running as
        the step began."""
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
            try:
                values = self._gather_heads(save, layer)
            except Error as error:
                logger.error("kvc: request %s: not saved: %s", save.request_id,
                             error)
                self._forget_save(save.request_id)
                self._read_for_save(save.request_id)
                continue
            if not self._leads():
                self._read_for_save(save.request_id)
                continue
            kvc = self._kvc_for(save.tenant)
            self._kvc_of[save.request_id] = kvc
            if save.request_id in self._saves_copied:
                continue  # Refused at an earlier layer.
            try:
                blocks = self._save_table(save, layer, values)
                kvc.save_layer(save_id(save.request_id), save.tokens, layer,
                               blocks)
                self._save_ids.add(save.request_id)
                self._saves_started.add(save.request_id)
            except Error as error:
                logger.warning("kvc: request %s: layer %d not saved: %s",
                               save.request_id, layer, error)
                self._forget_save(save.request_id)
                self._read_for_save(save.request_id)

    def _read_for_save(self, req_id: str) -> None:
        """Nothing reads ``req_id``'s blocks for its save any more (it was
        refused, or this rank's heads went to rank 0): reported done once
        the request finishes, so that the scheduler frees them."""
        self._saves_started.add(req_id)
        self._saves_copied.add(req_id)

    def _gather_heads(self, save: SaveSpec, layer: int
                      ) -> torch.Tensor | None:
        """With tensor parallelism, ``layer`` of ``save``'s blocks, every
        rank's heads gathered on rank 0 (``[blocks, 2, block_size,
        kv_heads, head_dim]``; None on the other ranks); without, None."""
        if self._tp == 1 or self._packed is None:
            return None
        needed = -(-len(save.tokens) // self._block_size)
        group = _tp_group()
        # Each rank's tag first: ranks out of step (one failed a step the
        # others ran) would hand rank 0 another request's heads. All-gathers,
        # not gathers: vLLM's CPU gather lets a sender run ahead of rank 0,
        # and back-to-back gathers then lose a rank's data (a hang, seen).
        tags = group.all_gather(_tag(save.request_id, layer, needed), dim=0)
        values = group.all_gather(
            self._packed.unpack_values(layer, save.block_ids[:needed]), dim=3)
        if not self._leads():
            return None
        if not bool((tags.view(self._tp, -1) ==
                     tags.view(self._tp, -1)[0]).all()):
            raise Error(f"request {save.request_id}: layer {layer}: the "
                        "tensor-parallel ranks are out of step (their saves' "
                        "tags differ)", "internal")
        return values

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
            metrics: dict[str, Any] | None = kvc.wait_save(save_id(req_id))
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
                cancel(kvc, req_id)
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

    def _save_table(self, save: SaveSpec, layer: int,
                    values: torch.Tensor | None = None) -> list[int]:
        """The block table kvc saves ``layer`` of ``save`` from: vLLM's, or
        staging blocks that now hold the layer (a packed CPU cache): its
        blocks unpacked, or ``values``, every rank's heads of them."""
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
        if values is None:
            self._packed.unpack(layer, save.block_ids[:needed], staging)
        else:
            self._packed.staging[layer][torch.tensor(staging)] = values
        return staging

    def _pack(self, load: LoadSpec, layers: list[int]) -> None:
        """Packs ``layers`` of ``load`` from staging into vLLM's blocks
        (a packed CPU cache), each once: the blocks past the tokens vLLM
        held. With tensor parallelism every rank packs its heads of rank
        0's staging blocks, which rank 0 sends to all."""
        if self._packed is None:
            return
        if self._leads():
            staged = self._load_staging.get(load.request_id)
            if staged is None:
                return
            staging, unpacked = staged
            count = len(staging)
        else:
            count, unpacked = self._rank_loads[load.request_id]
        first = load.tokens_on_device // self._block_size
        for layer in layers:
            if layer not in unpacked:
                continue
            unpacked.discard(layer)
            if self._tp == 1:
                self._packed.pack(layer, staging[first:],
                                  load.block_ids[first:count])
                continue
            if count <= first:
                continue
            group = _tp_group()
            tag = _tag(load.request_id, layer, count)
            theirs = group.broadcast(tag.clone(), src=0)
            blocks = self._packed.staging[layer][torch.tensor(staging[first:])] \
                if self._leads() else torch.empty(
                    (count - first, *self._packed.staging[layer].shape[1:]),
                    dtype=self._packed.staging_dtype)
            group.broadcast(blocks, src=0)
            if not torch.equal(theirs, tag):
                # Out of step with rank 0: these are not the request's
                # blocks. vLLM recomputes them (the ranks' errors are one).
                logger.error("kvc: request %s: layer %d: the tensor-parallel "
                             "ranks are out of step; its blocks are "
                             "recomputed", load.request_id, layer)
                self._fail(load)
                continue
            self._packed.pack_values(layer, blocks[:, :, :, self._packed.heads],
                                     load.block_ids[first:count])

    def _release_load(self, req_id: str) -> None:
        staged = self._load_staging.pop(req_id, None)
        if staged is not None and self._packed is not None:
            self._packed.give(staged[0])

    def _end_loads(self) -> None:
        """Waits for this step's synchronous loads (on a tensor-parallel
        rank but 0, forgets them: rank 0 reports their failed blocks)."""
        if not self._leads():
            self._loading, self._rank_loads = [], {}
            return
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
            if self._tp == 1:
                self._pack(load, list(range(self._layers)))
            elif staged is not None and staged[1]:
                # A layer vLLM never waited for: the ranks did not pack it.
                self._fail(load)
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
            cancel(kvc, req_id)
        self._release_load(req_id)

    def _forget_save(self, req_id: str) -> None:
        """Stops the request's save. Its staging blocks come back when kvc
        no longer reads them (_poll), or now if it never did."""
        kvc = self._kvc_of.get(req_id)
        if kvc is not None and req_id in self._save_ids:
            self._save_ids.discard(req_id)
            cancel(kvc, save_id(req_id))
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
                req_id = save_id.removesuffix(SAVE_SUFFIX)
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
    # An fp8 cache's uint8 says nothing of the model's dtype, which the
    # choice reads.
    dtype, model_dtype = cache.dtype, vllm_config.model_config.dtype
    if dtype == torch.uint8 and isinstance(model_dtype, torch.dtype):
        dtype = model_dtype
    return str(_get_attn_isa(dtype, block_size, width // 2,
                             str(vllm_config.cache_config.cache_dtype)))


def _kv_scales(vllm_config: "VllmConfig", names: list[str]
               ) -> Callable[[int], Scales]:
    """Layer -> its attention layer's (k_scale, v_scale), read when asked:
    vLLM may set them after the caches are registered (from a checkpoint,
    or computed on the first forward pass)."""
    layers = vllm_config.compilation_config.static_forward_context

    def scales(layer: int) -> Scales:
        attention = layers.get(names[layer])
        return (float(getattr(attention, "_k_scale_float", 1.0)),
                float(getattr(attention, "_v_scale_float", 1.0)))
    return scales


def _tag(req_id: str, layer: int, blocks: int) -> torch.Tensor:
    """What tensor-parallel ranks exchange before a request's layer: equal
    on every rank in step (fp32, exact: vLLM's CPU gather takes no
    integers)."""
    crc = zlib.crc32(req_id.encode())
    return torch.tensor([crc >> 16, crc & 0xFFFF, layer, blocks],
                        dtype=torch.float32)


def _tp_group() -> Any:
    """vLLM's tensor-parallel group of this worker."""
    from vllm.distributed.parallel_state import get_tp_group

    return get_tp_group()

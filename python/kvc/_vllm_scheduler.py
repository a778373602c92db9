"""The scheduler side of kvc's vLLM connector (:mod:`kvc.vllm`): what to
load for each request, weighed against vLLM's measured prefill and queue,
which prompts to save, and the KV events of what the stores hold.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

from ._errors import Error
from ._vllm_common import (
    ConnectorSide,
    DecisionRecord,
    KvcConnectorMetadata,
    KvcWorkerMetadata,
    LoadSpec,
    SaveSpec,
    cancel,
)
from .connector import Connector, Decision
from .prefill import LoadClock, PrefillClock, mean_first_token, scaled_target

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

# Under the connector's name, as vLLM's users configure it.
logger = init_logger("kvc.vllm")

# The measured prefill is applied to the target again when it moves by more.
_RECALIBRATE_DRIFT = 0.1
# Requests behind a load that its pricing runs through vLLM's steps; those
# further back are each held up by the load's or the prefill's seconds.
_QUEUE_HORIZON = 128


class SchedulerSide(ConnectorSide):
    """The connector's scheduler side (:class:`kvc.vllm.KvcConnector`
    delegates to it)."""

    def __init__(self, vllm_config: "VllmConfig",
                 transfer: "KVTransferConfig",
                 kv_cache_config: "KVCacheConfig | None") -> None:
        super().__init__(vllm_config, KVConnectorRole.SCHEDULER, transfer,
                         kv_cache_config)
        # policy cheapest against vLLM's measured prefill (PrefillClock).
        self._measured = self._policy == "cheapest" and \
            self._prefill == "measured"
        self._clock = PrefillClock()
        self._load_clock = LoadClock()
        self._base_target: dict[str, Any] = self._options["target"]
        self._target_factor: float | None = None
        self._forward_prices: dict[int, float] = {}
        # The step being timed: when it began, its prompt tokens, and the
        # predicted seconds of its loads (0: it loads nothing).
        self._step: tuple[float, int, float] | None = None
        self.decisions: deque[DecisionRecord] = deque(maxlen=4096)
        # Each request's tenant, and what
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
        self._budget = int(vllm_config.scheduler_config.max_num_batched_tokens)
        self._waiting: dict[str, "Request"] = {}
        self._stored: dict[str, int] = {}
        self._this_step: list[tuple[int, float]] = []
        self._partial: dict[str, int] = {}
        self._carried: list[int] = []
        self._prefills: dict[str, SaveSpec] = {}
        self._saving: set[str] = set()
        # Finished requests whose blocks a save still holds.
        self._holding: set[str] = set()
        # KV events: the live requests (their
        # block hashes), the BlockStored of each save sent to the workers
        # until they report its writes, and the events not yet taken.
        self._requests: dict[str, "Request"] = {}
        self._announce: dict[str, BlockStored] = {}
        self._events: list[KVCacheEvent] = []

    @property
    def prefill_clock(self) -> PrefillClock:
        """vLLM's prefill as the scheduler side measured it."""
        return self._clock

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
                cancel(self._kvc_for(tenant), request.request_id)
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
            cancel(self._kvc_for(tenant), req_id)
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

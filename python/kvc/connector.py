"""The Connector: the one object an LLM server asks about KV it can load.

A server configures one :class:`Connector` (its model, its stores, the
machine plans are priced for) and hands it its paged KV memory once
(:meth:`Connector.register_caches`). Then, per request::

    found = connector.lookup(tokens)              # what the stores hold
    decision = connector.decide(rid, tokens, 0)   # load how much, or not
    if decision.loads:
        connector.start_load(rid, block_ids)      # into the server's blocks
        for layer in range(layers):
            connector.wait_layer(rid, layer)      # attention of layer i here
        connector.wait_load(rid)
        redo = connector.failed_blocks(rid)       # blocks to recompute
    ...
    connector.save_layer(rid, tokens, layer, block_ids)  # after layer i
    connector.wait_save(rid)
    connector.cancel(rid)                         # done with the request

Every call releases the GIL; only the waits block. Errors are raised as
:class:`kvc.Error`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from . import _kvc
from ._errors import Error

Tokens = Sequence[int]
"""Token ids: a list, a 1-D numpy array or a 1-D torch tensor."""

CacheLayout = Literal["separate", "keys_first", "blocks_first"]
Policy = Literal["cheapest", "always", "never"]
Prefill = Callable[[list[int], int, int, list[tuple[Any, Any]]],
                   Sequence[tuple[Any, Any]]]
"""The server's prefill (:meth:`Connector.prefill_with`)."""

_TARGETS = Path(__file__).resolve().parent / "targets"


def targets() -> list[str]:
    """The target machines this package carries, by name."""
    return sorted(p.stem for p in _TARGETS.glob("*.json"))


def target_json(target: str | os.PathLike[str] | dict[str, Any]) -> str:
    """A target description as JSON text: a carried target's name
    (:func:`targets`), a path to a target JSON file (``kvc-run calibrate``
    writes one for the machine it runs on), or the description itself."""
    if isinstance(target, dict):
        return json.dumps(target)
    carried = _TARGETS / f"{target}.json"
    path = carried if carried.is_file() else Path(target)
    try:
        return path.read_text()
    except OSError as error:
        raise Error(f"target {target!s}: not a carried target ({', '.join(targets())}) "
                    f"nor a readable file: {error.strerror}",
                    "not_found") from None


def token_list(tokens: Tokens) -> list[int]:
    """``tokens`` as a list of Python ints (accepts numpy and torch)."""
    tolist = getattr(tokens, "tolist", None)
    listed = tolist() if tolist is not None else list(tokens)
    if listed and isinstance(listed[0], list):
        raise Error("tokens must be one-dimensional", "invalid_argument")
    return [int(t) for t in listed]


class Model:
    """A model kvc computes with (config.json and safetensors weights, as
    transformers saves a Llama, Mistral, Qwen2 or Qwen3 model). The Connector
    recomputes with it what a plan computes rather than loads."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._model = _kvc.Model.load(os.fspath(directory))
        self.directory = os.fspath(directory)

    @property
    def fingerprint(self) -> str:
        """The digest of the weights (stores key objects by it)."""
        return self._model.fingerprint

    @property
    def layers(self) -> int:
        return self._model.layers

    @property
    def kv_heads(self) -> int:
        return self._model.kv_heads

    @property
    def head_dim(self) -> int:
        return self._model.head_dim

    @property
    def vocab_size(self) -> int:
        return self._model.vocab_size

    @property
    def max_positions(self) -> int:
        return self._model.max_positions


@dataclass(frozen=True)
class Held:
    """What one store holds of a prefix in one layout, form and encoding."""

    store: int
    chunk_tokens: int
    layer_group: int
    form: str
    codec: str
    tokens: int


@dataclass(frozen=True)
class Lookup:
    """What the stores hold of a request's prefix."""

    tokens: int
    """The longest prefix held, in tokens (whole chunks)."""
    held: list[Held] = field(default_factory=list)
    from_index: bool = False
    """Whether this process's index answered without asking a store."""


@dataclass(frozen=True)
class Decision:
    """What :meth:`Connector.decide` chose for a request."""

    load_tokens: int
    """Tokens ``[0, load_tokens)`` are resident once the load ends; the
    server computes the rest."""
    strategy: str
    """The plan's strategy; empty when nothing loads."""
    predicted_seconds: float
    recompute_seconds: float
    why: str
    store: int = -1
    """The store the load reads (an index into the Connector's stores);
    -1 when nothing loads."""
    chunk_tokens: int = 0
    layer_group: int = 0
    """The layout of the holding it reads."""

    @property
    def loads(self) -> bool:
        return bool(self.strategy)


@dataclass(frozen=True)
class Finished:
    """Loads that ended and saves that no longer read the server's blocks."""

    loads: list[str]
    saves: list[str]


class Connector:
    """kvc inside a server: lookups, decisions, loads and saves of requests'
    KV into and out of the server's own paged memory.

    Args:
        model: the model, or its directory.
        stores: store URLs, first the one saves write: ``mem://``,
            ``file:///path``, ``redis://host:port``, each with an optional
            ``?gbps=N`` throttle.
        target: the machine plans are priced for: a carried target's name,
            a target JSON file (``kvc-run calibrate``) or its content.
        tenant: salts every key; tenants never share objects.
        chunk_tokens, layer_group, codec: how saves lay out and encode
            objects (recorded in the store, so readers need not be told).
        strategies: those decide chooses among (``joint`` searches them all).
        policy: ``cheapest`` loads only when the first token comes earlier;
            ``always`` loads whatever is stored; ``never`` loads nothing.
        recompute_failures: chunks that cannot be loaded intact are
            recomputed by kvc (True) or reported by :meth:`failed_blocks`.
        bundles: plan bundles compiled ahead; empty: the compiler in this
            process plans (``kvc.has_compiler``).
        device: ``cpu``, or ``cuda`` for caches in GPU memory.
    """

    def __init__(
        self,
        model: Model | str | os.PathLike[str],
        stores: Sequence[str],
        *,
        target: str | os.PathLike[str] | dict[str, Any] = "cpu-2core",
        tenant: str = "",
        chunk_tokens: int = 256,
        layer_group: int = 1,
        codec: str = "raw",
        strategies: Sequence[str] = ("joint",),
        policy: Policy = "cheapest",
        recompute_failures: bool = True,
        staging_mib: int = 256,
        codec_profile: str = "",
        max_kl: float = math.inf,
        bundles: Sequence[str | os.PathLike[str]] = (),
        device: Literal["cpu", "cuda"] = "cpu",
        plan_cache_entries: int = 256,
    ) -> None:
        self.model = model if isinstance(model, Model) else Model(model)
        self._caches: tuple[Any, ...] = ()
        spec = _kvc.ConnectorSpec()
        spec.stores = list(stores)
        spec.tenant = tenant
        spec.chunk_tokens = chunk_tokens
        spec.layer_group = layer_group
        spec.codec = codec
        spec.strategies = ",".join(strategies)
        spec.policy = policy
        spec.recompute_failures = recompute_failures
        spec.staging_mib = staging_mib
        spec.codec_profile = codec_profile
        spec.max_kl = max_kl
        spec.plan_cache_entries = plan_cache_entries
        self._connector: _kvc.Connector | None = _kvc.Connector.create(
            self.model._model, spec, target_json(target),
            [os.fspath(b) for b in bundles], device)

    # -- Set-up ---------------------------------------------------------------

    def register_caches(self, keys: Sequence[Any],
                        values: Sequence[Any] | None = None,
                        layout: CacheLayout = "separate") -> None:
        """Hands the Connector the server's KV memory (again, replacing it,
        only while no load or save runs).

        ``keys`` (and ``values``) are per layer, bfloat16 or float16,
        C-contiguous, as vLLM allocates them:
        ``separate``: K and V tensors ``[blocks, block_size, kv_heads,
        head_dim]``; ``keys_first``: one ``[2, blocks, ...]`` tensor per
        layer; ``blocks_first``: one ``[blocks, 2, ...]``. Torch tensors
        and numpy arrays are viewed, never copied; the Connector keeps them
        alive.
        """
        keys = list(keys)
        values = list(values) if values is not None else []
        self._get().register_caches(keys, values, layout)
        self._caches = (keys, values)

    # -- Per request ----------------------------------------------------------

    def lookup(self, tokens: Tokens) -> Lookup:
        """How much of ``tokens``' prefix the stores hold. Reads no payload."""
        found = self._get().lookup(token_list(tokens))
        return Lookup(
            tokens=found.tokens,
            held=[Held(h.store, h.chunk_tokens, h.layer_group, h.form, h.codec,
                       h.tokens) for h in found.held],
            from_index=found.from_index)

    def decide(self, request_id: str, tokens: Tokens,
               tokens_on_device: int = 0,
               recompute_seconds: float | None = None) -> Decision:
        """Decides how much of request ``request_id``'s prompt ``tokens`` to
        load, when the server's own cache already holds its first
        ``tokens_on_device``. ``recompute_seconds``: what recomputing the
        tokens past those takes the server, where it measures it (policy
        ``cheapest`` loads only what is predicted faster); None: the
        target's price. Remembers the request until :meth:`cancel`."""
        return _decision(self._get().decide(
            request_id, token_list(tokens), tokens_on_device,
            recompute_seconds))

    def decide_as(self, request_id: str, tokens: Tokens,
                  tokens_on_device: int, decided: Decision) -> Decision:
        """Runs another Connector's decision (a server's scheduler's, over
        the same stores) for request ``request_id``: the plan of its
        strategy over its holding, nothing priced or chosen again. Raises
        :class:`kvc.Error` (``not_found``) where the holding no longer
        covers the decided tokens."""
        if not decided.loads:
            raise Error("a decision that loads nothing", "invalid_argument")
        return _decision(self._get().decide_as(
            request_id, token_list(tokens), tokens_on_device,
            decided.load_tokens, decided.strategy, decided.store,
            decided.chunk_tokens, decided.layer_group))

    def start_load(self, request_id: str, block_ids: Sequence[int]) -> None:
        """Starts the decided load into ``block_ids`` (the request's block
        table from token 0), in the background."""
        self._get().start_load(request_id, [int(b) for b in block_ids])

    def wait_layer(self, request_id: str, layer: int,
                   timeout: float | None = None) -> None:
        """Blocks until ``layer`` holds the loaded tokens; raises
        :class:`kvc.Error` if the load failed or ``timeout`` seconds passed
        (code ``unavailable``)."""
        self._get().wait_layer(request_id, layer, timeout)

    def wait_layer_on(self, request_id: str, layer: int, stream: int) -> None:
        """Makes the device stream ``stream`` (a ``cudaStream_t`` as an
        integer: ``torch.cuda.current_stream().cuda_stream``) wait until
        ``layer`` holds the loaded tokens or the load ends, and returns at
        once: work queued on the stream after this call runs after the
        layer is written. Where the device makes no stream waits (the CPU
        device), blocks as :meth:`wait_layer` does. A failed load lets the
        stream go on too: :meth:`failed_blocks` says what to recompute."""
        self._get().wait_layer_on(request_id, layer, int(stream))

    def wait_load(self, request_id: str) -> dict[str, Any]:
        """Blocks until the load ends; its metrics (seconds, bytes read per
        tier, busy seconds per resource, fallbacks, ...)."""
        return self._get().wait_load(request_id)

    def failed_blocks(self, request_id: str) -> list[int]:
        """The blocks the server must recompute after the load."""
        return list(self._get().failed_blocks(request_id))

    def save_layer(self, request_id: str, tokens: Tokens, layer: int,
                   block_ids: Sequence[int]) -> None:
        """Saves ``layer`` of the request once the server wrote it; whole
        chunks only, objects already stored skipped."""
        self._get().save_layer(request_id, token_list(tokens), layer,
                               [int(b) for b in block_ids])

    def wait_save(self, request_id: str) -> dict[str, Any]:
        """Blocks until the request's save ends (every layer given)."""
        return self._get().wait_save(request_id)

    def cancel(self, request_id: str) -> None:
        """Stops the request's load and save and forgets it; its blocks are
        the server's again once :meth:`finished` lists it."""
        self._get().cancel(request_id)

    def finished(self) -> Finished:
        """The loads and saves that ended since the last call."""
        loads, saves = self._get().finished()
        return Finished(list(loads), list(saves))

    # -- State ----------------------------------------------------------------

    # -- The server's model -----------------------------------------------------

    def prefill_with(self, prefill: Prefill | None) -> None:
        """Makes the server's own model compute what a plan computes or
        recomputes, instead of kvc's: ``prefill(tokens, position, layers,
        past)`` runs ``tokens`` at positions ``position``.. through the
        model's first ``layers`` layers over the context ``past`` (per
        layer, K and V float32 arrays ``[position, kv_heads, head_dim]``)
        and returns per layer their K and V ``[len(tokens), kv_heads,
        head_dim]`` (float arrays or CPU tensors), which kvc writes into the
        cache. It is called from kvc's threads, with the GIL held, while a
        load runs; an exception fails the chunk it computed. None: kvc's
        model again. Caches in host memory only (a GPU cache's chunks stay
        kvc's). :class:`kvc.transformers.CacheClient` sets transformers'
        forward."""
        self._get().set_prefill(prefill)

    @property
    def prefills_served(self) -> int:
        """Prefills the server's model ran for kvc (:meth:`prefill_with`)."""
        return int(self._get().prefills_served)

    @property
    def plans_compiled(self) -> int:
        return self._get().plans_compiled

    @property
    def plan_cache_hits(self) -> int:
        return self._get().plan_cache_hits

    def close(self) -> None:
        """Waits for what runs and releases the stores, the caches and the
        server's prefill."""
        if self._connector is not None:
            self._connector.close()
            self._connector.set_prefill(None)
            self._connector = None
            self._caches = ()

    def __enter__(self) -> Connector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self) -> Any:
        if self._connector is None:
            raise Error("the connector is closed", "failed_precondition")
        return self._connector


def _decision(d: Any) -> Decision:
    return Decision(d.load_tokens, d.strategy, d.predicted_seconds,
                    d.recompute_seconds, d.why, d.store, d.chunk_tokens,
                    d.layer_group)


def compile_restore(model: Model, store: str, tokens: Tokens, *,
                    target: str | os.PathLike[str] | dict[str, Any] = "cpu-2core",
                    tenant: str = "",
                    strategies: Sequence[str] = ("all",)) -> dict[str, float | None]:
    """Compiles the restore of ``tokens`` from what ``store`` holds for
    ``target``, one plan per strategy (``all``: every strategy the store
    allows); each plan's predicted seconds (None where not estimated).
    Needs the compiler in this process (``kvc.has_compiler``)."""
    if not _kvc.has_compiler:
        raise Error("this kvc was built without the compiler", "unavailable")
    plans = _kvc.compile_restore(model._model, store, tenant, token_list(tokens),
                                 target_json(target), list(strategies))
    return dict(plans)

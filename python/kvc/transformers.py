"""kvc as a Hugging Face transformers client.

transformers keeps a request's KV in a ``DynamicCache`` (per layer
``[batch, kv_heads, tokens, head_dim]``); kvc moves KV through a server's
paged memory. :class:`PagedMemory` is that memory, in vLLM's layout, and
:class:`CacheClient` puts the two together:

    client = CacheClient(model, connector)
    client.save("a", prompt)                 # transformers' prefill, stored
    restored = client.restore("b", prompt)   # kvc decides, loads, computes
    model.generate(prompt[None], past_key_values=restored.cache, ...)

``generate`` continues from the restored tokens and prefills the rest of
the prompt itself, as it does after any cached prefix. What a plan computes
or recomputes is transformers' own forward too (the server's prefill,
:meth:`kvc.Connector.prefill_with`), not kvc's model.
"""

from __future__ import annotations

import copy
import math
import time
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ._errors import Error
from .connector import Connector, Decision, token_list
from .prefill import PrefillClock

__all__ = ["CacheClient", "PagedMemory", "Restored", "next_token_quality"]


class PagedMemory:
    """A server's paged KV memory: per layer a K and a V tensor
    ``[num_blocks, block_size, kv_heads, head_dim]`` (vLLM's layout), and
    the blocks not in use."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int,
                 num_blocks: int, block_size: int = 16,
                 dtype: torch.dtype = torch.float16,
                 device: str | torch.device = "cpu") -> None:
        shape = (num_blocks, block_size, kv_heads, head_dim)
        self.block_size = block_size
        self.keys = [torch.zeros(shape, dtype=dtype, device=device)
                     for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device)
                       for _ in range(layers)]
        self._free = list(range(num_blocks - 1, -1, -1))

    def allocate(self, tokens: int) -> list[int]:
        """Blocks for ``tokens`` tokens (a block table from token 0)."""
        count = -(-tokens // self.block_size)
        if count > len(self._free):
            raise Error(f"{tokens} tokens need {count} KV blocks, "
                        f"{len(self._free)} are free", "failed_precondition")
        return [self._free.pop() for _ in range(count)]

    def free(self, blocks: Sequence[int]) -> None:
        self._free.extend(reversed(list(blocks)))

    def write(self, layer: int, blocks: Sequence[int], keys: torch.Tensor,
              values: torch.Tensor) -> None:
        """Writes ``[tokens, kv_heads, head_dim]`` K and V of tokens
        ``[0, tokens)`` into ``blocks``, converted to the memory's dtype and
        device."""
        tokens = keys.shape[0]
        rows = self._rows(blocks, tokens)
        for memory, given in ((self.keys[layer], keys),
                              (self.values[layer], values)):
            memory.view(-1, *given.shape[1:])[rows] = given.to(
                device=memory.device, dtype=memory.dtype)

    def read(self, layer: int, blocks: Sequence[int],
             tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of tokens ``[0, tokens)`` held in ``blocks``,
        ``[tokens, kv_heads, head_dim]`` each."""
        rows = self._rows(blocks, tokens)
        k, v = self.keys[layer], self.values[layer]
        return (k.view(-1, *k.shape[2:])[rows], v.view(-1, *v.shape[2:])[rows])

    def _rows(self, blocks: Sequence[int], tokens: int) -> torch.Tensor:
        if tokens > len(blocks) * self.block_size:
            raise Error(f"{len(blocks)} blocks hold fewer than {tokens} tokens",
                        "invalid_argument")
        device = self.keys[0].device
        t = torch.arange(tokens, device=device)
        table = torch.tensor(list(blocks), dtype=torch.long, device=device)
        return table[t // self.block_size] * self.block_size + t % self.block_size


@dataclass
class Restored:
    """A restore into a transformers cache."""

    cache: Any
    """A ``DynamicCache`` holding the prompt's first ``tokens`` tokens."""
    tokens: int
    decision: Decision
    metrics: dict[str, Any] | None
    """The load's metrics; None when nothing loaded."""
    failed_blocks: list[int]


class CacheClient:
    """Saves transformers' KV through a :class:`~kvc.Connector` and
    restores it into a ``DynamicCache``.

    The Connector's model must be the transformers model's. What a plan
    computes or recomputes, transformers computes (``server_prefill``, the
    default: :meth:`prefill`, set as the Connector's prefill), or kvc with
    its own model (False). ``memory`` defaults to room for
    ``capacity_tokens`` tokens in float16 on the CPU.

    Loads are weighed against transformers' own prefill as measured
    (:attr:`prefill_clock`, fit to the prefills it runs here: saves'
    and the server prefills kvc asks for), once it has seen enough; until
    then, against the Connector target's price.
    """

    def __init__(self, model: Any, connector: Connector,
                 memory: PagedMemory | None = None,
                 capacity_tokens: int = 8192,
                 server_prefill: bool = True) -> None:
        config = model.config
        kv_heads = getattr(config, "num_key_value_heads", None) or \
            config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or \
            config.hidden_size // config.num_attention_heads
        layers = config.num_hidden_layers
        if (layers, kv_heads, head_dim) != (connector.model.layers,
                                            connector.model.kv_heads,
                                            connector.model.head_dim):
            raise Error(
                f"the transformers model has {layers} layers of {kv_heads} KV "
                f"heads of {head_dim}; the connector's model "
                f"{connector.model.layers}, {connector.model.kv_heads}, "
                f"{connector.model.head_dim}", "failed_precondition")
        self.model = model
        self.connector = connector
        self.memory = memory or PagedMemory(
            layers, kv_heads, head_dim, -(-capacity_tokens // 16))
        connector.register_caches(self.memory.keys, self.memory.values)
        self.prefill_clock = PrefillClock()
        if server_prefill:
            # Held weakly: the Connector outlives no client it calls back.
            me = weakref.ref(self)

            def prefill(tokens: list[int], position: int, layers: int,
                        past: list[tuple[Any, Any]]
                        ) -> list[tuple[torch.Tensor, torch.Tensor]]:
                client = me()
                if client is None:
                    raise Error("the CacheClient is gone", "failed_precondition")
                return client.prefill(tokens, position, layers, past)

            connector.prefill_with(prefill)

    @torch.no_grad()
    def prefill(self, tokens: list[int], position: int, layers: int,
                past: list[tuple[Any, Any]]
                ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """transformers' forward of ``tokens`` at positions ``position``..
        over the context ``past`` (per layer computed, K and V
        ``[position, kv_heads, head_dim]``): their K and V of the first
        ``layers`` layers, ``[len(tokens), kv_heads, head_dim]`` (what kvc
        asks of the server's model, :meth:`kvc.Connector.prefill_with`).
        The context is copied into a ``DynamicCache``, which transformers'
        attention reads; the layers kvc does not ask for hold zeros there
        (no layer's output depends on a deeper one)."""
        from transformers import DynamicCache

        model = self.model
        device, dtype = model.device, model.dtype
        if position > 0:
            _, _, kv_heads, head_dim = self.memory.keys[0].shape
            zeros = torch.zeros(1, kv_heads, position, head_dim,
                                device=device, dtype=dtype)
            context = [
                tuple(torch.as_tensor(x).permute(1, 0, 2)[None].to(device, dtype)
                      for x in past[layer]) if layer < layers else (zeros, zeros)
                for layer in range(len(self.memory.keys))]
            # Without the config: layers that keep every token (a sliding
            # window's layers would drop the new tokens' first ones).
            cache = DynamicCache(context)
        else:
            cache = DynamicCache()
        ids = torch.tensor([tokens], device=device)
        positions = torch.arange(position, position + len(tokens),
                                 device=device)[None]
        began = time.perf_counter()
        model(ids, past_key_values=cache, position_ids=positions,
              use_cache=True)
        self.prefill_clock.observe(len(tokens), time.perf_counter() - began)
        def new(x: torch.Tensor) -> torch.Tensor:
            return x[0, :, position:].transpose(0, 1).float().cpu().contiguous()

        return [(new(k), new(v))
                for k, v in (_layer_kv(cache, layer) for layer in range(layers))]

    @torch.no_grad()
    def save(self, request_id: str, input_ids: Any,
             cache: Any | None = None) -> dict[str, Any]:
        """Stores the KV of ``input_ids`` (1-D): ``cache``'s, or a prefill
        of transformers' own when None. Returns the save's metrics."""
        tokens = token_list(input_ids)
        if cache is None:
            from transformers import DynamicCache

            ids = torch.tensor([tokens], device=self.model.device)
            began = time.perf_counter()
            # A cache that keeps every token (a sliding window's keeps the
            # window's only).
            cache = self.model(ids, past_key_values=DynamicCache(),
                               use_cache=True).past_key_values
            self.prefill_clock.observe(len(tokens),
                                       time.perf_counter() - began)
        blocks = self.memory.allocate(len(tokens))
        announced = False
        try:
            for layer in range(len(self.memory.keys)):
                k, v = _layer_kv(cache, layer)
                self.memory.write(layer, blocks,
                                  k[0, :, :len(tokens)].transpose(0, 1),
                                  v[0, :, :len(tokens)].transpose(0, 1))
                self.connector.save_layer(request_id, tokens, layer, blocks)
                announced = True
            return self.connector.wait_save(request_id)
        finally:
            # A request the Connector never saw is not cancelled: the error
            # that stopped it is the one raised.
            if announced:
                self.connector.cancel(request_id)
            self.memory.free(blocks)

    @torch.no_grad()
    def restore(self, request_id: str, input_ids: Any) -> Restored:
        """Asks the Connector what to load of ``input_ids``' prefix, loads
        it, and returns a ``DynamicCache`` holding it, for ``generate`` or a
        forward pass over the rest. At most all but the last prompt token
        are returned (``generate`` needs one to start from). Chunks that
        could not be loaded intact and were not recomputed end the prefix
        at the first of them."""
        from transformers import DynamicCache

        tokens = token_list(input_ids)
        decision = self.connector.decide(
            request_id, tokens, 0, self.prefill_clock.seconds(len(tokens)))
        blocks: list[int] = []
        metrics: dict[str, Any] | None = None
        failed: list[int] = []
        try:
            resident = decision.load_tokens
            if decision.loads:
                blocks = self.memory.allocate(resident)
                self.connector.start_load(request_id, blocks)
                metrics = self.connector.wait_load(request_id)
                failed = self.connector.failed_blocks(request_id)
                if failed:
                    first = min(blocks.index(b) for b in failed)
                    resident = min(resident, first * self.memory.block_size)
            resident = min(resident, len(tokens) - 1)
            dtype = self.model.dtype
            layers = []
            for layer in range(len(self.memory.keys)):
                k, v = self.memory.read(layer, blocks, resident)
                layers.append((
                    k.transpose(0, 1)[None].to(self.model.device, dtype),
                    v.transpose(0, 1)[None].to(self.model.device, dtype)))
            cache = (DynamicCache(layers, config=self.model.config)
                     if resident > 0 else DynamicCache(config=self.model.config))
            return Restored(cache, resident, decision, metrics, failed)
        finally:
            self.connector.cancel(request_id)
            self.memory.free(blocks)


def _layer_kv(cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of ``layer`` in a transformers cache,
    ``[batch, kv_heads, tokens, head_dim]``."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache[layer][0], cache[layer][1]


@torch.no_grad()
def next_token_quality(model: Any, restored: Restored, input_ids: Any,
                       continuation: Any) -> tuple[float, float]:
    """How a restored cache changes transformers' own predictions: over
    the rest of the prompt and ``continuation`` (teacher-forced), the mean
    KL divergence (nats) of the next-token distribution from the one a
    full prefill gives, and the fraction of positions whose top token
    agrees."""
    prompt, more = token_list(input_ids), token_list(continuation)
    ids = torch.tensor([prompt + more], device=model.device)
    reference = model(ids).logits[0, restored.tokens:].float()
    cache = copy.deepcopy(restored.cache)  # The forward pass extends it.
    mine = model(ids[:, restored.tokens:],
                 past_key_values=cache).logits[0].float()
    log_p, log_q = reference.log_softmax(-1), mine.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    agree = (reference.argmax(-1) == mine.argmax(-1)).float()
    if not math.isfinite(float(kl.mean())):
        raise Error("non-finite logits after the restore", "data_loss")
    return float(kl.mean()), float(agree.mean())

"""vLLM's CPU KV cache, as kvc reads and writes it.

vLLM's CPU attention backend keeps each layer in one tensor
``[num_blocks, kv_heads, block_size, 2 * head_dim]`` whose blocks are laid
out for the kernels of the instruction set it picked (``vec``, ``vec16``,
``amx``, ``neon``, ...): K transposed for some, K and V tile-packed for
others, and more to come. kvc writes and reads tokens, so it does not
hard-code any of them. It learns each block's layout from vLLM's own cache
write (``cpu_attn_reshape_and_cache``, the operation the forward pass
writes K and V with): one probe per bit of an element's index gives, for
every element of a block, which K or V value vLLM puts there. That map is
checked to be a permutation and is then applied in both directions by
plain gathers:

- kvc loads into *staging* blocks laid out ``[2, block_size, kv_heads,
  head_dim]`` (the Connector's ``blocks_first`` layout) and each loaded
  layer is packed into vLLM's blocks before its attention runs;
- a save unpacks the request's blocks of a layer into staging blocks when
  vLLM hands the layer over, and kvc saves from those.

An fp8 cache (``kv_cache_dtype`` ``fp8``/``fp8_e4m3`` or ``fp8_e5m2``: bytes
of K / k_scale and V / v_scale) is staged in bf16. Its layout is learned
from the codes of 0 and 1 (the scales at 1), a load is packed by vLLM's
own write with the layer's scales (so the bytes are the ones vLLM's
forward pass would write for the same K and V), and a save decodes the
codes times the scales into staging (exact in bf16 for scales of 1, every
fp8 value being a bf16 value; rounded to bf16 otherwise). Saved and
loaded again, an fp8 cache gets its own codes back, but for negative
zeros (vLLM's code of a small negative value), which come back as zeros:
the same value to its attention.

Staging blocks are taken from a pool per load and save and given back when
it ends. The pool holds as many blocks as vLLM's cache unless told
otherwise; a load or save that finds too few is not started (the server
recomputes; the prompt is not saved).
"""

from __future__ import annotations

from typing import Callable

import torch

from ._errors import Error

__all__ = ["FP8_FORMATS", "PackedCpuCache", "learn_block_layout"]

_STAGING_DTYPES = {torch.bfloat16: torch.bfloat16, torch.float16: torch.float16,
                   torch.float32: torch.bfloat16}

#: vLLM's fp8 cache dtypes (its ``kv_cache_dtype``) and the format of
#: their bytes; vLLM's CPU attention reads ``fp8`` as E4M3.
FP8_FORMATS = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
               "fp8_e5m2": torch.float8_e5m2}

#: A layer's (k_scale, v_scale): what an fp8 cache's codes are multiplied by.
Scales = tuple[float, float]


def _write(key: torch.Tensor, value: torch.Tensor, cache: torch.Tensor,
           slots: torch.Tensor, isa: str, kv_cache_dtype: str = "auto",
           scales: Scales = (1.0, 1.0)) -> None:
    """vLLM's cache write of tokens ``key`` and ``value`` (``[tokens,
    kv_heads, head_dim]``) into ``cache`` (``[blocks, kv_heads, block_size,
    2 * head_dim]``) at ``slots`` (block * block_size + offset), as its
    forward pass writes them."""
    from vllm import _custom_ops as ops

    blocks, heads, size, _ = cache.shape
    halves = cache.view(blocks, heads, 2 * size, -1).chunk(2, dim=2)
    try:
        ops.cpu_attn_reshape_and_cache(key, value, halves[0], halves[1], slots,
                                       isa, scales[0], scales[1],
                                       kv_cache_dtype)
    except RuntimeError as error:
        raise Error(f"vLLM's CPU cache write ({isa}, {kv_cache_dtype}, "
                    f"{cache.dtype}) refused blocks of {heads} heads x {size} "
                    f"tokens: {error}", "unimplemented") from None


def _decoded(codes: torch.Tensor, kv_cache_dtype: str) -> torch.Tensor:
    """The values of ``codes`` (a cache's elements) in fp32: an fp8 cache's
    bytes decoded (its scales not applied), others widened."""
    if kv_cache_dtype in FP8_FORMATS:
        return codes.view(FP8_FORMATS[kv_cache_dtype]).to(torch.float32)
    return codes.to(torch.float32)


def learn_block_layout(dtype: torch.dtype, kv_heads: int, block_size: int,
                       head_dim: int, isa: str,
                       kv_cache_dtype: str = "auto") -> torch.Tensor:
    """Where vLLM's cache write for ``isa`` puts each K and V value of a
    block: ``index[p]`` is the element of a ``[2, block_size, kv_heads,
    head_dim]`` block (K then V, flattened) that lands at element ``p`` of
    vLLM's block (of ``dtype``; an fp8 cache's uint8 with its
    ``kv_cache_dtype``). Raises :class:`kvc.Error` where the write is not a
    permutation of the values."""
    what = f"vLLM's CPU cache write ({isa}, {kv_cache_dtype}, {dtype})"
    elements = 2 * block_size * kv_heads * head_dim
    source = torch.arange(elements, dtype=torch.int64)
    index = torch.zeros(elements, dtype=torch.int64)
    shape = (2, block_size, kv_heads, head_dim)
    # The model's K and V are bf16 where the cache holds fp8 codes.
    values_dtype = torch.bfloat16 if kv_cache_dtype in FP8_FORMATS else dtype
    block = torch.empty(1, kv_heads, block_size, 2 * head_dim, dtype=dtype)
    slots = torch.arange(block_size, dtype=torch.int64)

    def write(values: torch.Tensor) -> torch.Tensor:
        block.fill_(0x7F if kv_cache_dtype in FP8_FORMATS else -1)
        _write(values[0], values[1], block, slots, isa, kv_cache_dtype)
        return _decoded(block.reshape(-1), kv_cache_dtype)

    # One probe per bit of the source index: 0 and 1 are exact in every
    # element type (fp8's included).
    for bit in range(max(1, (elements - 1).bit_length())):
        landed = write(((source >> bit) & 1).to(values_dtype).view(shape))
        if not bool(((landed == 0) | (landed == 1)).all()):
            raise Error(f"{what} changes the values it stores: kvc reads and "
                        "writes only caches that hold K and V as they are "
                        "(fp8's as codes of them)", "unimplemented")
        index |= landed.to(torch.int64) << bit
    if not torch.equal(index.sort().values, source):
        raise Error(f"{what} does not place every K and V value once in a "
                    "block", "unimplemented")
    # And the map reproduces the write on other values: random ones, of
    # quarters in [-2, 2] where the cache is fp8 (exact in E4M3 and E5M2,
    # so that no rounding of vLLM's moves them).
    generator = torch.Generator().manual_seed(0)
    if kv_cache_dtype in FP8_FORMATS:
        values = torch.randint(-8, 9, shape, generator=generator) / 4
    else:
        values = torch.randn(shape, generator=generator)
    values = values.to(values_dtype)
    if not torch.equal(write(values), values.reshape(-1)[index].float()):
        raise Error(f"{what} is not a permutation of K and V", "unimplemented")
    return index


class PackedCpuCache:
    """vLLM's per-layer CPU caches and the staging blocks kvc loads into
    and saves from (see the module's documentation).

    Args:
        caches: vLLM's caches, one per layer, ``[num_blocks, kv_heads,
            block_size, 2 * head_dim]``.
        isa: the instruction set vLLM's CPU attention writes them for.
        staging_blocks: staging blocks (kvc's ``blocks_first`` caches);
            None: as many as vLLM's caches hold.
        kv_cache_dtype: vLLM's ``kv_cache_dtype``: ``auto`` (the caches
            hold K and V as the model computes them) or an fp8 one of
            :data:`FP8_FORMATS` (uint8 caches of codes).
        scales: where the cache is fp8, layer -> its (k_scale, v_scale) as
            vLLM's attention layer holds them now (asked at each pack and
            unpack); None: 1.0 for both.
        staging_heads: the KV heads staging blocks hold (a tensor-parallel
            rank's caches hold heads ``first_head`` on of them); None: the
            caches' own.
        first_head: the staging head the caches' first head is.
    """

    def __init__(self, caches: list[torch.Tensor], isa: str,
                 staging_blocks: int | None = None,
                 kv_cache_dtype: str = "auto",
                 scales: Callable[[int], Scales] | None = None,
                 staging_heads: int | None = None,
                 first_head: int = 0) -> None:
        first = caches[0]
        blocks, heads, size, width = first.shape
        if width % 2:
            raise Error(f"a CPU KV cache of shape {tuple(first.shape)}: the "
                        "last dimension is not K and V", "invalid_argument")
        self.fp8 = kv_cache_dtype in FP8_FORMATS
        if self.fp8 and first.dtype != torch.uint8:
            raise Error(f"a {kv_cache_dtype} CPU KV cache of {first.dtype}: "
                        "vLLM keeps fp8 caches as uint8 codes",
                        "invalid_argument")
        if not self.fp8 and first.dtype not in _STAGING_DTYPES:
            raise Error(f"a CPU KV cache of {first.dtype} ({kv_cache_dtype}): "
                        "kvc reads bf16, f16, f32 and fp8 (E4M3, E5M2) caches",
                        "unimplemented")
        for cache in caches:
            if cache.shape != first.shape or cache.dtype != first.dtype or \
                    not cache.is_contiguous():
                raise Error("vLLM's CPU KV caches differ in shape or dtype, "
                            "or one is not contiguous", "invalid_argument")
        self.caches = caches
        self.isa = isa
        self.kv_cache_dtype = kv_cache_dtype
        self._scales = scales or (lambda layer: (1.0, 1.0))
        self.block_size = size
        self.block_elements = heads * size * width
        self.index = learn_block_layout(first.dtype, heads, size, width // 2,
                                        isa, kv_cache_dtype)
        self.inverse = torch.argsort(self.index)
        count = blocks if staging_blocks is None else int(staging_blocks)
        if count <= 0:
            raise Error("staging_blocks must be positive", "invalid_argument")
        # kvc stores bf16 or f16: an f32 cache is staged (and saved) in
        # bf16, an fp8 one's values in bf16.
        self.staging_dtype = torch.bfloat16 if self.fp8 else \
            _STAGING_DTYPES[first.dtype]
        staged = heads if staging_heads is None else int(staging_heads)
        if not 0 <= first_head <= staged - heads:
            raise Error(f"heads {first_head}.. of {staged} staged: the caches "
                        f"hold {heads}", "invalid_argument")
        self.heads = slice(first_head, first_head + heads)
        self.staging = [torch.zeros(count, 2, size, staged, width // 2,
                                    dtype=self.staging_dtype)
                        for _ in caches]
        self._free = list(range(count - 1, -1, -1))

    @property
    def lossy(self) -> bool:
        """Whether staging rounds the cache's values (an f32 cache; an fp8
        one whose scales are not 1)."""
        if self.fp8:
            return any(self._scales(layer) != (1.0, 1.0)
                       for layer in range(len(self.caches)))
        return self.staging_dtype != self.caches[0].dtype

    def take(self, count: int) -> list[int] | None:
        """``count`` staging blocks, or None if the pool holds fewer."""
        if count > len(self._free):
            return None
        taken = self._free[len(self._free) - count:]
        del self._free[len(self._free) - count:]
        return taken[::-1]

    def give(self, ids: list[int]) -> None:
        """Returns staging blocks to the pool."""
        self._free.extend(ids)

    def pack(self, layer: int, staging_ids: list[int],
             block_ids: list[int]) -> None:
        """Writes staging blocks ``staging_ids`` of ``layer`` into vLLM's
        blocks ``block_ids`` (pairwise)."""
        if block_ids:
            staged = self.staging[layer][torch.tensor(staging_ids)]
            self.pack_values(layer, staged[:, :, :, self.heads], block_ids)

    def pack_values(self, layer: int, values: torch.Tensor,
                    block_ids: list[int]) -> None:
        """Writes ``values`` (``[blocks, 2, block_size, heads, head_dim]``
        of the caches' heads) into vLLM's blocks ``block_ids`` of
        ``layer``."""
        if not block_ids:
            return
        cache = self.caches[layer]
        if self.fp8:
            # vLLM's own write, with the layer's scales: the codes its
            # forward pass would write for these K and V.
            heads, dim = values.shape[-2:]
            keys = values[:, 0].reshape(-1, heads, dim).contiguous()
            values = values[:, 1].reshape(-1, heads, dim).contiguous()
            slots = (torch.tensor(block_ids, dtype=torch.int64)[:, None] *
                     self.block_size +
                     torch.arange(self.block_size, dtype=torch.int64)).reshape(-1)
            _write(keys, values, cache, slots, self.isa, self.kv_cache_dtype,
                   self._scales(layer))
            return
        packed = values.reshape(values.shape[0], -1)[:, self.index]
        flat = cache.view(cache.shape[0], -1)
        flat[torch.tensor(block_ids)] = packed.to(cache.dtype)

    def unpack(self, layer: int, block_ids: list[int],
               staging_ids: list[int]) -> None:
        """Reads vLLM's blocks ``block_ids`` of ``layer`` into staging
        blocks ``staging_ids`` (pairwise)."""
        if block_ids:
            self.staging[layer][torch.tensor(staging_ids), :, :, self.heads] = \
                self.unpack_values(layer, block_ids)

    def unpack_values(self, layer: int, block_ids: list[int]) -> torch.Tensor:
        """vLLM's blocks ``block_ids`` of ``layer`` as ``[blocks, 2,
        block_size, heads, head_dim]`` of the caches' heads, in the staging
        dtype."""
        cache = self.caches[layer].view(self.caches[layer].shape[0], -1)
        tokens = cache[torch.tensor(block_ids)][:, self.inverse]
        if self.fp8:
            k_scale, v_scale = self._scales(layer)
            tokens = _decoded(tokens, self.kv_cache_dtype)
            half = tokens.shape[1] // 2
            tokens[:, :half] *= k_scale
            tokens[:, half:] *= v_scale
        _, heads, size, width = self.caches[layer].shape
        return tokens.to(self.staging_dtype).view(len(block_ids), 2, size,
                                                  heads, width // 2)

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
checked to be a permutation (a layout that quantizes or scales, fp8's, is
refused) and is then applied in both directions by plain gathers:

- kvc loads into *staging* blocks laid out ``[2, block_size, kv_heads,
  head_dim]`` (the Connector's ``blocks_first`` layout) and each loaded
  layer is packed into vLLM's blocks before its attention runs;
- a save unpacks the request's blocks of a layer into staging blocks when
  vLLM hands the layer over, and kvc saves from those.

Staging blocks are taken from a pool per load and save and given back when
it ends. The pool holds as many blocks as vLLM's cache unless told
otherwise; a load or save that finds too few is not started (the server
recomputes; the prompt is not saved).
"""

from __future__ import annotations

import torch

from ._errors import Error

__all__ = ["PackedCpuCache", "learn_block_layout"]

_STAGING_DTYPES = {torch.bfloat16: torch.bfloat16, torch.float16: torch.float16,
                   torch.float32: torch.bfloat16}


def _write(key: torch.Tensor, value: torch.Tensor, block: torch.Tensor,
           isa: str) -> None:
    """vLLM's cache write of one block's tokens (``key`` and ``value``
    ``[block_size, kv_heads, head_dim]``) into ``block``
    ``[1, kv_heads, block_size, 2 * head_dim]``."""
    from vllm import _custom_ops as ops

    _, heads, size, _ = block.shape
    halves = block.view(1, heads, 2 * size, -1).chunk(2, dim=2)
    try:
        ops.cpu_attn_reshape_and_cache(key, value, halves[0], halves[1],
                                       torch.arange(size, dtype=torch.int64),
                                       isa)
    except RuntimeError as error:
        raise Error(f"vLLM's CPU cache write ({isa}, {block.dtype}) refused "
                    f"a block of {heads} heads x {size} tokens: {error}",
                    "unimplemented") from None


def learn_block_layout(dtype: torch.dtype, kv_heads: int, block_size: int,
                       head_dim: int, isa: str) -> torch.Tensor:
    """Where vLLM's cache write for ``isa`` puts each K and V value of a
    block: ``index[p]`` is the element of a ``[2, block_size, kv_heads,
    head_dim]`` block (K then V, flattened) that lands at element ``p`` of
    vLLM's block. Raises :class:`kvc.Error` where the write is not a
    permutation of the values."""
    elements = 2 * block_size * kv_heads * head_dim
    source = torch.arange(elements, dtype=torch.int64)
    index = torch.zeros(elements, dtype=torch.int64)
    shape = (2, block_size, kv_heads, head_dim)
    block = torch.empty(1, kv_heads, block_size, 2 * head_dim, dtype=dtype)
    # One probe per bit of the source index: 0 and 1 are exact in every
    # element type.
    for bit in range(max(1, (elements - 1).bit_length())):
        values = ((source >> bit) & 1).to(dtype).view(shape)
        block.fill_(-1)
        _write(values[0], values[1], block, isa)
        landed = block.reshape(-1)
        if not bool(((landed == 0) | (landed == 1)).all()):
            raise Error(f"vLLM's CPU cache write ({isa}, {dtype}) changes the "
                        "values it stores: kvc reads and writes only caches "
                        "that hold K and V as they are", "unimplemented")
        index |= landed.to(torch.int64) << bit
    if not torch.equal(index.sort().values, source):
        raise Error(f"vLLM's CPU cache write ({isa}, {dtype}) does not place "
                    "every K and V value once in a block", "unimplemented")
    # And the map reproduces the write on values that are not 0 or 1.
    values = torch.randn(shape, generator=torch.Generator().manual_seed(0)
                         ).to(dtype)
    _write(values[0], values[1], block, isa)
    if not torch.equal(block.reshape(-1), values.reshape(-1)[index]):
        raise Error(f"vLLM's CPU cache write ({isa}, {dtype}) is not a "
                    "permutation of K and V", "unimplemented")
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
    """

    def __init__(self, caches: list[torch.Tensor], isa: str,
                 staging_blocks: int | None = None) -> None:
        first = caches[0]
        blocks, heads, size, width = first.shape
        if width % 2:
            raise Error(f"a CPU KV cache of shape {tuple(first.shape)}: the "
                        "last dimension is not K and V", "invalid_argument")
        if first.dtype not in _STAGING_DTYPES:
            raise Error(f"a CPU KV cache of {first.dtype}: kvc reads bf16, "
                        "f16 and f32 caches", "unimplemented")
        for cache in caches:
            if cache.shape != first.shape or cache.dtype != first.dtype or \
                    not cache.is_contiguous():
                raise Error("vLLM's CPU KV caches differ in shape or dtype, "
                            "or one is not contiguous", "invalid_argument")
        self.caches = caches
        self.isa = isa
        self.block_size = size
        self.block_elements = heads * size * width
        self.index = learn_block_layout(first.dtype, heads, size, width // 2, isa)
        self.inverse = torch.argsort(self.index)
        count = blocks if staging_blocks is None else int(staging_blocks)
        if count <= 0:
            raise Error("staging_blocks must be positive", "invalid_argument")
        # kvc stores bf16 or f16: an f32 cache is staged (and saved) in bf16.
        self.staging_dtype = _STAGING_DTYPES[first.dtype]
        self.staging = [torch.zeros(count, 2, size, heads, width // 2,
                                    dtype=self.staging_dtype)
                        for _ in caches]
        self._free = list(range(count - 1, -1, -1))

    @property
    def lossy(self) -> bool:
        """Whether staging rounds the cache's values (an f32 cache)."""
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
        if not block_ids:
            return
        source = self.staging[layer].view(self.staging[layer].shape[0], -1)
        packed = source[torch.tensor(staging_ids)][:, self.index]
        cache = self.caches[layer].view(self.caches[layer].shape[0], -1)
        cache[torch.tensor(block_ids)] = packed.to(cache.dtype)

    def unpack(self, layer: int, block_ids: list[int],
               staging_ids: list[int]) -> None:
        """Reads vLLM's blocks ``block_ids`` of ``layer`` into staging
        blocks ``staging_ids`` (pairwise)."""
        if not block_ids:
            return
        cache = self.caches[layer].view(self.caches[layer].shape[0], -1)
        tokens = cache[torch.tensor(block_ids)][:, self.inverse]
        target = self.staging[layer].view(self.staging[layer].shape[0], -1)
        target[torch.tensor(staging_ids)] = tokens.to(self.staging_dtype)

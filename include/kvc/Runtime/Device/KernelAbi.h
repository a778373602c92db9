//===- KernelAbi.h - Generated kernels' view of the cache -------*- C++ -*-===//
//
// A generated kernel that writes or reads the paged cache (KernelGen.h:
// restore, rope_scatter, save) addresses it as [layers][layer_rows][kv width]
// bf16 from one base per matrix, a token's row being table[t / B] * B + t % B
// of its layer. The runtime's caches are per-layer pointers with blocks
// blockStride() elements apart. One maps onto the other when
//
//   - every layer's K (and V) cache starts the same whole number of rows
//     after the layer before's: layer 0's caches are the bases, and that
//     distance is layer_rows;
//   - blocks are a whole number s of blocks apart (s = 2 in vLLM's layout
//     that interleaves K and V per block): physical block p is passed to
//     the kernel as p * s.
//
// kvc's own caches (either backend's) and both of vLLM's layouts qualify;
// a view over layers allocated one by one may not, and its chunks take the
// runtime's own decode and scatter instead.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_DEVICE_KERNELABI_H
#define KVC_RUNTIME_DEVICE_KERNELABI_H

#include "kvc/Runtime/Device/PagedKVCache.h"
#include "kvc/Runtime/Device/Kernel.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvc {

/// One record of a launch's chunk table, a kernel's "chunks" argument
/// (KernelGen.h): the chunk's payload at `payloadOffset` bytes from the
/// payload argument's base (a multiple of 16), its first token in the
/// request and first layer in the cache. A launch runs the kernel's grid
/// once per record (blockIdx.y), so chunks of one shape and encoding that
/// are ready together take one launch.
struct KernelChunk {
  int64_t payloadOffset = 0, firstToken = 0, firstLayer = 0;
};
static_assert(sizeof(KernelChunk) == 3 * sizeof(int64_t),
              "the kernels read records of three int64 values");

/// Where one chunk of a launch lies: its payload's address (on the device
/// the kernel runs on), its first token and first layer.
struct ChunkAt {
  const void *payload = nullptr;
  int64_t firstToken = 0, firstLayer = 0;
};

/// A launch's payload argument and chunk table.
struct ChunkTable {
  /// The payload argument: the lowest of the chunks' payloads.
  const char *base = nullptr;
  /// Bytes from `base` to the end of the highest payload.
  int64_t bytes = 0;
  std::vector<KernelChunk> records;
};

/// The chunk table of a launch of `kernel` over `chunks` (each payload
/// kernel.payloadBytes long), in their order; InvalidArgument when there is
/// none or a payload is not 16-byte aligned.
StatusOr<ChunkTable> chunkTable(const BundleKernel &kernel,
                                const std::vector<ChunkAt> &chunks);

/// The cache arguments of a restore kernel.
struct KernelCacheArgs {
  /// Layer 0's key and value caches: the kernel's key_cache and value_cache.
  const uint16_t *keys = nullptr, *values = nullptr;
  /// Rows from one layer's start to the next's: the kernel's layer_rows.
  int64_t layerRows = 0;
  /// Blocks from one physical block's start to the next's.
  int64_t blockScale = 1;
  /// Bytes each base spans, every layer's blocks included.
  int64_t bytes = 0;

  /// `table`'s physical blocks as the kernel reads them; FailedPrecondition
  /// when one does not fit the kernel's int32 table.
  StatusOr<std::vector<int32_t>> blocks(const BlockTable &table) const;
};

/// A launch's parameters in a kernel's order (BundleKernel::args): each
/// buffer as the five values of a 1-D MLIR memref descriptor (base, aligned
/// base, offset, size, stride), each integer as one 64-bit value.
class KernelParams {
public:
  /// Buffer argument `name` ("payload", "key_cache", ...): `elements`
  /// elements of its memref type at device address `address`.
  void buffer(const std::string &name, const void *address, int64_t elements);
  /// Integer argument `name` ("layer_rows", ...).
  void scalar(const std::string &name, int64_t value);
  /// Pointers to the parameters in `kernel`'s order, as cuLaunchKernel takes
  /// them, valid while this object lives; InvalidArgument naming an
  /// argument never set.
  StatusOr<std::vector<void *>> pointers(const BundleKernel &kernel);

private:
  struct Memref {
    const void *allocated = nullptr, *aligned = nullptr;
    int64_t offset = 0, size = 0, stride = 1;
  };
  std::map<std::string, Memref> buffers_;
  std::map<std::string, int64_t> scalars_;
};

/// The cache arguments of restore kernels into `cache`, or why its layout
/// has none (FailedPrecondition).
StatusOr<KernelCacheArgs> kernelCacheArgs(const PagedKVCache &cache);

/// The cache arguments of `kernel` over `cache` when it addresses the
/// cache (a restore, rope_scatter or save kernel) for the cache's KV heads,
/// head_dim and block size, in a layout kernelCacheArgs maps; else why not
/// (FailedPrecondition).
StatusOr<KernelCacheArgs> kernelArgsFor(const BundleKernel &kernel,
                                        const PagedKVCache &cache);

} // namespace kvc

#endif // KVC_RUNTIME_DEVICE_KERNELABI_H

//===- Vocabulary.h - The words every layer of kvc shares -------*- C++ -*-===//
//
// The enumerations the dialect, the planner, the plan bundle and the
// runtime all speak of: what a chunk holds, the resources tasks run on, the
// dataflow steps a task runs, and the codec stages a target rates. Each has
// one name table here: its names are the dialect's keywords and op names,
// the bundle's JSON strings and the targets' JSON keys, and every layer
// converts through them (the dialect's ODS enums are checked against these
// tables in KVCVocabularyTest).
//
// Part of kvc's support library: no LLVM, no MLIR, no dependency at all, so
// the dialect, the planner and the runtime link it alone.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_SUPPORT_VOCABULARY_H
#define KVC_SUPPORT_VOCABULARY_H

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvc {

/// What a chunk holds: K and V, or the hidden states entering its layers.
/// The values are stored in chunk headers: never renumber them.
enum class Form : uint8_t { KV = 0, Hidden = 1 };
inline constexpr int kNumForms = 2;

/// A resource that runs tasks, each with its lanes: storage reads (one pool
/// per tier), host decoding, host->device and device->host copies, the
/// compute device, the network.
enum class Resource : uint8_t { IO, Decode, H2D, D2H, Compute, Net };
inline constexpr int kNumResources = 6;

/// A dataflow step: the dialect's dataflow op, named as it is without the
/// dialect prefix.
enum class StepKind : uint8_t {
  Fetch,
  Decompress,
  Dequant,
  Untransform,
  TransferToDevice,
  TransferToHost,
  Transform,
  Quant,
  Compress,
  Project,
  ChunkCompute,
  Scatter,
  Gather,
  Store,
  Send,
  Recv,
};
inline constexpr int kNumStepKinds = 16;

/// A codec stage a target gives a per-core rate for.
enum class CodecStage : uint8_t { Deflate, Zstd, Lz4, Quant, Hadamard };
inline constexpr int kNumCodecStages = 5;

/// The names: "kv", "hidden"; "io", "decode", "h2d", "d2h", "compute",
/// "net"; "fetch", ..., "transfer_to_device", ..., "chunk_compute", ...;
/// "deflate", "zstd", "lz4", "quant", "hadamard".
const char *name(Form form);
const char *name(Resource resource);
const char *name(StepKind kind);
const char *name(CodecStage stage);

/// The enumerator a name names, or nothing.
std::optional<Form> parseForm(std::string_view name);
std::optional<StepKind> parseStepKind(std::string_view name);

/// The pool a task on `resource` runs in: IO has one pool per storage tier
/// ("io:ssd"), every other resource one pool ("decode").
std::string poolName(Resource resource, std::string_view tier = {});

} // namespace kvc

#endif // KVC_SUPPORT_VOCABULARY_H

//===- Vocabulary.cpp - The name tables of kvc's shared enumerations ------===//

#include "kvc/Support/Vocabulary.h"

#include "kvc/Support/EnumNames.h"

namespace kvc {

namespace {

constexpr const char *kFormNames[kNumForms] = {"kv", "hidden"};
constexpr const char *kResourceNames[kNumResources] = {"io",  "decode",  "h2d",
                                                       "d2h", "compute", "net"};
constexpr const char *kStepNames[kNumStepKinds] = {"fetch",
                                                   "decompress",
                                                   "dequant",
                                                   "untransform",
                                                   "transfer_to_device",
                                                   "transfer_to_host",
                                                   "transform",
                                                   "quant",
                                                   "compress",
                                                   "project",
                                                   "chunk_compute",
                                                   "scatter",
                                                   "gather",
                                                   "store",
                                                   "send",
                                                   "recv"};
constexpr const char *kCodecStageNames[kNumCodecStages] = {
    "deflate", "zstd", "lz4", "quant", "hadamard"};

} // namespace

const char *name(Form form) { return kFormNames[int(form)]; }
const char *name(Resource resource) { return kResourceNames[int(resource)]; }
const char *name(StepKind kind) { return kStepNames[int(kind)]; }
const char *name(CodecStage stage) { return kCodecStageNames[int(stage)]; }

std::optional<Form> parseForm(std::string_view text) {
  return enumFromName<Form>(name, kNumForms, text);
}
std::optional<StepKind> parseStepKind(std::string_view text) {
  return enumFromName<StepKind>(name, kNumStepKinds, text);
}

std::string poolName(Resource resource, std::string_view tier) {
  std::string pool = name(resource);
  if (resource == Resource::IO)
    pool.append(":").append(tier);
  return pool;
}

} // namespace kvc

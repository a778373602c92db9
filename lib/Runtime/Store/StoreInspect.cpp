//===- StoreInspect.cpp - What a store holds, checked ---------------------===//

#include "kvc/Runtime/Store/StoreInspect.h"

#include "kvc/Runtime/Store/ChunkFormat.h"
#include "kvc/Support/Vocabulary.h"

namespace kvc {

namespace {

/// Objects read per batch (pipelined on a remote tier).
constexpr size_t kBatch = 64;

/// Layout records live under this prefix (ChunkStore.cpp).
constexpr const char *kLayoutPrefix = "layouts/";

} // namespace

StatusOr<StoreReport> inspectStore(Tier &tier, bool removeFailed) {
  KVC_ASSIGN_OR_RETURN(names, tier.list(""));
  StoreReport report;
  std::vector<std::string> batch, buffers;
  auto check = [&]() -> Status {
    std::vector<Status> read = tier.getMany(batch, buffers);
    for (size_t i = 0; i < batch.size(); ++i) {
      const std::string &name = batch[i];
      Status status = read[i];
      if (chunkFault(status) == ChunkFault::Unavailable)
        return status;
      if (chunkFault(status) == ChunkFault::Missing)
        continue; // Removed since the listing.
      if (status.isOk() && name.rfind(kLayoutPrefix, 0) == 0) {
        ++report.layouts.objects;
        report.layouts.bytes += int64_t(buffers[i].size());
        continue;
      }
      std::optional<ChunkHeader> header;
      if (status.isOk()) {
        StatusOr<std::pair<ChunkHeader, std::string_view>> unpacked =
            unpackChunk(buffers[i]);
        if (!unpacked.isOk()) {
          status = unpacked.status();
        } else {
          header = unpacked->first;
          const std::string filed =
              chunkObjectName(header->key, header->form, header->layerBegin,
                              header->layerEnd, header->codec);
          if (filed != name)
            status = chunkError(ChunkFault::WrongKey,
                                "its header says it is " + filed);
        }
      }
      if (!status.isOk()) {
        report.failed.push_back({name, status.message()});
        if (removeFailed && tier.remove(name).isOk())
          ++report.removed;
        continue;
      }
      const std::string model = toHex(header->fingerprint);
      const int64_t bytes = int64_t(buffers[i].size());
      ++report.models[model].objects;
      report.models[model].bytes += bytes;
      StoreReport::Sizes &encoding =
          report.encodings[model][std::string(kvc::name(header->form)) + " " +
                                  header->codec.str()];
      ++encoding.objects;
      encoding.bytes += bytes;
    }
    batch.clear();
    return Status::ok();
  };
  for (const std::string &name : names) {
    batch.push_back(name);
    if (batch.size() == kBatch)
      KVC_RETURN_IF_ERROR(check());
  }
  if (!batch.empty())
    KVC_RETURN_IF_ERROR(check());
  return report;
}

} // namespace kvc

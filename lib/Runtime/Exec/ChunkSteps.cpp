//===- ChunkSteps.cpp - One chunk's journey into the cache ----------------===//

#include "ChunkSteps.h"

#include "kvc/Runtime/Base/Half.h"
#include "kvc/Runtime/Base/HostWorkers.h"

#include <algorithm>
#include <cstring>

namespace kvc::exec_detail {

namespace {

/// `missing` (no object for `ref`) with what the store holds of that chunk
/// instead: a plan compiled for one encoding of a store that saved another
/// says which, rather than only that its object is missing.
Status withStoredEncodings(ChunkStore &store, const ChunkRef &ref,
                           const Status &missing) {
  StatusOr<std::vector<CodecSpec>> held = store.encodings(ref);
  if (!held)
    return missing;
  std::string text = missing.message() + " (the plan loads it as " +
                     ref.codec.str() + "; the store holds ";
  if (held->empty())
    text += "no encoding of it)";
  for (std::size_t i = 0; i < held->size(); ++i)
    text += (i ? ", " : "it as ") + (*held)[i].str() +
            (i + 1 == held->size() ? ")" : "");
  return chunkError(ChunkFault::Missing, text);
}

/// Fetch buffers (a slot's stored objects as read) of slots gone, for the
/// next restores' slots, as KeptHostMemory keeps decode buffers.
class KeptObjects {
public:
  using Objects = std::vector<std::pair<ChunkRef, std::string>>;
  static constexpr std::size_t kKeptBytes = std::size_t(512) << 20;

  Objects take() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (kept_.empty())
      return {};
    Objects objects = std::move(kept_.back());
    kept_.pop_back();
    bytes_ -= bytesOf(objects);
    return objects;
  }
  void give(Objects &objects) {
    for (auto &[ref, buffer] : objects)
      buffer.clear(); // Empty, its room kept.
    const std::size_t bytes = bytesOf(objects);
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes == 0 || bytes_ + bytes > kKeptBytes)
      return;
    bytes_ += bytes;
    kept_.push_back(std::move(objects));
  }
  std::size_t bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return bytes_;
  }

private:
  static std::size_t bytesOf(const Objects &objects) {
    std::size_t bytes = 0;
    for (const auto &[ref, buffer] : objects)
      bytes += buffer.capacity();
    return bytes;
  }

  std::mutex mutex_;
  std::vector<Objects> kept_;
  std::size_t bytes_ = 0;
};

KeptObjects &keptObjects() {
  // Never destroyed: slots of static objects may go at exit.
  static KeptObjects &kept = *new KeptObjects();
  return kept;
}

bool overlaps(const ChunkRef &ref, const ChunkValue &value) {
  return ref.tokenBegin < value.tokens.end &&
         value.tokens.begin < ref.tokenEnd &&
         ref.layerBegin < value.layers.end && value.layers.begin < ref.layerEnd;
}

} // namespace

StagingSlot::StagingSlot(HostMemory *memory)
    : objects(keptObjects().take()), data(memory) {}

StagingSlot::~StagingSlot() { keptObjects().give(objects); }

std::size_t keptFetchBytes() { return keptObjects().bytes(); }

Status checkTarget(const RestoreTarget &target) {
  if (!target.model || !target.tokens || !target.cache || !target.table)
    return invalidArgument("restore: model, tokens, cache and block table are "
                           "required");
  if (target.runner && (&target.runner->device() != &deviceOr(target.device) ||
                        &target.runner->model() != target.model))
    return invalidArgument("restore: the runner given runs another model or "
                           "on another device than the target's");
  return Status::ok();
}

ChunkSteps::ChunkSteps(Device &device, const ModelCompute &model,
                       ModelRunner *runner,
                       const std::map<std::string, ChunkStore *> &stores,
                       const std::vector<int32_t> &tokens, PagedKVCache &cache,
                       const BlockTable &table, LayerProgress *progress,
                       int64_t resident)
    : device_(device), model_(model),
      ownRunner_(runner ? nullptr : device.createRunner(model)),
      runner_(runner ? runner : ownRunner_.get()), stores_(stores),
      tokens_(tokens), cache_(cache), table_(table), progress_(progress),
      settled_(device, cache), resident_(resident),
      prefill_(runner_->prefill(tokens, cache, table)) {}

const std::vector<ChunkRef> &
ChunkSteps::refs(const std::string &tier, Form form, const CodecSpec &codec) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto key = std::make_tuple(tier, form, codec.str());
  auto it = refs_.find(key);
  if (it == refs_.end())
    it = refs_
             .emplace(key, stores_.at(tier)->refs(tokens_.data(),
                                                  int64_t(tokens_.size()), form,
                                                  codec))
             .first;
  return it->second;
}

DType ChunkSteps::dtypeOf(Form form) const {
  return form == Form::KV ? DType::BF16 : model_.config().dtype;
}

int64_t ChunkSteps::width(Form form) const {
  return form == Form::KV ? model_.kvDim() : model_.config().hiddenSize;
}

Status ChunkSteps::fetch(ChunkValue &value, StagingSlot *slot) {
  if (!slot)
    slot = takeSpare();
  if (slot->busy.exchange(true))
    return internalError(
        "restore: a staging slot was refilled before its chunk "
        "was copied out");
  value.slot = slot;
  value.objects.swap(slot->objects);
  value.data.swap(slot->data);
  ChunkStore &store = *stores_.at(value.tier);
  std::vector<const ChunkRef *> covering;
  for (const ChunkRef &ref : refs(value.tier, value.form, value.codec))
    if (overlaps(ref, value))
      covering.push_back(&ref);
  if (covering.empty())
    return notFound("no stored object covers the chunk");
  value.landed.assign(covering.size(), false);
  value.intoCache = false;
  value.damaged.clear();
  HostTraffic traffic;
  KVC_ASSIGN_OR_RETURN(inPlace,
                       fetchIntoCache(value, store, covering, traffic));
  if (!inPlace) {
    KVC_ASSIGN_OR_RETURN(staged, fetchInPlace(value, store, covering, traffic));
    inPlace = staged;
  }
  if (!inPlace) {
    value.objectCount = 0;
    for (const ChunkRef *ref : covering) {
      if (value.objectCount == value.objects.size())
        value.objects.emplace_back();
      auto &[stored, buffer] = value.objects[value.objectCount++];
      stored = *ref;
      Status got = store.tier().get(ref->name(), buffer);
      if (got.code() == StatusCode::NotFound)
        return withStoredEncodings(store, *ref, got);
      KVC_RETURN_IF_ERROR(got);
      traffic.read += int64_t(buffer.size());
    }
  }
  value.encoded = true;
  value.readInPlace = inPlace;
  account(value, traffic);
  std::lock_guard<std::mutex> lock(mutex_);
  bytesRead_[value.tier] += traffic.read;
  return Status::ok();
}

bool ChunkSteps::tiles(const ChunkValue &value,
                       const std::vector<const ChunkRef *> &refs) const {
  // In token then layer order: the chunk's tokens, its layers back to back.
  int64_t layer = value.layers.begin;
  for (const ChunkRef *ref : refs) {
    if (ref->tokenBegin != value.tokens.begin ||
        ref->tokenEnd != value.tokens.end || ref->layerBegin != layer)
      return false;
    layer = ref->layerEnd;
  }
  return layer == value.layers.end;
}

bool ChunkSteps::readsInPlace(const ChunkValue &value, ChunkStore &store,
                              const std::vector<const ChunkRef *> &covering) {
  // A raw chunk's payload is its elements as the chunk lays them out: read
  // in place, it is also what its generated kernel reads.
  return value.codec.isRaw() && store.model().dtype == dtypeOf(value.form) &&
         store.tier().readsInPlace() && tiles(value, covering);
}

bool ChunkSteps::writesCacheRows(const ChunkValue &value) const {
  return value.form == Form::KV && !value.kernel &&
         cache_.memory() == CacheMemory::Host &&
         cache_.config().dtype == dtypeOf(Form::KV) &&
         value.tokens.begin >= resident_;
}

StatusOr<std::size_t> ChunkSteps::readInto(ChunkValue &value, ChunkStore &store,
                                           const ChunkRef &ref,
                                           const std::vector<ByteSpan> &payload,
                                           HostTraffic &traffic) {
  if (value.objectCount == value.objects.size())
    value.objects.emplace_back();
  const std::size_t o = value.objectCount++;
  auto &[stored, header] = value.objects[o];
  stored = ref;
  header.resize(kChunkHeaderBytes);
  std::vector<ByteSpan> parts{{header.data(), header.size()}};
  parts.insert(parts.end(), payload.begin(), payload.end());
  StatusOr<size_t> got = store.tier().getInto(ref.name(), parts);
  if (got.status().code() == StatusCode::NotFound)
    return withStoredEncodings(store, ref, got.status());
  KVC_RETURN_IF_ERROR(got.status());
  std::size_t size = header.size();
  for (const ByteSpan &part : payload)
    size += part.size;
  if (*got == size) {
    value.landed[o] = true;
    traffic.read += int64_t(*got);
    return o;
  }
  // Not as long as a raw object of the chunk: read whole, for decode to
  // say why (truncated, trailing bytes, another encoding).
  Status whole = store.tier().get(ref.name(), header);
  if (whole.code() == StatusCode::NotFound)
    return withStoredEncodings(store, ref, whole);
  KVC_RETURN_IF_ERROR(whole);
  traffic.read += int64_t(header.size());
  return o;
}

StatusOr<bool>
ChunkSteps::fetchIntoCache(ChunkValue &value, ChunkStore &store,
                           const std::vector<const ChunkRef *> &covering,
                           HostTraffic &traffic) {
  if (!writesCacheRows(value) || !readsInPlace(value, store, covering))
    return false;
  value.objectCount = 0;
  for (const ChunkRef *ref : covering) {
    KVC_ASSIGN_OR_RETURN(rows, cacheRows(*ref));
    KVC_ASSIGN_OR_RETURN(o, readInto(value, store, *ref, rows, traffic));
    if (!value.landed[o])
      continue; // Read whole: checkInCache says why.
    // Checked by the thread that read it, while the object is in its
    // core's cache: a second pass over the cache's rows later would read
    // them from memory again, and the fetch lanes (as many as the host has
    // cores) check side by side.
    std::vector<std::string_view> payload;
    for (const ByteSpan &row : rows)
      payload.emplace_back(row.data, row.size);
    KVC_RETURN_IF_ERROR(
        noteDamage(value, *ref,
                   store.checkInPlace(*ref, value.objects[o].second, payload)));
  }
  value.intoCache = true;
  return true;
}

StatusOr<std::vector<ByteSpan>> ChunkSteps::cacheRows(const ChunkRef &ref) {
  std::vector<ByteSpan> rows;
  for (int64_t layer = ref.layerBegin; layer < ref.layerEnd; ++layer)
    for (bool values : {false, true}) {
      KVC_ASSIGN_OR_RETURN(
          spans, cache_.hostRows(table_, layer, values, ref.tokenBegin,
                                 ref.tokenEnd - ref.tokenBegin));
      rows.insert(rows.end(), spans.begin(), spans.end());
    }
  return rows;
}

StatusOr<bool>
ChunkSteps::fetchInPlace(ChunkValue &value, ChunkStore &store,
                         const std::vector<const ChunkRef *> &covering,
                         HostTraffic &traffic) {
  if (!readsInPlace(value, store, covering))
    return false;
  // A layer's matrices, [tokens][width] each, as decodeElements lays them.
  const int64_t matrices = value.form == Form::KV ? 2 : 1;
  const int64_t layerBytes = matrices * value.tokens.size() *
                             width(value.form) * wordsPer(dtypeOf(value.form)) *
                             int64_t(sizeof(uint16_t));
  value.data.resizeForOverwrite(std::size_t(value.layers.size() * layerBytes) /
                                sizeof(uint16_t));
  char *data = reinterpret_cast<char *>(value.data.data());
  value.objectCount = 0;
  for (const ChunkRef *ref : covering)
    KVC_RETURN_IF_ERROR(
        readInto(
            value, store, *ref,
            {{data + (ref->layerBegin - value.layers.begin) * layerBytes,
              std::size_t((ref->layerEnd - ref->layerBegin) * layerBytes)}},
            traffic)
            .status());
  return true;
}

Status ChunkSteps::toDevice(ChunkValue &value) {
  if (value.device)
    return Status::ok();
  // Raw chunks reach the upload undecoded (the compiler emits no
  // decompress for raw data).
  if (value.encoded)
    KVC_RETURN_IF_ERROR(decode(value));
  if (value.intoCache) { // In the cache already: nothing to upload.
    releaseSlot(value);
    return Status::ok();
  }
  if (value.tokens.begin < resident_ && resident_ < value.tokens.end) {
    if (value.form != Form::KV || value.payload)
      return internalError(
          "restore: a chunk across the resident tokens that is not "
          "decoded K and V");
    // Keep the rows above the server's tokens: the buffer is
    // [layer][K, V][token][kvDim], each row moved down in place.
    const int64_t all = value.tokens.size(),
                  skip = resident_ - value.tokens.begin, keep = all - skip,
                  kvDim = cache_.kvDim(), halves = 2 * value.layers.size();
    if (int64_t(value.data.size()) != halves * all * kvDim)
      return internalError(
          "restore: a chunk across the resident tokens holds " +
          std::to_string(value.data.size()) + " elements");
    uint16_t *data = value.data.data();
    for (int64_t h = 0; h < halves; ++h)
      std::memmove(data + h * keep * kvDim, data + (h * all + skip) * kvDim,
                   std::size_t(keep * kvDim) * sizeof(uint16_t));
    HostTraffic moved;
    moved.copied = halves * keep * kvDim * int64_t(sizeof(uint16_t));
    account(value, moved);
    value.data.resize(std::size_t(halves * keep * kvDim));
    value.tokens.begin = resident_;
  }
  if (!value.slot) {
    value.ownDevice = device_.allocate();
    KVC_RETURN_IF_ERROR(
        device_.upload(value.data, /*consume=*/true, *value.ownDevice));
    value.device = value.ownDevice.get();
    return Status::ok();
  }
  StagingSlot &slot = *value.slot;
  if (slot.deviceBusy.exchange(true))
    return internalError("restore: the device buffer of a staging slot was "
                         "refilled before its chunk was scattered");
  if (!slot.device)
    slot.device = device_.allocate();
  value.deviceSlot = &slot;
  // A device that is host memory takes the buffer and gives its former one
  // back, which the slot keeps for its next chunk.
  KVC_RETURN_IF_ERROR(
      device_.upload(value.data, /*consume=*/true, *slot.device));
  value.device = slot.device.get();
  releaseSlot(value); // The upload frees the host side, as an H2D copy does.
  return Status::ok();
}

Status ChunkSteps::project(ChunkValue &value) {
  if (value.form != Form::Hidden)
    return internalError(
        "restore: project of a chunk that holds no hidden states");
  KVC_RETURN_IF_ERROR(toDevice(value));
  if (value.epilogue) {
    // The generated kernels write K and V into the cache: the scatter that
    // follows has nothing left to copy.
    KVC_ASSIGN_OR_RETURN(
        flops, runner_->launchProject(*value.prologue, *value.epilogue,
                                      *value.device, dtypeOf(Form::Hidden),
                                      value.box(), cache_, table_));
    release(value);
    value.form = Form::KV;
    value.inCache = true;
    accountScatter(value);
    std::lock_guard<std::mutex> lock(mutex_);
    flops_ += flops;
    ++kernelLaunches_;
    ++kernelChunks_;
    return Status::ok();
  }
  std::unique_ptr<DeviceBuffer> own;
  DeviceBuffer *out;
  if (value.deviceSlot) {
    std::unique_ptr<DeviceBuffer> &projected = value.deviceSlot->projected;
    if (!projected)
      projected = device_.allocate();
    out = projected.get();
  } else {
    own = device_.allocate();
    out = own.get();
  }
  KVC_ASSIGN_OR_RETURN(flops,
                       runner_->project(*value.device, dtypeOf(Form::Hidden),
                                        value.box(), *out));
  if (own)
    value.ownDevice = std::move(own);
  value.device = out;
  value.form = Form::KV;
  std::lock_guard<std::mutex> lock(mutex_);
  flops_ += flops;
  return Status::ok();
}

Status ChunkSteps::compute(ChunkValue &value) {
  KVC_RETURN_IF_ERROR(prefill_->compute(
      {value.tokens.begin, value.tokens.end, 0, value.layers.end}));
  value.form = Form::KV;
  value.inCache = true;
  return Status::ok();
}

Status ChunkSteps::scatter(ChunkValue &value) { return scatter({&value}); }

Status ChunkSteps::scatter(const std::vector<ChunkValue *> &values) {
  std::vector<ChunkValue *> launched;
  std::vector<RestoreChunk> chunks;
  for (ChunkValue *value : values) {
    if (value->inCache)
      continue;
    if (value->form != Form::KV)
      return internalError(
          "restore: scatter of hidden states (missing project)");
    KVC_RETURN_IF_ERROR(toDevice(*value));
    if (value->payload) {
      if (value->kernel != values.front()->kernel)
        return internalError(
            "restore: one launch of chunks of different kernels");
      launched.push_back(value);
      chunks.push_back({value->device, value->box()});
      continue;
    }
    KVC_RETURN_IF_ERROR(
        device_.scatter(*value->device, value->box(), cache_, table_));
    release(*value);
    accountScatter(*value);
  }
  if (!launched.empty()) {
    KVC_RETURN_IF_ERROR(device_.launchRestore(*launched.front()->kernel, chunks,
                                              cache_, table_));
    for (ChunkValue *value : launched) {
      release(*value);
      accountScatter(*value);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ++kernelLaunches_;
    kernelChunks_ += int64_t(launched.size());
  }
  for (ChunkValue *value : values)
    KVC_RETURN_IF_ERROR(written({value->tokens.begin, value->tokens.end,
                                 value->layers.begin, value->layers.end}));
  return Status::ok();
}

Status ChunkSteps::computeBox(const ChunkBox &box) {
  KVC_RETURN_IF_ERROR(prefill_->compute(box));
  return written(box);
}

Status ChunkSteps::written(const ChunkBox &box) {
  if (!progress_)
    return Status::ok();
  return progress_->add(box.layerBegin, box.layerEnd, box.tokens(),
                        [this] { return device_.settle(cache_); });
}

void ChunkSteps::releaseSlot(ChunkValue &value) {
  if (!value.slot)
    return;
  StagingSlot &slot = *value.slot;
  value.objects.swap(slot.objects);
  value.data.swap(slot.data);
  value.objects.clear();
  value.objectCount = 0;
  value.data.clear();
  value.slot = nullptr;
  slot.busy.store(false);
  freeSpare(slot);
}

void ChunkSteps::releaseDevice(ChunkValue &value) {
  value.device = nullptr;
  value.ownDevice.reset();
  if (!value.deviceSlot)
    return;
  StagingSlot &slot = *value.deviceSlot;
  value.deviceSlot = nullptr;
  slot.deviceBusy.store(false);
  freeSpare(slot);
}

StagingSlot *ChunkSteps::takeSpare() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (freeSpares_.empty()) {
    StagingSlot &made = spares_.emplace_back(device_.hostMemory());
    made.spare = true;
    return &made;
  }
  StagingSlot *slot = freeSpares_.back();
  freeSpares_.pop_back();
  slot->free = false;
  return slot;
}

void ChunkSteps::freeSpare(StagingSlot &slot) {
  if (!slot.spare) // Set once, before the slot is handed out.
    return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!slot.free && !slot.busy.load() && !slot.deviceBusy.load()) {
    slot.free = true;
    freeSpares_.push_back(&slot);
  }
}

void ChunkSteps::release(ChunkValue &value) {
  releaseSlot(value);
  releaseDevice(value);
  value.data.release();
}

void ChunkSteps::kernelNotLaunched(const std::string &why) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::find(kernelsNotLaunched_.begin(), kernelsNotLaunched_.end(), why) ==
      kernelsNotLaunched_.end())
    kernelsNotLaunched_.push_back(why);
}

int64_t ChunkSteps::kernelLaunches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kernelLaunches_;
}

int64_t ChunkSteps::kernelChunks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kernelChunks_;
}

std::vector<std::string> ChunkSteps::kernelsNotLaunched() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kernelsNotLaunched_;
}

double ChunkSteps::flops() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return flops_ + prefill_->flops();
}

std::map<std::string, int64_t> ChunkSteps::bytesRead() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytesRead_;
}

HostTraffic ChunkSteps::traffic() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return traffic_;
}

std::map<StepKind, HostTraffic> ChunkSteps::trafficByStep() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return trafficByStep_;
}

void ChunkSteps::account(ChunkValue &value, const HostTraffic &traffic) {
  std::lock_guard<std::mutex> lock(mutex_);
  traffic_ += traffic;
  trafficByStep_[value.step] += traffic;
  value.traffic += traffic;
}

void ChunkSteps::accountScatter(ChunkValue &value) {
  HostTraffic traffic;
  traffic.delivered = traffic.scattered = cacheBytes(value.box());
  account(value, traffic);
}

int64_t ChunkSteps::cacheBytes(const ChunkBox &box) const {
  const int64_t tokens =
      box.tokenEnd -
      std::max(box.tokenBegin, std::min(resident_, box.tokenEnd));
  return tokens * (box.layerEnd - box.layerBegin) * 2 * cache_.kvDim() *
         int64_t(sizeof(uint16_t));
}

} // namespace kvc::exec_detail

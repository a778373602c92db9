//===- ConnectorJobs.cpp - A Connector's loads and saves ------------------===//
//
// Loads of decided requests into the server's blocks (each on a restore
// thread of its own, waited for layer by layer), saves handed over layer by
// layer, cancellation, and what ended.
//
//===----------------------------------------------------------------------===//

#include "ConnectorState.h"

#include "kvc/Runtime/Base/Threads.h"
#include "kvc/Runtime/Save/Saver.h"

namespace kvc::host {

Status Connector::startLoad(const std::string &id,
                            const std::vector<int32_t> &blockIds,
                            const LoadOptions &run) {
  State &s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  Request *request = s.find(id);
  if (!request || !request->decision)
    return notFound("connector: no decided request " + id);
  if (!request->decision->loads())
    return failedPrecondition("connector: request " + id + " loads nothing (" +
                              request->decision->why + ")");
  if (request->load)
    return failedPrecondition("connector: request " + id +
                              " was started already");
  const int64_t tokens = request->decision->loadTokens;
  KVC_ASSIGN_OR_RETURN(table, s.tableFor(blockIds, tokens));
  auto job = std::make_shared<LoadJob>();
  job->tokens.assign(request->tokens.begin(), request->tokens.begin() + tokens);
  job->chunkTokens = request->decision->layout.chunkTokens;
  job->table = std::move(table);
  job->resident = request->onDevice;
  job->plan = request->plan;
  job->target.device = s.device;
  job->target.model = s.options.model;
  job->target.runner = s.options.runner;
  job->target.stores = request->stores;
  job->target.tokens = &job->tokens;
  job->target.cache = s.caches.get();
  job->target.table = &job->table;
  KVC_ASSIGN_OR_RETURN(pools, s.poolsFor(*job->plan->plan));
  RestoreOptions options;
  options.kernels = &job->plan->bundle->kernels;
  options.resident = job->resident;
  options.cancel = &job->cancel;
  options.recomputeFallbacks = s.options.recomputeFailures;
  options.removeDamaged = true; // The next save of its chunk writes it.
  options.tracePath = run.tracePath;
  KVC_ASSIGN_OR_RETURN(
      handle, run.dynamic ? RestoreHandle::startWalk(*pools, *job->plan->plan,
                                                     job->target, options)
                          : RestoreHandle::start(*pools, *job->plan->plan,
                                                 job->target, options));
  job->handle = std::move(handle);
  request->load = std::move(job);
  return Status::ok();
}

namespace {

/// A request's load, or why there is none.
StatusOr<std::shared_ptr<LoadJob>> loadOf(std::mutex &mutex,
                                          std::map<std::string, Request> &all,
                                          const std::string &id) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = all.find(id);
  if (it == all.end())
    return notFound("connector: no request " + id);
  if (!it->second.load)
    return failedPrecondition("connector: request " + id + " has no load");
  return it->second.load;
}

/// The load's result, waiting for it once. The index forgets the chunks
/// the load found gone from their store (missing, or damaged and removed):
/// the next lookup asks the stores what they hold, rather than every later
/// load failing on them.
const StatusOr<RestoreMetrics> &resultOf(LoadJob &job, PrefixIndex &index,
                                         uint64_t seed, std::mutex &mutex) {
  std::lock_guard<std::mutex> collecting(job.waiting);
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (job.result)
      return *job.result;
  }
  StatusOr<RestoreMetrics> result = job.handle->wait();
  std::lock_guard<std::mutex> lock(mutex);
  if (job.result)
    return *job.result;
  if (result.isOk()) {
    // The keys are computed only for a load that lost chunks: the rare case.
    std::vector<uint64_t> keys;
    const RestoreMetrics &metrics = *result;
    for (std::size_t f = 0;
         f < metrics.fallbackTokens.size() && f < metrics.fallbackFaults.size();
         ++f) {
      const ChunkFault fault = metrics.fallbackFaults[f];
      if (fault != ChunkFault::Missing && fault != ChunkFault::Corrupt &&
          fault != ChunkFault::Truncated)
        continue;
      if (keys.empty())
        keys = PrefixIndex::keys(job.tokens, job.chunkTokens, seed);
      const BundleRange &range = metrics.fallbackTokens[f];
      for (int64_t c = range.begin / job.chunkTokens;
           c * job.chunkTokens < range.end && c < int64_t(keys.size()); ++c)
        index.forget(keys[c]);
    }
  }
  job.result = std::move(result);
  return *job.result;
}

} // namespace

Status Connector::waitLayer(const std::string &id, int64_t layer,
                            std::optional<std::chrono::milliseconds> timeout) {
  KVC_ASSIGN_OR_RETURN(job, loadOf(state_->mutex, state_->requests, id));
  return job->handle->waitLayer(layer, timeout);
}

Status Connector::waitLayerOn(const std::string &id, int64_t layer,
                              void *stream) {
  KVC_ASSIGN_OR_RETURN(job, loadOf(state_->mutex, state_->requests, id));
  // Where the device makes no stream wait (none on this device, none free
  // now, or an error), the host waits: the layer is never left unwaited.
  StatusOr<std::shared_ptr<StreamSignal>> signal =
      state_->device->streamWait(stream);
  if (!signal)
    return job->handle->waitLayer(layer);
  job->handle->whenLayerReady(
      layer, [signal = std::move(*signal)] { signal->raise(); });
  return Status::ok();
}

StatusOr<RestoreMetrics> Connector::waitLoad(const std::string &id) {
  KVC_ASSIGN_OR_RETURN(job, loadOf(state_->mutex, state_->requests, id));
  return resultOf(*job, state_->index, state_->seed, state_->mutex);
}

StatusOr<std::vector<int32_t>> Connector::failedBlocks(const std::string &id) {
  KVC_ASSIGN_OR_RETURN(job, loadOf(state_->mutex, state_->requests, id));
  std::vector<int32_t> failed;
  if (!job->handle->ended())
    return failed;
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (!job->result)
    return failed; // finished() or waitLoad collects it.
  const int64_t blockSize = state_->caches->config().blockSize;
  auto add = [&](int64_t from, int64_t to) {
    for (int64_t b = std::max(from, job->resident) / blockSize;
         b * blockSize < to && b < int64_t(job->table.blocks.size()); ++b)
      if (std::find(failed.begin(), failed.end(), job->table.blocks[b]) ==
          failed.end())
        failed.push_back(job->table.blocks[b]);
  };
  if (!job->result->isOk())
    add(job->resident, int64_t(job->tokens.size()));
  else if (!state_->options.recomputeFailures)
    for (const BundleRange &range : (*job->result)->fallbackTokens)
      add(range.begin, range.end);
  std::sort(failed.begin(), failed.end());
  return failed;
}

Status Connector::saveLayer(const std::string &id,
                            const std::vector<int32_t> &tokens, int64_t layer,
                            const std::vector<int32_t> &blockIds) {
  State &s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.saveStore)
    return failedPrecondition("connector: no store to save to");
  const int64_t layers = s.options.model->config().numLayers;
  if (layer < 0 || layer >= layers)
    return invalidArgument("connector: no layer " + std::to_string(layer) +
                           " in a model of " + std::to_string(layers));
  Request &request = s.requests[id];
  if (request.tokens.empty())
    request.tokens = tokens;
  if (!request.save) {
    const int64_t ct = s.saveStore->layout().chunkTokens;
    const int64_t whole = int64_t(tokens.size()) / ct * ct;
    auto job = std::make_shared<SaveJob>();
    job->tokens.assign(tokens.begin(), tokens.begin() + whole);
    job->given.assign(layers, false);
    if (whole == 0) {
      job->copied = job->ended = true; // Nothing whole to keep.
    } else {
      KVC_ASSIGN_OR_RETURN(table, s.tableFor(blockIds, whole));
      job->table = std::move(table);
      job->filling.reset(layers, whole);
      job->plan = savePlanFor(*s.saveStore, whole, {Form::KV},
                              s.options.saveCodec, "store");
      job->source = std::make_unique<PagedCacheSource>(
          *s.device, *s.caches, job->table, &job->filling);
      job->target.source = job->source.get();
      job->target.stores["store"] = s.saveStore;
      job->target.tokens = &job->tokens;
      KVC_ASSIGN_OR_RETURN(pools, s.poolsFor(job->plan));
      SaveJob *raw = job.get();
      State *state = &s;
      KVC_ASSIGN_OR_RETURN(
          thread, startThread([raw, pools, state] {
            SaveRunOptions run;
            run.snapshotted = [raw] { raw->copied = true; };
            StatusOr<SaveMetrics> result =
                save(*pools, raw->plan, raw->target, run);
            if (result.isOk()) {
              // What this process saved, for later lookups.
              std::lock_guard<std::mutex> lock(state->mutex);
              ChunkStore &store = *state->saveStore;
              const std::vector<uint64_t> keys = PrefixIndex::keys(
                  raw->tokens, store.layout().chunkTokens, state->seed);
              for (uint64_t key : keys)
                state->index.add(key,
                                 {0, 0, Form::KV, state->options.saveCodec});
            }
            raw->result = std::move(result);
            raw->copied = true;
            raw->ended = true;
          }));
      job->thread = std::move(thread);
    }
    request.save = std::move(job);
  }
  SaveJob &job = *request.save;
  if (!job.given[layer] && !job.tokens.empty())
    job.filling.add(layer, layer + 1, int64_t(job.tokens.size()));
  job.given[layer] = true;
  return Status::ok();
}

StatusOr<SaveMetrics> Connector::waitSave(const std::string &id) {
  std::shared_ptr<SaveJob> job;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    Request *request = state_->find(id);
    if (!request || !request->save)
      return notFound("connector: no save of " + id);
    job = request->save;
    for (std::size_t l = 0; l < job->given.size(); ++l)
      if (!job->given[l])
        return failedPrecondition("connector: the save of " + id +
                                  " waits for layer " + std::to_string(l) +
                                  " (saveLayer)");
    request->save.reset();
  }
  if (job->thread.joinable())
    job->thread.join();
  return std::move(job->result);
}

Status Connector::cancel(const std::string &id) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto it = state_->requests.find(id);
  if (it == state_->requests.end())
    return notFound("connector: no request " + id);
  Request &request = it->second;
  if (request.load) {
    request.load->cancel = true;
    state_->retiredLoads.emplace_back(id, std::move(request.load));
  }
  if (request.save) {
    request.save->filling.finish(saveInterrupted());
    state_->retiredSaves.emplace_back(id, std::move(request.save));
  }
  state_->requests.erase(it);
  return Status::ok();
}

Finished Connector::finished() {
  State &s = *state_;
  Finished out;
  std::vector<std::shared_ptr<LoadJob>> collect;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    for (auto &[id, request] : s.requests) {
      if (request.load && !request.load->reported &&
          request.load->handle->ended()) {
        request.load->reported = true;
        collect.push_back(request.load);
        out.loads.push_back(id);
      }
      if (request.save && !request.save->reported && request.save->copied) {
        request.save->reported = true;
        out.saves.push_back(id);
      }
    }
    for (auto it = s.retiredLoads.begin(); it != s.retiredLoads.end();)
      if (it->second->handle->ended()) {
        out.loads.push_back(it->first);
        collect.push_back(it->second);
        it = s.retiredLoads.erase(it);
      } else {
        ++it;
      }
    for (auto it = s.retiredSaves.begin(); it != s.retiredSaves.end();)
      if (it->second->ended) {
        out.saves.push_back(it->first);
        it = s.retiredSaves.erase(it); // Joins its thread, which has ended.
      } else {
        ++it;
      }
  }
  for (const std::shared_ptr<LoadJob> &job : collect)
    (void)resultOf(*job, s.index, s.seed, s.mutex); // Ended: at once.
  return out;
}

} // namespace kvc::host

//===- Saver.cpp - Saving a context's KV and hidden states ----------------===//

#include "kvc/Runtime/Save/Saver.h"

#include "kvc/Runtime/Base/BoundedQueue.h"
#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Base/Threads.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

namespace kvc {

namespace {

/// A complete object waiting for its writer.
struct Job {
  ChunkRef ref;
  std::vector<float> values;
  size_t bytes() const { return values.size() * sizeof(float); }
};

} // namespace

void SaveJournal::wrote(ChunkStore &store, const ChunkRef &ref) {
  std::lock_guard<std::mutex> lock(mutex_);
  written_.emplace_back(&store, ref);
}

Status SaveJournal::rollback(const Status &failure) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string kept;
  int64_t keptCount = 0;
  for (auto &[store, ref] : written_)
    if (Status removed = store->remove(ref); !removed.isOk()) {
      if (keptCount++ < 3)
        kept += (kept.empty() ? "" : "; ") + removed.toString();
    }
  written_.clear();
  if (keptCount == 0)
    return failure;
  return Status(failure.code(),
                failure.message() + " (and " + std::to_string(keptCount) +
                    " objects the save wrote could not be removed: " + kept +
                    ")",
                failure.detail());
}

namespace {

/// What a plan of `endpoint`'s kind is, as refusals name it.
const char *planKind(StepKind endpoint) {
  switch (endpoint) {
  case StepKind::Store:
    return "save";
  case StepKind::Send:
    return "send";
  default:
    return "receive";
  }
}

/// Whether a plan whose objects end in `endpoint` may have `kind` steps.
bool belongs(StepKind kind, StepKind endpoint) {
  switch (kind) {
  case StepKind::Gather:
  case StepKind::Transform:
  case StepKind::Quant:
  case StepKind::TransferToHost:
  case StepKind::Compress:
    return endpoint != StepKind::Recv;
  case StepKind::Decompress:
  case StepKind::TransferToDevice:
  case StepKind::Dequant:
  case StepKind::Untransform:
  case StepKind::Scatter:
    return endpoint == StepKind::Recv;
  default:
    return kind == endpoint;
  }
}

} // namespace

StatusOr<PlanObjects> planObjects(const BundlePlan &plan,
                                  const ChunkObjects &objects, int64_t tokens,
                                  StepKind endpoint) {
  const int64_t layers = objects.model().numLayers;
  const StoreLayout &layout = objects.layout();
  const char *kind = planKind(endpoint);
  const std::string verb = endpoint == StepKind::Store  ? "stores"
                           : endpoint == StepKind::Send ? "sends"
                                                        : "receives";
  auto refuse = [&](const std::string &why) {
    return invalidArgument("plan " + plan.name + " " + why);
  };
  if (plan.tokens != BundleRange{0, tokens} ||
      plan.layers != BundleRange{0, layers})
    return refuse("covers tokens " + std::to_string(plan.tokens.begin) +
                  " to " + std::to_string(plan.tokens.end) + " of layers " +
                  std::to_string(plan.layers.begin) + " to " +
                  std::to_string(plan.layers.end) + ", the request " +
                  std::to_string(tokens) + " tokens of " +
                  std::to_string(layers) + " layers");
  PlanObjects out;
  std::optional<CodecSpec> codec;
  std::set<std::tuple<Form, int64_t, int64_t>> seen;
  for (const BundleTask &task : plan.tasks)
    for (const BundleStep &step : task.steps) {
      if (!belongs(step.kind, endpoint))
        return refuse("has a " + std::string(name(step.kind)) + "; it is no " +
                      kind + " plan");
      if (step.kind != endpoint)
        continue;
      if (codec && *codec != step.codec)
        return refuse(verb + " encodings " + codec->str() + " and " +
                      step.codec.str() + "; a " + kind + " has one");
      codec = step.codec;
      const BundleRange &t = step.tokens, &l = step.layers;
      if (t.begin % layout.chunkTokens != 0 ||
          t.end != std::min(tokens, t.begin + layout.chunkTokens) ||
          l.begin % layout.layerGroup != 0 ||
          l.end != std::min(layers, l.begin + layout.layerGroup))
        return refuse(
            verb + " objects of " + std::to_string(t.size()) + " tokens x " +
            std::to_string(l.size()) + " layers; " +
            (endpoint == StepKind::Store ? "the store's" : "the transfer's") +
            " are " + std::to_string(layout.chunkTokens) + " x " +
            std::to_string(layout.layerGroup) + " (compile with " +
            (endpoint == StepKind::Store ? "the store's" : "its") +
            " chunk_tokens and layer_group)");
      if (!seen.insert({step.form, t.begin, l.begin}).second)
        return refuse(verb + " " + std::string(name(step.form)) + " tokens " +
                      std::to_string(t.begin) + " of layer " +
                      std::to_string(l.begin) + " twice");
      if (std::find(out.forms.begin(), out.forms.end(), step.form) ==
          out.forms.end())
        out.forms.push_back(step.form);
    }
  if (!codec)
    return refuse(verb + " nothing");
  const int64_t perForm = (tokens + layout.chunkTokens - 1) /
                          layout.chunkTokens * layout.layerGroups(layers);
  if (int64_t(seen.size()) != perForm * int64_t(out.forms.size()))
    return refuse(verb + " " + std::to_string(seen.size()) + " objects of " +
                  std::to_string(perForm * int64_t(out.forms.size())) + "; a " +
                  kind + " has every one");
  out.codec = *codec;
  return out;
}

StatusOr<SaveOptions> saveOptionsFor(const BundlePlan &plan,
                                     const ChunkStore &store, int64_t tokens,
                                     SaveOptions base) {
  KVC_ASSIGN_OR_RETURN(objects,
                       planObjects(plan, store, tokens, StepKind::Store));
  base.forms = objects.forms;
  base.codec = objects.codec;
  if (base.prefillTokens == 0 && plan.prefillStep)
    base.prefillTokens = *plan.prefillStep;
  return base;
}

StatusOr<int64_t> prefillSpan(const SaveOptions &options,
                              const StoreLayout &layout) {
  if (options.prefillTokens < 0 ||
      options.prefillTokens % layout.chunkTokens != 0)
    return invalidArgument("stream: prefill steps of " +
                           std::to_string(options.prefillTokens) +
                           " tokens; they must be whole chunks of " +
                           std::to_string(layout.chunkTokens));
  return options.prefillTokens > 0 ? options.prefillTokens : layout.chunkTokens;
}

StatusOr<SaveStats> streamContext(const LlamaModel &model,
                                  const ChunkObjects &objects,
                                  const std::vector<int32_t> &tokens,
                                  const SaveOptions &options,
                                  const ObjectSink &sink) {
  const ModelConfig &c = model.config();
  const StoreLayout &layout = objects.layout();
  const int64_t n = int64_t(tokens.size());
  if (options.computed &&
      (options.computed->tokens < n ||
       int64_t(options.computed->k.size()) != c.numLayers ||
       std::any_of(options.forms.begin(), options.forms.end(),
                   [](Form f) { return f != Form::KV; })))
    return invalidArgument("stream: computed KV must hold every token and "
                           "layer of the request, and only KV can be taken "
                           "from it");
  KVC_ASSIGN_OR_RETURN(span, prefillSpan(options, layout));
  const int writerCount = std::max(1, options.writers);
  KVC_RETURN_IF_ERROR(checkWorkers("stream: the writers", writerCount));
  // Opened before any writer starts: nothing returns past a running thread.
  Clock::time_point start = Clock::now();
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<PrefillStream> stream;
  if (!options.computed && n > 0) {
    runner = deviceOr(options.device).createRunner(model);
    KVC_ASSIGN_OR_RETURN(opened, runner->streamPrefill(n));
    stream = std::move(opened);
  }
  SaveStats stats;
  BoundedQueue<Job> queue(options.bufferBytes);
  std::mutex statsMutex;
  Status firstError;
  std::atomic<bool> failed{false};
  auto cancelled = [&] { return options.cancel && options.cancel->load(); };

  std::vector<std::thread> writers;
  auto write = [&] {
    Job job;
    while (queue.pop(job)) {
      // After a failure the rest is dropped, not written.
      StatusOr<bool> written =
          failed        ? StatusOr<bool>(false)
          : cancelled() ? StatusOr<bool>(saveInterrupted())
                        : sink(job.ref, job.values.data());
      size_t bytes = job.bytes();
      job.values = {};
      queue.done(bytes);
      std::lock_guard<std::mutex> lock(statsMutex);
      if (!written.isOk()) {
        if (firstError.isOk())
          firstError = written.status();
        failed = true;
      } else if (!failed) {
        (*written ? stats.written : stats.skipped) += 1;
      }
    }
  };
  if (!options.dryRun)
    KVC_RETURN_IF_ERROR(
        startWorkers(writers, writerCount, write, [&] { queue.close(); }));

  // Each prefill step runs a span of whole chunks through every layer; its
  // objects go out layer group by layer group, every chunk of the span at
  // once.
  const std::vector<Digest> keys = objects.keys().keys(tokens.data(), n);
  Status prefill;
  for (int64_t s0 = 0; s0 < n && prefill.isOk() && !failed; s0 += span) {
    if (cancelled()) {
      prefill = saveInterrupted();
      break;
    }
    const int64_t s1 = std::min(n, s0 + span);
    const int64_t chunks =
        (s1 - s0 + layout.chunkTokens - 1) / layout.chunkTokens;
    // Per chunk of the span and form, the layer group being filled.
    std::vector<Job> filling(size_t(chunks) * options.forms.size());
    auto snapshot = [&](const LayerSnapshot &s) {
      if (options.dryRun)
        return;
      int64_t group0 = s.layer / layout.layerGroup * layout.layerGroup;
      int64_t group1 = std::min(c.numLayers, group0 + layout.layerGroup);
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        const int64_t t0 = s0 + chunk * layout.chunkTokens;
        const int64_t t1 = std::min(s1, t0 + layout.chunkTokens);
        const int64_t row = t0 - s.position, count = t1 - t0;
        for (size_t f = 0; f < options.forms.size(); ++f) {
          Form form = options.forms[f];
          Job &job = filling[size_t(chunk) * options.forms.size() + f];
          if (s.layer == group0) {
            job.ref = {keys[size_t(t0 / layout.chunkTokens)],
                       form,
                       t0,
                       t1,
                       group0,
                       group1,
                       options.codec};
            job.values.clear();
            job.values.reserve(objects.shape(job.ref).numel());
          }
          int64_t width = form == Form::KV ? model.kvDim() : c.hiddenSize;
          auto append = [&](const float *rows) {
            job.values.insert(job.values.end(), rows + row * width,
                              rows + (row + count) * width);
          };
          if (form == Form::KV) {
            append(s.k);
            append(s.v);
          } else {
            append(s.hidden);
          }
        }
      }
      if (s.layer + 1 == group1)
        for (Job &job : filling)
          stats.stallSeconds += queue.push(std::move(job));
    };
    if (options.computed) {
      // The prefill ran before: its KV, layer by layer, as it would have.
      for (int64_t layer = 0; layer < c.numLayers; ++layer) {
        const size_t first = size_t(s0 * options.computed->dim);
        snapshot({layer, s0, s1 - s0, nullptr,
                  options.computed->k[layer].data() + first,
                  options.computed->v[layer].data() + first});
      }
    } else {
      prefill = stream->next(tokens.data() + s0, s1 - s0, snapshot);
    }
    if (options.progress && prefill.isOk())
      options.progress(s1, n);
  }
  stats.prefillSeconds = secondsSince(start);
  queue.close();
  for (std::thread &t : writers)
    t.join();
  stats.totalSeconds = secondsSince(start);
  stats.peakBufferedBytes = queue.peak();
  KVC_RETURN_IF_ERROR(firstError);
  KVC_RETURN_IF_ERROR(prefill);
  return stats;
}

Status saveInterrupted() { return unavailable("the save was interrupted"); }

} // namespace kvc

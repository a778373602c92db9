//===- Pipeline.cpp - The steps of a chunk's journey, defined once --------===//

#include "kvc/Planning/Pipeline.h"

#include "kvc/Planning/CostModel.h"

#include <algorithm>
#include <cassert>
#include <utility>

namespace kvc::planning {

namespace {

/// A chunk's steps in order, each reading what the one before produced.
class Journey {
public:
  /// Starts with `first`, which produces `state`.
  Journey(StepKind first, ChunkState state) : state_(state) {
    steps_.push_back({first, state, state});
  }
  const ChunkState &state() const { return state_; }
  void then(StepKind kind, ChunkState out) {
    steps_.push_back({kind, state_, out});
    state_ = out;
  }
  std::vector<PipelineStep> steps() && { return std::move(steps_); }

private:
  ChunkState state_;
  std::vector<PipelineStep> steps_;
};

} // namespace

std::vector<PipelineStep> restoreSteps(Form form, const CodecSpec &codec,
                                       bool toCache, StepKind from) {
  Journey journey(from, {form, codec, /*onDevice=*/false, /*asStored=*/true,
                         /*fromStore=*/form == Form::KV});
  ChunkState next = journey.state();
  next.asStored = false; // Whatever reads them next checks them.
  if (codec.lossless != CodecSpec::Lossless::None) {
    next.codec.lossless = CodecSpec::Lossless::None;
    journey.then(StepKind::Decompress, next);
  }
  next.onDevice = true;
  journey.then(StepKind::TransferToDevice, next);
  if (codec.quant != CodecSpec::Quant::None) {
    next.codec.quant = CodecSpec::Quant::None;
    journey.then(StepKind::Dequant, next);
  }
  if (codec.transform != CodecSpec::Transform::None) {
    next.codec = CodecSpec();
    journey.then(StepKind::Untransform, next);
  }
  if (toCache) {
    if (form == Form::Hidden) {
      next = {Form::KV, CodecSpec(), true};
      journey.then(StepKind::Project, next);
    }
    journey.then(StepKind::Scatter, next);
  }
  return std::move(journey).steps();
}

std::vector<PipelineStep> saveSteps(Form form, const CodecSpec &codec,
                                    StepKind to) {
  Journey journey(StepKind::Gather, {form, CodecSpec(), /*onDevice=*/true});
  ChunkState next = journey.state();
  if (codec.transform != CodecSpec::Transform::None) {
    next.codec.transform = codec.transform;
    journey.then(StepKind::Transform, next);
  }
  if (codec.quant != CodecSpec::Quant::None) {
    next.codec = codec;
    next.codec.lossless = CodecSpec::Lossless::None;
    journey.then(StepKind::Quant, next);
  }
  next.onDevice = false;
  journey.then(StepKind::TransferToHost, next);
  if (codec.lossless != CodecSpec::Lossless::None) {
    next.codec = codec;
    journey.then(StepKind::Compress, next);
  }
  journey.then(to, next);
  return std::move(journey).steps();
}

std::vector<PipelineStep> computeSteps() {
  ChunkState kv{Form::KV, CodecSpec(), /*onDevice=*/true};
  return {{StepKind::ChunkCompute, kv, kv}, {StepKind::Scatter, kv, kv}};
}

Resource stepResource(StepKind kind, bool inputOnHost) {
  switch (kind) {
  case StepKind::Fetch:
  case StepKind::Store:
    return Resource::IO;
  case StepKind::TransferToDevice:
    return Resource::H2D;
  case StepKind::TransferToHost:
    return Resource::D2H;
  case StepKind::Send:
  case StepKind::Recv:
    return Resource::Net;
  case StepKind::Decompress:
  case StepKind::Compress:
  case StepKind::Dequant:
  case StepKind::Quant:
  case StepKind::Untransform:
  case StepKind::Transform:
    return inputOnHost ? Resource::Decode : Resource::Compute;
  case StepKind::Project:
  case StepKind::ChunkCompute:
  case StepKind::Scatter:
  case StepKind::Gather:
    return Resource::Compute;
  }
  return Resource::Compute;
}

int stepPriority(StepKind kind) {
  switch (kind) {
  case StepKind::Fetch:
    return 1;
  case StepKind::Decompress:
    return 2;
  case StepKind::TransferToDevice:
    return 3;
  case StepKind::Dequant:
  case StepKind::Untransform:
  case StepKind::Project:
  case StepKind::Scatter:
    return 4;
  default:
    return 0;
  }
}

bool freesStaging(StepKind kind) { return kind == StepKind::TransferToDevice; }

double stagingBytes(const CostModel &cost, Form form, const CodecSpec &codec,
                    const Box &box) {
  return cost.storedBytes(form, codec, box.tokens(), box.layers()) +
         cost.quantizedBytes(form, codec, box.tokens(), box.layers());
}

bool writesCacheRows(const CostModel &cost, const ChunkState &state) {
  return cost.target().compute.kind == ComputeDesc::Kind::CPU &&
         state.fromStore && state.form == Form::KV;
}

bool checksAsRead(const CostModel &cost, const ChunkState &state,
                  const TierDesc *tier) {
  return writesCacheRows(cost, state) && state.codec.isRaw() && tier &&
         tier->kind != TierDesc::Kind::Remote;
}

StepCost stepCost(const CostModel &cost, const PipelineStep &step,
                  const Box &box, const TierDesc *tier) {
  const int64_t tokens = box.tokens(), layers = box.layers();
  auto raw = [&](const ChunkState &s) {
    return cost.rawBytes(s.form, tokens, layers);
  };
  auto encoded = [&](const ChunkState &s) {
    return cost.encodedBytes(s.form, s.codec, tokens, layers);
  };
  StepCost c;
  switch (step.kind) {
  case StepKind::Fetch:
    c.bytesRead = encoded(step.out);
    c.seconds = !tier ? 0
                : checksAsRead(cost, step.out, tier)
                    ? cost.readCheckedSeconds(*tier, c.bytesRead)
                    : cost.readSeconds(*tier, c.bytesRead);
    break;
  case StepKind::Decompress:
    c.seconds = cost.hostDecodeSeconds(step.in.codec, encoded(step.out));
    break;
  case StepKind::TransferToDevice:
    // A chunk read into the cache has nothing to upload.
    c.seconds =
        writesCacheRows(cost, step.in) ? 0 : cost.h2dSeconds(encoded(step.in));
    // Without a decompress before it (a chunk stored with no lossless
    // stage), the upload checks the stored objects first
    // (ChunkSteps::toDevice), unless their fetch did.
    if (step.in.asStored && !checksAsRead(cost, step.in, tier))
      c.seconds += cost.uploadCheckSeconds(encoded(step.in));
    break;
  case StepKind::Dequant:
    c.seconds = cost.dequantSeconds(step.in.codec, raw(step.in));
    break;
  case StepKind::Untransform:
    c.seconds = cost.untransformSeconds(step.in.codec, raw(step.in));
    break;
  case StepKind::Project:
    c.flops = cost.projectFlops(tokens, layers);
    c.seconds = cost.computeSeconds(c.flops, tokens);
    break;
  case StepKind::Scatter:
    c.seconds =
        writesCacheRows(cost, step.in) ? 0 : cost.scatterSeconds(raw(step.in));
    break;
  case StepKind::ChunkCompute:
    c.flops = cost.prefillFlops(box.t0, box.t1, layers);
    c.seconds = cost.prefillSeconds(box.t0, box.t1, layers);
    break;
  case StepKind::Gather:
    c.seconds = cost.scatterSeconds(raw(step.out));
    break;
  case StepKind::Transform:
  case StepKind::Quant:
  case StepKind::Compress: {
    // Encode only the stage this step adds.
    CodecSpec stage;
    if (step.kind == StepKind::Transform)
      stage.transform = step.out.codec.transform;
    if (step.kind == StepKind::Quant)
      stage.quant = step.out.codec.quant, stage.group = step.out.codec.group;
    if (step.kind == StepKind::Compress)
      stage.lossless = step.out.codec.lossless;
    c.seconds = cost.hostEncodeSeconds(stage, encoded(step.in));
    break;
  }
  case StepKind::TransferToHost:
    c.seconds = cost.d2hSeconds(encoded(step.in));
    break;
  case StepKind::Store:
    c.seconds = tier ? cost.writeSeconds(*tier, encoded(step.in)) : 0;
    break;
  case StepKind::Send:
  case StepKind::Recv:
    // The wire: a recv ends no earlier than its object could cross it.
    c.seconds = cost.networkSeconds(encoded(step.in));
    break;
  }
  return c;
}

double prefillReadySeconds(const CostModel &cost, int64_t tokens, int64_t step,
                           int64_t layers, const Box &box) {
  assert(step > 0 && layers > 0 && box.t1 <= tokens &&
         "a prefill of the box's tokens, something a step");
  // The steps before the one holding the box's last token.
  const int64_t t0 = (box.t1 - 1) / step * step;
  const double start = cost.prefillSeconds(0, t0, layers, step);
  // The step holding the box's last token computes all its tokens a layer
  // at a time, and writes a layer's K and V once it has projected them.
  const int64_t t1 = std::min(tokens, t0 + step);
  const double layer = cost.prefillSeconds(t0, t1, layers) / double(layers);
  return start + layer * double(box.l1 - 1) +
         std::min(layer, cost.kvWrittenSeconds(t0, t1));
}

} // namespace kvc::planning

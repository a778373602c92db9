//===- SelectCodec.cpp - kvc-select-codec: codecs under budgets -----------===//
//
// KVServe's selection. For a save or transfer without a codec, every codec
// of the profile (and raw data) is a candidate, a Hadamard one only where
// the model's rows rotate; a candidate is feasible when its error is within
// `max_error` (0 when absent: lossless only) and its latency within
// `slo_ms`, where latency is KVServe's model: encoding on the host, the
// encoded bytes over the tier's write bandwidth (save) or the NIC
// (transfer), and decoding at the other end. The fastest feasible codec wins;
// when none is feasible the op is rejected with the closest candidates named.
//
// For a restore storing the same form and ranges in several encodings, the
// sources that break the error budget or that are slower to load than
// another encoding of the same data are dropped.
//
//===----------------------------------------------------------------------===//

#include "PlanningSupport.h"

#include "kvc/Support/Format.h"
#include "kvc/Support/Hadamard.h"
#include "kvc/Transforms/Descriptions.h"
#include "kvc/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

#include <limits>

namespace kvc::compiler {
#define GEN_PASS_DEF_KVCSELECTCODECPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace kvc::compiler

using namespace mlir;
using namespace kvc::compiler;
namespace planning = kvc::planning;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double optionalDouble(FloatAttr attr, double otherwise) {
  return attr ? attr.getValueAsDouble() : otherwise;
}

struct KVCSelectCodecPass
    : public PlanningPass<KVCSelectCodecPass,
                          kvc::compiler::impl::KVCSelectCodecPassBase> {
  using PlanningPass::PlanningPass;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<Operation *> ops;
    module.walk([&](Operation *op) {
      if (isa<RestoreOp>(op) ||
          (isa<SaveOp>(op) && !cast<SaveOp>(op).getCodec()) ||
          (isa<TransferOp>(op) && !cast<TransferOp>(op).getCodec()))
        ops.push_back(op);
    });
    if (ops.empty())
      return;
    FailureOr<PlanningContext> context =
        getPlanningContext(module, getArgument(), planOptions());
    if (failed(context))
      return signalPassFailure();
    for (Operation *op : ops) {
      LogicalResult result = success();
      if (auto restore = dyn_cast<RestoreOp>(op))
        result = pruneSources(restore, *context);
      else if (auto save = dyn_cast<SaveOp>(op))
        result = chooseCodec(save, save.getTokens(), save.getKv(),
                             save.getHidden(), save.getTier(),
                             save.getSloMsAttr(), save.getMaxErrorAttr(),
                             *context);
      else if (auto transfer = dyn_cast<TransferOp>(op))
        result = chooseCodec(transfer, transfer.getTokens(), /*kv=*/true,
                             /*hidden=*/false, /*tier=*/"",
                             transfer.getSloMsAttr(),
                             transfer.getMaxErrorAttr(), *context);
      if (failed(result))
        return signalPassFailure();
    }
  }

  /// KVServe's latency of moving `tokens` of the given forms with `codec`:
  /// encode + bytes over the link + decode, all on host cores.
  double latency(const planning::CostModel &cost, const kvc::CodecSpec &codec,
                 int64_t tokens, bool kv, bool hidden, StringRef tier) {
    int64_t layers = cost.model().numLayers;
    double seconds = 0;
    for (auto [wanted, form] :
         {std::pair{kv, kvc::Form::KV}, std::pair{hidden, kvc::Form::Hidden}}) {
      if (!wanted)
        continue;
      double raw = cost.rawBytes(form, tokens, layers);
      double stored = cost.storedBytes(form, codec, tokens, layers);
      double quantized = cost.quantizedBytes(form, codec, tokens, layers);
      seconds += cost.hostEncodeSeconds(codec, raw) +
                 cost.hostDecodeSeconds(codec, quantized);
      if (tier.empty()) {
        seconds += cost.networkSeconds(stored);
      } else if (const kvc::TierDesc *desc =
                     cost.target().findTier(tier.str())) {
        seconds += desc->latencyUs * 1e-6 + stored / (desc->writeGBs * 1e9);
      }
    }
    return seconds;
  }

  LogicalResult chooseCodec(Operation *op, RangeAttr tokens, bool kv,
                            bool hidden, StringRef tier, FloatAttr sloAttr,
                            FloatAttr errorAttr,
                            const PlanningContext &context) {
    const planning::CostModel &cost = *context.cost;
    if (tier.empty() && cost.target().host.nicGBs <= 0)
      return op->emitOpError("target \"")
             << cost.target().name << "\" has no network (host.nic_gbs)";
    double slo = optionalDouble(sloAttr, kInf) * 1e-3;
    // Without a stated budget nothing lossy is chosen: a server must ask
    // for approximate KV.
    double maxError = optionalDouble(errorAttr, 0.0);
    std::vector<planning::CodecProfileEntry> candidates{
        planning::CodecProfileEntry{}}; // Raw data.
    // A Hadamard codec only where the model's rows rotate (the verifiers
    // refuse the others).
    const kvc::ModelConfig &model = cost.model();
    const bool rotates =
        (!kv ||
         kvc::hadamardRotates(kvc::Form::KV, model.numKvHeads * model.headDim,
                              model.headDim)) &&
        (!hidden || kvc::hadamardRotates(kvc::Form::Hidden, model.hiddenSize,
                                         model.headDim));
    for (const planning::CodecProfileEntry &e : cost.profile().entries())
      if (rotates || e.codec.transform != kvc::CodecSpec::Transform::Hadamard)
        candidates.push_back(e);

    const planning::CodecProfileEntry *best = nullptr, *fastest = nullptr,
                                      *fastestAccurate = nullptr;
    double bestSeconds = kInf, fastestSeconds = kInf, accurateSeconds = kInf;
    for (const planning::CodecProfileEntry &e : candidates) {
      double seconds = latency(cost, e.codec, tokens.size(), kv, hidden, tier);
      double error = cost.profile().quality(e.codec);
      if (seconds < fastestSeconds)
        fastest = &e, fastestSeconds = seconds;
      if (error <= maxError && seconds < accurateSeconds)
        fastestAccurate = &e, accurateSeconds = seconds;
      if (error <= maxError && seconds <= slo && seconds < bestSeconds)
        best = &e, bestSeconds = seconds;
    }
    if (!best) {
      InFlightDiagnostic diag = op->emitOpError("no codec meets ");
      if (sloAttr)
        diag << "slo_ms = " << kvc::formatNumber(slo * 1e3) << " and ";
      diag << "max_error = " << kvc::formatNumber(maxError) << ": ";
      if (fastestAccurate)
        diag << "the fastest within the error budget ("
             << fastestAccurate->codec.str() << ") takes "
             << kvc::formatSignificant(accurateSeconds * 1e3) << " ms";
      else
        diag << "every codec adds more error";
      diag << "; the fastest overall (" << fastest->codec.str() << ") takes "
           << kvc::formatSignificant(fastestSeconds * 1e3) << " ms and adds "
           << kvc::formatSignificant(cost.profile().quality(fastest->codec))
           << " error";
      return diag;
    }
    CodecAttr codec = getCodecAttr(op->getContext(), best->codec);
    if (codec)
      op->setAttr("codec", codec);
    return success();
  }

  LogicalResult pruneSources(RestoreOp restore,
                             const PlanningContext &context) {
    const planning::CostModel &cost = *context.cost;
    planning::Request request = getRequest(restore);
    // Loading cost per token-layer: the slowest resource of the pipeline.
    auto loadCost = [&](const planning::Source &s) {
      const kvc::TierDesc *tier = cost.target().findTier(s.tier);
      double stored = cost.storedBytes(s.form, s.codec, 1, 1);
      double quantized = cost.quantizedBytes(s.form, s.codec, 1, 1);
      double io =
          tier ? stored / (planning::CostModel::readGBs(*tier) * 1e9) : kInf;
      return std::max({io, cost.hostDecodeSeconds(s.codec, quantized),
                       quantized / (cost.target().link.h2dGBs * 1e9)});
    };
    SmallVector<Attribute> kept;
    for (size_t i = 0; i < request.sources.size(); ++i) {
      const planning::Source &s = request.sources[i];
      Attribute attr = restore.getSources()[i];
      if (!cost.profile().allows(s.codec, request.maxError, request.maxKl)) {
        InFlightDiagnostic diag =
            mlir::emitRemark(restore.getLoc(), "dropping source ");
        diag << i << " (" << s.codec.str() << "): ";
        const double error = cost.profile().quality(s.codec);
        if (error > request.maxError)
          diag << "its error " << kvc::formatSignificant(error)
               << " exceeds max_error";
        else
          diag << "its next-token KL "
               << kvc::formatSignificant(cost.profile().kl(s.codec))
               << " exceeds max_kl";
        continue;
      }
      bool dominated = false;
      for (size_t j = 0; j < request.sources.size() && !dominated; ++j) {
        const planning::Source &o = request.sources[j];
        if (i == j || o.form != s.form || !o.box.contains(s.box) ||
            !cost.profile().allows(o.codec, request.maxError, request.maxKl))
          continue;
        double mine = loadCost(s), theirs = loadCost(o);
        dominated = theirs < mine || (theirs == mine && j < i);
      }
      if (dominated) {
        mlir::emitRemark(restore.getLoc(), "dropping source ")
            << i << " (" << s.codec.str() << " in \"" << s.tier
            << "\"): another encoding of the same data loads faster";
        continue;
      }
      kept.push_back(attr);
    }
    restore.setSourcesAttr(ArrayAttr::get(restore.getContext(), kept));
    return success();
  }
};

} // namespace

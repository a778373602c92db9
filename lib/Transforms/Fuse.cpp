//===- Fuse.cpp - kvc-fuse: elementwise device chains into kernels --------===//
//
// Finds maximal chains of fusible steps on device chunks of KV, each feeding
// only the next (dequant -> untransform -> scatter, project -> scatter, ...),
// and folds every chain of two or more into one kvc.kernel (kvc-lower-kernels
// generates the kinds listed in KernelGen.h). A lone step that copies
// between the paged cache and a chunk crossing the host link (the scatter
// of a loaded raw chunk, the gather of a saved one) is a kernel of its own:
// a launch that can take many chunks. Steps on hidden states other than
// their projection stay steps. Values a chain produces for steps outside it
// become the kernel's results; a chunk compute that runs after one does not
// end the chain.
//
//===----------------------------------------------------------------------===//

#include "kvc/Dialect/KVC/IR/KVCOps.h"
#include "kvc/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace kvc::compiler {
#define GEN_PASS_DEF_KVCFUSEPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace kvc::compiler

using namespace mlir;
using namespace kvc::compiler;

namespace {

/// A fusible step on a device chunk of KV (its one input, or for a step
/// without one, gather, its result), or the projection of hidden states into
/// KV. The other steps on hidden states (a save's gather, transform and
/// quant, a load's dequant and untransform) have no generated kernel: the
/// runtime's host encode and decode do them, so a kernel of them would name
/// code that does not exist.
bool isDeviceFusible(Operation *op) {
  auto step = dyn_cast<DataflowOpInterface>(op);
  if (!step || !step.isFusible() || op->getNumOperands() > 1)
    return false;
  Value chunkValue = op->getNumOperands()       ? op->getOperand(0)
                     : op->getNumResults() == 1 ? op->getResult(0)
                                                : Value();
  auto chunk = chunkValue ? dyn_cast<ChunkType>(chunkValue.getType()) : nullptr;
  return chunk && chunk.getSpace() == Space::device &&
         (chunk.getForm() == Form::kv || isa<ProjectOp>(op));
}

/// The next step of a chain: the single user of `op`'s single result, when
/// it is fusible and in the same block. Chunk computes that take the result
/// as a prefix (they run after it) do not count: the chain goes on into the
/// scatter and the kernel yields the value, so the computes wait for the
/// whole kernel.
Operation *nextInChain(Operation *op) {
  if (op->getNumResults() != 1)
    return nullptr;
  Operation *user = nullptr;
  for (Operation *other : op->getResult(0).getUsers()) {
    if (isa<ChunkComputeOp>(other))
      continue;
    if (user && user != other)
      return nullptr;
    user = other;
  }
  if (!user || user->getBlock() != op->getBlock() || !isDeviceFusible(user))
    return nullptr;
  return user;
}

/// A scatter of a chunk copied to the device, or a gather of one copied to
/// the host: a kernel even alone.
bool isCacheCopy(Operation *op) {
  if (isa<ScatterOp>(op))
    return op->getOperand(0).getDefiningOp<TransferToDeviceOp>() != nullptr;
  if (auto gather = dyn_cast<GatherOp>(op))
    return gather->hasOneUse() &&
           isa<TransferToHostOp>(*gather->getUsers().begin());
  return false;
}

std::string kernelName(ArrayRef<Operation *> chain) {
  std::string name;
  for (Operation *op : chain) {
    if (!name.empty())
      name += "_";
    name += op->getName().stripDialect().str();
  }
  return name;
}

void fuse(ArrayRef<Operation *> chain) {
  Operation *first = chain.front(), *last = chain.back();
  OpBuilder builder(last);
  // Results: values of the chain used outside it (the last step's result).
  SmallVector<Value> escaping;
  for (Operation *op : chain)
    for (Value result : op->getResults())
      for (Operation *user : result.getUsers())
        if (!llvm::is_contained(chain, user)) {
          escaping.push_back(result);
          break;
        }
  ValueRange inputs = first->getOperands();
  auto kernel = builder.create<KernelOp>(
      first->getLoc(), ValueRange(escaping).getTypes(),
      builder.getStringAttr(kernelName(chain)), inputs);
  SmallVector<Location> locs;
  for (Value input : inputs)
    locs.push_back(input.getLoc());
  Block *body = builder.createBlock(&kernel.getBody(), {},
                                    TypeRange(inputs.getTypes()), locs);
  IRMapping mapping;
  mapping.map(inputs, body->getArguments());
  for (Operation *op : chain)
    builder.clone(*op, mapping);
  SmallVector<Value> yielded;
  for (Value value : escaping)
    yielded.push_back(mapping.lookup(value));
  builder.create<YieldOp>(first->getLoc(), yielded);
  for (auto [value, result] : llvm::zip(escaping, kernel.getResults()))
    value.replaceAllUsesWith(result);
  for (Operation *op : llvm::reverse(chain))
    op->erase();
}

struct KVCFusePass : public kvc::compiler::impl::KVCFusePassBase<KVCFusePass> {
  void runOnOperation() override {
    // Analyze: collect chains first, then rewrite.
    SmallVector<SmallVector<Operation *>> chains;
    getOperation().walk([&](Operation *op) {
      if (op->getParentOfType<KernelOp>() || !isDeviceFusible(op))
        return;
      // A chain starts where its input is not the tail of a chain.
      Operation *producer =
          op->getNumOperands() ? op->getOperand(0).getDefiningOp() : nullptr;
      if (producer && isDeviceFusible(producer) && nextInChain(producer) == op)
        return;
      SmallVector<Operation *> chain{op};
      while (Operation *next = nextInChain(chain.back()))
        chain.push_back(next);
      if (chain.size() >= 2 || isCacheCopy(op))
        chains.push_back(std::move(chain));
    });
    for (ArrayRef<Operation *> chain : chains)
      fuse(chain);
  }
};

} // namespace

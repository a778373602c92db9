//===- Fuse.cpp - kvc-fuse: elementwise device chains into kernels --------===//
//
// Finds maximal chains of fusible steps on device chunks, each feeding only
// the next (dequant -> untransform -> scatter, project -> scatter, ...), and
// folds every chain of two or more into one kvc.kernel (kvc-lower-kernels
// generates the kinds listed in KernelGen.h). Values a chain produces for
// steps outside it become the kernel's results.
//
//===----------------------------------------------------------------------===//

#include "kvc/Dialect/KVC/IR/KVCOps.h"
#include "kvc/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::kvc {
#define GEN_PASS_DEF_KVCFUSEPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace mlir::kvc

using namespace mlir;
using namespace mlir::kvc;

namespace {

/// A fusible step on a device chunk.
bool isDeviceFusible(Operation *op) {
  auto step = dyn_cast<DataflowOpInterface>(op);
  if (!step || !step.isFusible() || op->getNumOperands() != 1)
    return false;
  auto chunk = dyn_cast<ChunkType>(op->getOperand(0).getType());
  return chunk && chunk.getSpace() == Space::device;
}

/// The next step of a chain: the single user of `op`'s single result, when
/// it is fusible and in the same block.
Operation *nextInChain(Operation *op) {
  if (op->getNumResults() != 1 || !op->getResult(0).hasOneUse())
    return nullptr;
  Operation *user = *op->getResult(0).getUsers().begin();
  if (user->getBlock() != op->getBlock() || !isDeviceFusible(user))
    return nullptr;
  return user;
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
  Value input = first->getOperand(0);
  auto kernel = builder.create<KernelOp>(
      first->getLoc(), ValueRange(escaping).getTypes(),
      builder.getStringAttr(kernelName(chain)), ValueRange{input});
  Block *body = builder.createBlock(&kernel.getBody(), {}, {input.getType()},
                                    {input.getLoc()});
  IRMapping mapping;
  mapping.map(input, body->getArgument(0));
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

struct KVCFusePass : public mlir::kvc::impl::KVCFusePassBase<KVCFusePass> {
  void runOnOperation() override {
    // Analyze: collect chains first, then rewrite.
    SmallVector<SmallVector<Operation *>> chains;
    getOperation().walk([&](Operation *op) {
      if (op->getParentOfType<KernelOp>() || !isDeviceFusible(op))
        return;
      // A chain starts where its input is not the tail of a chain.
      Operation *producer = op->getOperand(0).getDefiningOp();
      if (producer && isDeviceFusible(producer) && nextInChain(producer) == op)
        return;
      SmallVector<Operation *> chain{op};
      while (Operation *next = nextInChain(chain.back()))
        chain.push_back(next);
      if (chain.size() >= 2)
        chains.push_back(std::move(chain));
    });
    for (ArrayRef<Operation *> chain : chains)
      fuse(chain);
  }
};

} // namespace

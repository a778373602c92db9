//===- KernelJitTest.cpp - Generated kernels on the host ------------------===//
//
// Every kernel kind kvc-lower-kernels generates runs here through the host
// lowering (buildKernelsToLLVMPipeline) and MLIR's ExecutionEngine, the same
// loop nest the GPU pipeline maps to blocks and threads. Its output in a
// paged cache must equal the runtime's own code bit for bit (the decoder for
// every codec composition the planner can choose; RoPE and rounding after a
// projection), for shapes that stress the index arithmetic
// (KernelCase.h). The GPU form of each case is lowered to PTX as well and
// run by the PTX interpreter (PtxInterpreter.h) through the checks
// kvc-kernel-bench runs on a GPU (KernelDevice.h).
//
//===----------------------------------------------------------------------===//

#include "kvc/Conversion/KernelGen.h"
#include "kvc/Dialect/KVC/IR/KVCOps.h"
#include "kvc/Runtime/Exec/PlanBundle.h"
#include "kvc/Testing/KernelCase.h"
#include "kvc/Testing/KernelDevice.h"
#include "kvc/Transforms/Descriptions.h"
#include "kvc/Transforms/EmitBundle.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/ExecutionEngine/CRunnerUtils.h"
#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"

#include "llvm/Support/TargetSelect.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>

using namespace mlir;
using kvc::testing::KernelCase;
using kvc::testing::KernelShape;

namespace {

using kvc::DType;

struct JitCase {
  /// parseCodecSpec's grammar for a restore kernel, the same after "save:"
  /// for a save kernel, "rope_scatter" or "rms_norm".
  const char *codec;
  kvc::DType storage;
  int64_t tokens, layers, kvHeads, headDim, blockSize, firstToken;
  /// rms_norm: the rows' width.
  int64_t hidden = 0;
  /// restore: chunks of one launch (KernelCase::make).
  int64_t chunks = 1;
  /// save: kvc-lower-kernels' group-lanes (0: the generator's choice).
  int64_t groupLanes = 0;
  /// save: kvc-lower-kernels' held-tokens.
  int64_t heldTokens = kvc::compiler::KernelSpec::kDefaultHeldTokens;
};

std::ostream &operator<<(std::ostream &os, const JitCase &c) {
  os << c.codec << " " << kvc::dtypeName(c.storage) << " t" << c.tokens << " l"
     << c.layers;
  if (c.hidden)
    return os << " d" << c.hidden;
  os << " h" << c.kvHeads << "x" << c.headDim << " b" << c.blockSize << " from "
     << c.firstToken;
  if (c.chunks > 1)
    os << " x" << c.chunks << " chunks";
  if (c.groupLanes)
    os << " groups over " << c.groupLanes << " lanes";
  if (c.heldTokens != kvc::compiler::KernelSpec::kDefaultHeldTokens)
    os << " holding " << c.heldTokens << " tokens";
  return os;
}

/// A buffer aligned as the kernels' 16-byte accesses need.
template <typename T>
struct AlignedBuffer {
  explicit AlignedBuffer(size_t count)
      : count(count),
        data(static_cast<T *>(std::aligned_alloc(
                 64, (count * sizeof(T) + 63) / 64 * 64)),
             &std::free) {}
  StridedMemRefType<T, 1> memref() {
    return {data.get(), data.get(), 0, {int64_t(count)}, {1}};
  }
  size_t count;
  std::unique_ptr<T, decltype(&std::free)> data;
};

class KernelJitTest : public ::testing::TestWithParam<JitCase> {
protected:
  static void SetUpTestSuite() {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  }

  KernelJitTest() {
    DialectRegistry registry;
    kvc::compiler::registerKernelDialects(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
  }

  MLIRContext context;
};

/// The case JitCase `p` describes, and the kernel's spec for it in the
/// host (`host`) or the GPU form.
struct Prepared {
  KernelCase kernelCase;
  kvc::compiler::KernelSpec spec;
};

kvc::StatusOr<Prepared> prepare(MLIRContext &context, const JitCase &p,
                                bool host) {
  const std::string name = p.codec;
  const bool rope = name == "rope_scatter", norm = name == "rms_norm";
  const bool save = name.rfind("save:", 0) == 0;
  KVC_ASSIGN_OR_RETURN(codec, kvc::parseCodecSpec(rope || norm ? "raw"
                                                  : save       ? name.substr(5)
                                                               : name));
  KernelShape shape;
  shape.tokens = p.tokens;
  shape.layers = p.layers;
  shape.kvHeads = p.kvHeads;
  shape.headDim = p.headDim;
  shape.blockSize = p.blockSize;
  shape.codec = codec;
  shape.storage = p.storage;
  shape.hidden = p.hidden;
  const uint32_t seed = uint32_t(p.tokens);
  kvc::compiler::KernelSpec spec;
  spec.kind = rope   ? kvc::compiler::KernelKind::RopeScatter
              : save ? kvc::compiler::KernelKind::Save
              : norm ? kvc::compiler::KernelKind::RmsNorm
                     : kvc::compiler::KernelKind::Restore;
  KVC_ASSIGN_OR_RETURN(c,
                       KernelCase::forKind(spec.kind, shape, p.firstToken,
                                           /*firstLayer=*/1, seed, p.chunks));
  spec.hidden = p.hidden;
  spec.eps = shape.eps;
  spec.tokens = p.tokens;
  spec.layers = p.layers;
  spec.kvHeads = p.kvHeads;
  spec.headDim = p.headDim;
  spec.blockSize = p.blockSize;
  if (norm) { // A prologue keeps its epilogue's cache shape; it reads none.
    spec.kvHeads = 1;
    spec.headDim = 8;
    spec.blockSize = 16;
  }
  Builder b(&context);
  spec.storage = p.storage == DType::F32   ? Type(b.getF32Type())
                 : p.storage == DType::F16 ? Type(b.getF16Type())
                                           : Type(b.getBF16Type());
  spec.codec = kvc::compiler::getCodecAttr(&context, codec);
  spec.threads = 64;
  spec.host = host; // KernelGen.h: the two forms.
  spec.groupLanesOption = p.groupLanes;
  spec.heldTokens = p.heldTokens;
  for (const kvc::KernelChunk &chunk : c.chunks())
    if (chunk.payloadOffset + spec.payloadBytes() > int64_t(c.payload().size()))
      return kvc::Status(kvc::StatusCode::Internal,
                         "a chunk's payload overruns the case's");
  if (p.chunks == 1 && spec.payloadBytes() != int64_t(c.payload().size()))
    return kvc::Status(kvc::StatusCode::Internal,
                       "the kernel's payload is not the case's");
  return Prepared{std::move(c), spec};
}

// Tests the host form, JIT-compiled.
TEST_P(KernelJitTest, EqualsTheRuntime) {
  const JitCase &p = GetParam();
  const std::string name = p.codec;
  const bool rope = name == "rope_scatter", norm = name == "rms_norm";
  const bool save = name.rfind("save:", 0) == 0;
  kvc::StatusOr<Prepared> prepared = prepare(context, p, /*host=*/true);
  ASSERT_TRUE(prepared) << prepared.status().message();
  const KernelCase &c = prepared->kernelCase;
  const kvc::compiler::KernelSpec &spec = prepared->spec;

  OwningOpRef<ModuleOp> module = ModuleOp::create(UnknownLoc::get(&context));
  OpBuilder builder = OpBuilder::atBlockEnd(module->getBody());
  func::FuncOp func =
      kvc::compiler::buildKernel(builder, builder.getUnknownLoc(), spec);
  func->setAttr(LLVM::LLVMDialect::getEmitCWrapperAttrName(),
                builder.getUnitAttr());
  const std::string symbol = func.getSymName().str(); // Lowering erases it.
  PassManager pm(&context);
  kvc::compiler::buildKernelsToLLVMPipeline(pm);
  ASSERT_TRUE(succeeded(pm.run(*module)));

  ExecutionEngineOptions options;
  auto optimize = makeOptimizingTransformer(2, 0, nullptr);
  options.transformer = optimize;
  auto engine = ExecutionEngine::create(*module, options);
  ASSERT_TRUE(bool(engine)) << llvm::toString(engine.takeError());

  auto bytesOf = [](const auto &container) {
    AlignedBuffer<int8_t> buffer(container.size() *
                                 sizeof(*container.data()));
    if (buffer.count) // An empty container's data() may be null.
      std::memcpy(buffer.data.get(), container.data(), buffer.count);
    return buffer;
  };
  AlignedBuffer<int8_t> payload = bytesOf(c.payload());
  if (norm) {
    AlignedBuffer<int8_t> weights = bytesOf(c.normWeights());
    AlignedBuffer<int8_t> normed(c.normedValues() * 2);
    auto *normedBits = reinterpret_cast<uint16_t *>(normed.data.get());
    std::fill_n(normedBits, c.normedValues(), KernelCase::kPoison);
    auto hiddenRef = payload.memref(), weightRef = weights.memref(),
         normedRef = normed.memref();
    auto *hiddenArg = &hiddenRef, *weightArg = &weightRef,
         *normedArg = &normedRef;
    int64_t firstLayer = c.firstLayer();
    llvm::Error error =
        (*engine)->invoke(symbol, hiddenArg, weightArg, normedArg, firstLayer);
    ASSERT_FALSE(bool(error)) << llvm::toString(std::move(error));
    kvc::testing::CacheErrors errors = c.checkNormed(normedBits);
    EXPECT_TRUE(errors.ok()) << errors.str();
    return;
  }
  // A save kernel writes the payload (poisoned here) from a filled cache.
  if (save)
    std::memset(payload.data.get(), 0xA5, payload.count);
  AlignedBuffer<int8_t> ropeTable = bytesOf(c.ropeTable());
  AlignedBuffer<int8_t> keys(c.cacheValues() * 2), values(c.cacheValues() * 2);
  auto *keyBits = reinterpret_cast<uint16_t *>(keys.data.get());
  auto *valueBits = reinterpret_cast<uint16_t *>(values.data.get());
  std::fill_n(keyBits, c.cacheValues(), KernelCase::kPoison);
  std::fill_n(valueBits, c.cacheValues(), KernelCase::kPoison);
  if (save)
    c.fillCache(keyBits, valueBits);
  AlignedBuffer<int32_t> table(c.blockTable().size());
  std::copy(c.blockTable().begin(), c.blockTable().end(), table.data.get());
  AlignedBuffer<int64_t> chunks(3 * c.chunks().size());
  std::memcpy(chunks.data.get(), c.chunks().data(), chunks.count * 8);

  auto payloadRef = payload.memref(), keyRef = keys.memref(),
       valueRef = values.memref(), ropeRef = ropeTable.memref();
  auto tableRef = table.memref();
  auto chunksRef = chunks.memref();
  auto *payloadArg = &payloadRef, *keyArg = &keyRef, *valueArg = &valueRef,
       *ropeArg = &ropeRef;
  auto *tableArg = &tableRef;
  auto *chunksArg = &chunksRef;
  int64_t layerRows = c.layerRows();
  llvm::Error error =
      rope ? (*engine)->invoke(symbol, payloadArg, keyArg, valueArg, tableArg,
                               chunksArg, layerRows, ropeArg)
           : (*engine)->invoke(symbol, payloadArg, keyArg, valueArg, tableArg,
                               chunksArg, layerRows);
  ASSERT_FALSE(bool(error)) << llvm::toString(std::move(error));

  kvc::testing::CacheErrors errors = c.check(
      keyBits, valueBits, reinterpret_cast<uint8_t *>(payload.data.get()));
  EXPECT_TRUE(errors.ok()) << errors.str();
}

// Tests the GPU form: the PTX a bundle carries, run by the PTX interpreter
// (its warps' shuffles and the GPU's rounding; PtxInterpreter.h) on the
// same case, through the checks kvc-kernel-bench runs on a GPU.
TEST_P(KernelJitTest, GpuFormEqualsTheRuntime) {
  kvc::StatusOr<Prepared> prepared =
      prepare(context, GetParam(), /*host=*/false);
  ASSERT_TRUE(prepared) << prepared.status().message();
  OwningOpRef<ModuleOp> module = ModuleOp::create(UnknownLoc::get(&context));
  OpBuilder builder = OpBuilder::atBlockEnd(module->getBody());
  func::FuncOp func = kvc::compiler::buildKernel(
      builder, builder.getUnknownLoc(), prepared->spec);
  // What kvc-lower-kernels records, for kvc-emit-bundle.
  func->setAttr(kvc::compiler::KVCDialect::kEntryAttrName,
                prepared->spec.toAttr(&context));
  PassManager pm(&context);
  kvc::compiler::buildKernelsToPTXPipeline(pm, "sm_90");
  ASSERT_TRUE(succeeded(pm.run(*module)));
  std::string json;
  llvm::raw_string_ostream os(json);
  ASSERT_TRUE(succeeded(kvc::compiler::writePlanBundle(*module, os)));
  kvc::StatusOr<kvc::PlanBundle> bundle = kvc::parsePlanBundle(os.str());
  ASSERT_TRUE(bundle) << bundle.status().message();
  ASSERT_EQ(bundle->kernels.size(), 1u);
  const kvc::BundleKernel &kernel = bundle->kernels.front();

  auto device = kvc::testing::PtxDevice::make(kernel);
  ASSERT_TRUE(device) << device.status().message();
  auto onDevice =
      kvc::testing::CaseOnDevice::make(**device, kernel, prepared->kernelCase);
  ASSERT_TRUE(onDevice) << onDevice.status().message();
  kvc::StatusOr<kvc::testing::CacheErrors> errors = (*onDevice)->check();
  ASSERT_TRUE(errors) << errors.status().message();
  EXPECT_TRUE(errors->ok()) << errors->str();
}

// The planner's compositions (kvc-select-codec): raw data in each storage
// type, Hadamard alone, and int8/int4/int2 and FP8 with and without Hadamard, on
// KIVI's default axes and on every other pairing of axes and group sizes.
// Shapes: 37 tokens from token 5 (neither end on a block boundary), groups
// that overhang the chunk, GQA-sized KV (one or two heads) and Llama's 8
// heads, head_dim 64 and 128, blocks of 16 and 32 tokens.
INSTANTIATE_TEST_SUITE_P(
    Codecs, KernelJitTest,
    ::testing::Values(
        JitCase{"raw", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"raw", DType::F16, 37, 2, 2, 64, 16, 5},
        JitCase{"raw", DType::F32, 37, 2, 2, 64, 16, 5},
        JitCase{"raw", DType::BF16, 16, 1, 8, 128, 16, 0},
        JitCase{"hadamard", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"hadamard", DType::F16, 21, 1, 1, 128, 32, 30},
        JitCase{"hadamard", DType::F32, 21, 1, 2, 64, 16, 3},
        JitCase{"int8", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"int4", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"int2", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"int8", DType::BF16, 16, 1, 8, 128, 16, 0},
        JitCase{"int4/k=token/v=channel/g64", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"int2/k=token/v=token/g16", DType::BF16, 37, 2, 1, 128, 32, 7},
        JitCase{"int8/k=channel/v=channel/g8", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"int4/g128", DType::BF16, 3, 1, 1, 128, 16, 14},
        JitCase{"hadamard+int8", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"hadamard+int4", DType::BF16, 37, 2, 1, 128, 16, 5},
        JitCase{"hadamard+int2", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"hadamard+int4/k=token/v=token/g64", DType::BF16, 19, 1, 2,
                64, 16, 9},
        JitCase{"fp8", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"fp8/k=token/v=channel/g16", DType::BF16, 37, 2, 1, 128, 32,
                7},
        JitCase{"hadamard+fp8", DType::BF16, 37, 2, 2, 64, 16, 5}));

// Chunks of one launch (the chunk table's records, blockIdx.y on a GPU):
// three and five chunks over two layer groups, payloads in the reverse
// order of the records, for raw data, KIVI's int4, a per-channel int8 and
// Hadamard with int2, on shapes that start and end mid-block.
INSTANTIATE_TEST_SUITE_P(
    Batched, KernelJitTest,
    ::testing::Values(JitCase{"raw", DType::BF16, 37, 2, 2, 64, 16, 5, 0, 3},
                      JitCase{"int4", DType::BF16, 37, 2, 2, 64, 16, 5, 0, 5},
                      JitCase{"int8/k=channel/v=channel/g8", DType::BF16, 21, 1,
                              1, 128, 32, 30, 0, 3},
                      JitCase{"hadamard+int2", DType::BF16, 16, 1, 2, 64, 16, 0,
                              0, 5}));

// The save side, gathering from the cache and encoding: the same
// compositions and shapes, and per-token groups that span head rows
// (hadamard+int4 g256 over head_dim 64), a per-channel K whose last token
// group is partial beside a per-token V (KIVI's axes, 37 tokens in groups
// of 32) and per-channel groups of a chunk shorter than the group. A
// thread loads a per-channel group of 8 tokens (g8) in one batch and
// encodes what it holds; one of 32, in four batches per scan. Under
// Hadamard a per-token item holds 2 (g32 over head_dim 64), 4 (g32 over
// 128) or 8 (g16 over 128) pieces of its head row.
INSTANTIATE_TEST_SUITE_P(
    Save, KernelJitTest,
    ::testing::Values(
        JitCase{"save:raw", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"save:raw", DType::F16, 37, 2, 2, 64, 16, 5},
        JitCase{"save:raw", DType::F32, 21, 1, 2, 64, 16, 3},
        JitCase{"save:hadamard", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"save:hadamard", DType::F16, 21, 1, 1, 128, 32, 30},
        JitCase{"save:int8", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"save:int4", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"save:int2", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"save:int8", DType::BF16, 16, 1, 8, 128, 16, 0},
        JitCase{"save:int4/k=token/v=channel/g64", DType::BF16, 37, 2, 2, 64,
                16, 5},
        JitCase{"save:int2/k=token/v=token/g16", DType::BF16, 37, 2, 1, 128, 32,
                7},
        JitCase{"save:int8/k=channel/v=channel/g8", DType::BF16, 37, 2, 2, 64,
                16, 5},
        JitCase{"save:int4/g128", DType::BF16, 3, 1, 1, 128, 16, 14},
        JitCase{"save:hadamard+int8", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"save:hadamard+int4", DType::BF16, 37, 2, 1, 128, 16, 5},
        JitCase{"save:hadamard+int2", DType::BF16, 37, 2, 2, 64, 16, 5},
        JitCase{"save:hadamard+int4/k=channel/v=channel/g8", DType::BF16, 37, 2,
                2, 64, 16, 5},
        JitCase{"save:hadamard+int2/g16", DType::BF16, 37, 2, 1, 128, 16, 5},
        JitCase{"save:hadamard+int4/k=token/v=token/g64", DType::BF16, 19, 1, 2,
                64, 16, 9},
        JitCase{"save:hadamard+int4/k=token/v=token/g256", DType::BF16, 19, 1,
                4, 64, 16, 9}));

// kvc-lower-kernels' group-lanes over per-channel groups of 32 tokens: 4
// lanes of 8 tokens, each held in registers (37 tokens: the second group
// partial, lanes past the chunk's end), 2 lanes of 16 scanned twice in
// batches of 8, 32 lanes of one token, and a Hadamard group unsplit.
INSTANTIATE_TEST_SUITE_P(
    SaveGroupLanes, KernelJitTest,
    ::testing::Values(
        JitCase{"save:int4", DType::BF16, 37, 2, 2, 64, 16, 5, 0, 1, 4},
        JitCase{"save:int8", DType::BF16, 16, 1, 8, 128, 16, 0, 0, 1, 2},
        JitCase{"save:int2", DType::BF16, 37, 2, 2, 64, 16, 5, 0, 1, 32},
        JitCase{"save:hadamard+int4", DType::BF16, 37, 2, 2, 64, 16, 5, 0, 1,
                1}));

// kvc-lower-kernels' held-tokens: a Hadamard group over head_dim 128 on 2
// lanes that hold their 16 tokens, transformed once (the second group
// partial), an unrotated group on 2 lanes of 16 held tokens, and 4 lanes
// of 8 tokens over head_dim 64 that hold 4 at most, so scan twice.
INSTANTIATE_TEST_SUITE_P(
    SaveHeldTokens, KernelJitTest,
    ::testing::Values(JitCase{"save:hadamard+int4", DType::BF16, 37, 2, 2, 128,
                              16, 5, 0, 1, 0, 16},
                      JitCase{"save:int8", DType::BF16, 37, 1, 2, 64, 16, 5, 0,
                              1, 2, 16},
                      JitCase{"save:hadamard+int2", DType::BF16, 37, 2, 2, 64,
                              16, 5, 0, 1, 0, 4}));

// The projection's prologue: rows of 4096 (32 lanes of 16 pieces), 2880
// (32 lanes, not all with the same number of pieces), 64 (8 lanes, one
// piece each) and 40 values (4 lanes, one with two pieces), hidden states
// stored as bf16, f16 and f32.
INSTANTIATE_TEST_SUITE_P(
    RmsNorm, KernelJitTest,
    ::testing::Values(JitCase{"rms_norm", DType::BF16, 5, 2, 0, 0, 0, 0, 4096},
                      JitCase{"rms_norm", DType::BF16, 3, 1, 0, 0, 0, 0, 2880},
                      JitCase{"rms_norm", DType::F16, 37, 2, 0, 0, 0, 0, 64},
                      JitCase{"rms_norm", DType::F32, 9, 1, 0, 0, 0, 0, 40}));

// The projection's epilogue: head_dim 8 (stories260K's: a head in one
// piece), 64 and 128, one to eight KV heads, positions past Llama 3's
// original context (scaled frequencies).
INSTANTIATE_TEST_SUITE_P(
    RopeScatter, KernelJitTest,
    ::testing::Values(JitCase{"rope_scatter", DType::F32, 19, 2, 4, 8, 16, 3},
                      JitCase{"rope_scatter", DType::F32, 37, 2, 2, 64, 16, 5},
                      JitCase{"rope_scatter", DType::F32, 16, 1, 8, 128, 16, 0},
                      JitCase{"rope_scatter", DType::F32, 21, 1, 1, 128, 32,
                              9000}));

} // namespace

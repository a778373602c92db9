//===- PtxInterpreterTest.cpp - The PTX interpreter's model ---------------===//
//
// Hand-written PTX for each rule of PtxInterpreter.h: shuffles across a
// warp's lanes, the GPU's rounding, and the faults memcheck and racecheck
// would report. The generated kernels themselves run through it in
// KernelJitTest.
//
//===----------------------------------------------------------------------===//

#include "kvc/Testing/PtxInterpreter.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

using kvc::testing::PtxModule;
using kvc::testing::PtxRegion;

namespace {

/// A module with one entry `k(in, out)` whose body is `body`.
std::string kernel(const std::string &body) {
  return R"(
.version 7.8
.target sm_90
.address_size 64

.visible .entry k(
	.param .u64 k_param_0,
	.param .u64 k_param_1
)
.maxntid 64, 1, 1
{
	.reg .pred 	%p<4>;
	.reg .b16 	%rs<4>;
	.reg .b32 	%r<8>;
	.reg .f32 	%f<8>;
	.reg .b64 	%rd<8>;

	ld.param.u64 	%rd1, [k_param_0];
	ld.param.u64 	%rd2, [k_param_1];
	mov.u32 	%r1, %tid.x;
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd1, %rd3;
	add.s64 	%rd5, %rd2, %rd3;
)" + body +
         R"(
	ret;
}
)";
}

/// Runs `ptx`'s entry over one block of `threads` threads with `in` and
/// `out` (host buffers) as its parameters and memory; what it executed
/// into `stats` where given.
kvc::Status run(const std::string &ptx, uint32_t threads,
                std::vector<uint32_t> &in, std::vector<uint32_t> &out,
                kvc::testing::PtxStats *stats = nullptr) {
  kvc::StatusOr<PtxModule> module = PtxModule::parse(ptx);
  if (!module)
    return module.status();
  uint64_t inAddress = reinterpret_cast<uint64_t>(in.data()),
           outAddress = reinterpret_cast<uint64_t>(out.data());
  void *params[] = {&inAddress, &outAddress};
  kvc::Status status = module->launch(
      "k", {1, 1, 1}, {threads, 1, 1}, params,
      {{inAddress, in.size() * 4}, {outAddress, out.size() * 4}});
  if (stats)
    *stats = module->stats();
  return status;
}

uint32_t bitsOf(float f) {
  uint32_t word;
  std::memcpy(&word, &f, 4);
  return word;
}

// Tests that shfl.sync.bfly exchanges values between the lanes of each warp
// and that a thread runs the f32 arithmetic around it.
TEST(PtxInterpreterTest, ButterflyShufflesExchangeWithinAWarp) {
  std::vector<uint32_t> in(64), out(64, 0);
  for (int i = 0; i < 64; ++i)
    in[i] = bitsOf(float(i * i));
  ASSERT_TRUE(run(kernel(R"(
	ld.global.f32 	%f1, [%rd4];
	shfl.sync.bfly.b32	%f2, %f1, 1, 31, -1;
	shfl.sync.bfly.b32	%f3, %f1, 16, 31, -1;
	add.rn.f32 	%f4, %f2, %f3;
	st.global.f32 	[%rd5], %f4;)"),
                  64, in, out)
                  .isOk());
  for (int i = 0; i < 64; ++i)
    EXPECT_EQ(out[i], bitsOf(float((i ^ 1) * (i ^ 1) + (i ^ 16) * (i ^ 16))))
        << "thread " << i;
}

// Tests what stats() counts over every lane: instructions (a guarded-off
// one too), shuffles, global accesses and their bytes, and the mix by
// opcode, most executed first.
TEST(PtxInterpreterTest, StatsCountWhatEveryLaneExecuted) {
  std::vector<uint32_t> in(64, bitsOf(1.0f)), out(64, 0);
  kvc::testing::PtxStats stats;
  kvc::Status status = run(kernel(R"(
	ld.global.f32 	%f1, [%rd4];
	setp.lt.u32 	%p1, %r1, 32;
	@%p1 add.rn.f32 	%f1, %f1, %f1;
	shfl.sync.bfly.b32	%f2, %f1, 1, 31, -1;
	st.global.f32 	[%rd5], %f2;)"),
                           64, in, out, &stats);
  ASSERT_TRUE(status.isOk()) << status.message();
  EXPECT_EQ(out[0], bitsOf(2.0f));
  EXPECT_EQ(out[32], bitsOf(1.0f));
  // 6 instructions of the prologue, 5 of the body and ret, per thread.
  EXPECT_EQ(stats.instructions, 64u * 12);
  EXPECT_EQ(stats.shuffles, 64u);
  EXPECT_EQ(stats.loads, 64u);
  EXPECT_EQ(stats.loadBytes, 256u);
  EXPECT_EQ(stats.stores, 64u);
  EXPECT_EQ(stats.storeBytes, 256u);
  std::map<std::string, uint64_t> mix(stats.mix.begin(), stats.mix.end());
  EXPECT_EQ(mix.size(), stats.mix.size());
  EXPECT_EQ(mix["add.s64"], 128u);
  EXPECT_EQ(mix["add.rn.f32"], 64u);
  EXPECT_EQ(mix["shfl.sync.bfly.b32"], 64u);
  EXPECT_EQ(mix["ret"], 64u);
  uint64_t total = 0;
  for (size_t i = 0; i < stats.mix.size(); ++i) {
    total += stats.mix[i].second;
    if (i) {
      EXPECT_GE(stats.mix[i - 1].second, stats.mix[i].second);
    }
  }
  EXPECT_EQ(total, stats.instructions);
}

// Tests the GPU's rounding: an FMA rounds once, bf16 conversion rounds to
// nearest even, min ignores a NaN and a NaN result is canonical; an f16x2
// comparison sets one predicate per half; a one-line scope's register is
// its own.
TEST(PtxInterpreterTest, ArithmeticRoundsAsTheGpu) {
  const float a = 1.0f + 0x1p-12f;
  std::vector<uint32_t> in = {bitsOf(a), bitsOf(-1.0f), bitsOf(NAN),
                              bitsOf(1.0f + 0x1p-8f),
                              bitsOf(1.0f + 0x1p-8f + 0x1p-20f)};
  std::vector<uint32_t> out(7, 0);
  ASSERT_TRUE(run(kernel(R"(
	ld.global.f32 	%f1, [%rd1];
	ld.global.f32 	%f2, [%rd1+4];
	ld.global.f32 	%f3, [%rd1+8];
	ld.global.f32 	%f4, [%rd1+12];
	ld.global.f32 	%f5, [%rd1+16];
	fma.rn.f32 	%f6, %f1, %f1, %f2;
	st.global.f32 	[%rd2], %f6;
	mul.rn.f32 	%f6, %f1, %f1;
	add.rn.f32 	%f6, %f6, %f2;
	st.global.f32 	[%rd2+4], %f6;
	min.f32 	%f6, %f3, %f2;
	st.global.f32 	[%rd2+8], %f6;
	add.rn.f32 	%f6, %f3, %f2;
	st.global.f32 	[%rd2+12], %f6;
	cvt.rn.bf16.f32 	%rs1, %f4;
	cvt.rn.bf16.f32 	%rs2, %f5;
	mov.b32 	%r2, {%rs1, %rs2};
	st.global.u32 	[%rd2+16], %r2;
	mov.b32 	%r3, 0x3C004000;
	mov.b32 	%r4, 0x3C003C00;
	setp.le.f16x2 	%p1|%p2, %r3, %r4;
	selp.u32 	%r5, 1, 0, %p1;
	selp.u32 	%r6, 2, 0, %p2;
	or.b32 	%r5, %r5, %r6;
	st.global.u32 	[%rd2+20], %r5;
	{ .reg .b16 tmp; mov.b32 {tmp, %rs3}, %r2; }
	cvt.u32.u16 	%r7, %rs3;
	st.global.u32 	[%rd2+24], %r7;)"),
                  1, in, out)
                  .isOk());
  EXPECT_EQ(out[0], bitsOf(0x1p-11f + 0x1p-24f)); // One rounding.
  EXPECT_EQ(out[1], bitsOf(0x1p-11f));            // Two: the tie went even.
  EXPECT_EQ(out[2], bitsOf(-1.0f));
  EXPECT_EQ(out[3], 0x7FFFFFFFu);
  EXPECT_EQ(out[4], 0x3F813F80u); // 1 + 2^-8 ties to 1.0; just above, up.
  EXPECT_EQ(out[5], 2u);          // f16x2: 2 <= 1 in the low half, 1 <= 1.
  EXPECT_EQ(out[6], 0x3F81u);     // The high half, through a scope.
}

// Tests that accesses outside the launch's memory, or misaligned, are
// faults naming the thread and the line.
TEST(PtxInterpreterTest, OutOfBoundsAndMisalignedAccessesFault) {
  std::vector<uint32_t> in(8), out(8);
  kvc::Status status = run(kernel(R"(
	st.global.u32 	[%rd5], %r1;)"),
                           16, in, out);
  ASSERT_FALSE(status.isOk());
  EXPECT_NE(status.message().find("thread 8 (0, 0), line 25 "
                                  "`st.global.u32 \t[%rd5], %r1`: "
                                  "out-of-bounds store of 4 bytes"),
            std::string::npos)
      << status.message();

  status = run(kernel(R"(
	ld.global.v4.u32 	{%r2, %r3, %r4, %r5}, [%rd1+4];)"),
               1, in, out);
  ASSERT_FALSE(status.isOk());
  EXPECT_NE(status.message().find("misaligned load of 16 bytes"),
            std::string::npos)
      << status.message();
}

// Tests that two threads writing one byte, or one reading what another
// wrote in the same launch, is a race.
TEST(PtxInterpreterTest, RacesBetweenThreadsFault) {
  std::vector<uint32_t> in(8), out(8);
  kvc::Status status = run(kernel(R"(
	st.global.u32 	[%rd2], %r1;)"),
                           2, in, out);
  ASSERT_FALSE(status.isOk());
  EXPECT_NE(status.message().find("write-write race"), std::string::npos)
      << status.message();

  status = run(kernel(R"(
	st.global.u32 	[%rd5], %r1;
	ld.global.u32 	%r2, [%rd2];)"),
               2, in, out);
  ASSERT_FALSE(status.isOk());
  EXPECT_NE(status.message().find("read-after-write race"), std::string::npos)
      << status.message();
}

// Tests that a shuffle some named lanes never reach is a fault (on a GPU, a
// hang or undefined values), as is one whose lanes wait at two different
// shuffles.
TEST(PtxInterpreterTest, ShufflesMustNameLanesThatReachThem) {
  std::vector<uint32_t> in(32), out(32);
  kvc::Status status = run(kernel(R"(
	setp.gt.u32 	%p1, %r1, 15;
	@%p1 bra 	$L__end;
	shfl.sync.bfly.b32	%r2, %r1, 1, 31, -1;
$L__end:)"),
                           32, in, out);
  ASSERT_FALSE(status.isOk());
  EXPECT_NE(status.message().find("lane 16 exited before this shuffle"),
            std::string::npos)
      << status.message();

  status = run(kernel(R"(
	setp.gt.u32 	%p1, %r1, 15;
	@%p1 bra 	$L__other;
	shfl.sync.bfly.b32	%r2, %r1, 1, 31, -1;
	bra.uni 	$L__end;
$L__other:
	shfl.sync.bfly.b32	%r2, %r1, 2, 31, -1;
$L__end:)"),
               32, in, out);
  ASSERT_FALSE(status.isOk());
  EXPECT_NE(status.message().find("wait at different shuffles"),
            std::string::npos)
      << status.message();
}

// Tests that a thread that never ends is reported, not waited for.
TEST(PtxInterpreterTest, AThreadThatNeverEndsFaults) {
  std::vector<uint32_t> in(1), out(1);
  kvc::Status status = run(kernel(R"(
$L__loop:
	bra.uni 	$L__loop;)"),
                           1, in, out);
  ASSERT_FALSE(status.isOk());
  EXPECT_NE(status.message().find("still running after"), std::string::npos)
      << status.message();
}

// Tests that parse() refuses what the interpreter does not model, naming
// the line: an f32 add that ptxas may fuse (no .rn), an atomic, shared
// memory.
TEST(PtxInterpreterTest, InstructionsOutsideTheSubsetAreRefused) {
  for (const char *body :
       {"add.f32 \t%f1, %f2, %f3;", "atom.global.add.u32 \t%r2, [%rd2], 1;",
        ".shared .align 4 .b8 buffer[16];",
        "add.rn.ftz.f32 \t%f1, %f2, %f3;"}) {
    kvc::StatusOr<PtxModule> module = PtxModule::parse(kernel(body));
    ASSERT_FALSE(module) << body;
    EXPECT_NE(module.status().message().find("line 24: unsupported"),
              std::string::npos)
        << module.status().message();
  }
}

} // namespace

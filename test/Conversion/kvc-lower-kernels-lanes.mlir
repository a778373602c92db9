// RUN: kvc-opt %s --split-input-file --verify-diagnostics --kvc-lower-kernels=threads=48
// RUN: kvc-opt %s --split-input-file --kvc-lower-kernels="threads=48 host=true" | FileCheck %s

// Tests that the GPU form of a Hadamard kernel, whose head rows are spread
// over a warp's lanes, is refused for blocks that are not whole warps; the
// host form has no lanes and is generated.
// CHECK: func.func @kvc_restore_raw_bf16_had_host_t64_l1_h2x64_b16(
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @warps(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>) {
  // expected-error @+1 {{cannot be generated: Hadamard across a warp's lanes needs whole warps per block (threads 48)}}
  kvc.kernel "untransform_scatter" (%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>) -> () {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>):
    %u = kvc.untransform %in
        : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    kvc.scatter %u : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  }
  return
}
}

// -----

// Tests that a head row of more than a warp's 32 lanes of 8 values has no
// GPU form: the kernel is left to the runtime.
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 1024, heads = 2, kv_heads = 1, head_dim = 512, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @lanes(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>) {
  // expected-warning @+1 {{kernel "untransform_scatter" has no generated form, so the runtime runs its steps: Hadamard across a warp's lanes needs head_dim <= 256}}
  kvc.kernel "untransform_scatter" (%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>) -> () {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>):
    %u = kvc.untransform %in
        : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    kvc.scatter %u : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  }
  return
}
}

// -----

// Tests that a save kernel's per-token groups wider than a warp's lanes
// hold (512 values) have no GPU form (the kernel is left to the runtime)
// and are generated in the host form, whose items reduce whole groups.
// CHECK: func.func @kvc_save_int8_kt_vt_g512_t16_l1_h8x128_b16(
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 2048, heads = 16, kv_heads = 8, head_dim = 128, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @save_groups() {
  // expected-warning @+1 {{kernel "gather_quant" has no generated form, so the runtime runs its steps: per-token groups across a warp's lanes need a power of two of at most 256 values (groups of 512)}}
  %q = kvc.kernel "gather_quant"() : () -> !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device, codec <quant = int8, group = 512, key_axis = token>> {
    %g = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device>
    %r = kvc.quant %g
      : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device, codec <quant = int8, group = 512, key_axis = token>>
    kvc.yield %r : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device, codec <quant = int8, group = 512, key_axis = token>>
  }
  return
}
}

// -----

// Tests that a projection's RMSNorm prologue, whose rows span a warp's
// lanes, is refused in the GPU form for blocks that are not whole warps,
// and generated in the host form (a row per thread).
// CHECK: func.func @kvc_rms_norm_bf16_host_t16_l1_d256(
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @prologue(%h: !kvc.chunk<hidden x bf16, tokens 0 to 16, layers 0 to 1, device>) {
  // expected-error @+1 {{cannot be generated: RMSNorm across a warp's lanes needs whole warps per block (threads 48)}}
  kvc.kernel "project_scatter" (%h) : (!kvc.chunk<hidden x bf16, tokens 0 to 16, layers 0 to 1, device>) -> () {
  ^bb0(%in: !kvc.chunk<hidden x bf16, tokens 0 to 16, layers 0 to 1, device>):
    %p = kvc.project %in
        : !kvc.chunk<hidden x bf16, tokens 0 to 16, layers 0 to 1, device>
        -> !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device>
    kvc.scatter %p : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device>
  }
  return
}
}

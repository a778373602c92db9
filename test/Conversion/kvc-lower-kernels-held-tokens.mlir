// RUN: kvc-opt %s --kvc-lower-kernels=held-tokens=16 | FileCheck %s
// RUN: kvc-opt %s --kvc-lower-kernels | FileCheck %s --check-prefix=DEFAULT
// RUN: kvc-opt %s --kvc-lower-kernels="held-tokens=16 host=true" | FileCheck %s --check-prefix=HOST
// RUN: not kvc-opt %s --kvc-lower-kernels=held-tokens=17 2>&1 | FileCheck %s --check-prefix=SEVENTEEN
// RUN: not kvc-opt %s --kvc-lower-kernels=held-tokens=0 2>&1 | FileCheck %s --check-prefix=ZERO

// Tests that held-tokens=16 lets a Hadamard save over head_dim 128, whose
// per-channel groups of 32 tokens lie on 2 lanes of 16 (a head row takes
// 16 lanes), load each lane's 16 tokens once (16 loads of 16 bytes, no
// scf.for), transform them once and hold them for the encoding, where by
// default the lane scans its part twice in loops of 8 tokens. The name and
// the spec say so; the host form, whose items hold whole groups, ignores
// it; a lane holds 1 to 16 tokens.
// CHECK:       kvc.kernel "gather_transform_quant"(){{.*}} attributes {kvc.entry = @[[S:kvc_save_int4_kc_vt_g32_had_ht16_t64_l1_h2x128_b16]]}
// CHECK:       func.func @[[S]](
// CHECK-SAME:    held_tokens = 16 : i64
// CHECK:         } else {
// CHECK-NOT:       scf.for
// CHECK-COUNT-16:  memref.load %view{{.*}} : memref<?xvector<4xi32>>
// CHECK-NOT:       memref.load %view{{.*}} : memref<?xvector<4xi32>>
// CHECK-NOT:       scf.for
// CHECK:         return
// DEFAULT:       func.func @kvc_save_int4_kc_vt_g32_had_t64_l1_h2x128_b16(
// DEFAULT-NOT:     held_tokens
// DEFAULT:         } else {
// DEFAULT-COUNT-2:   scf.for
// DEFAULT:         return
// HOST:          kvc.entry = @kvc_save_int4_kc_vt_g32_had_host_t64_l1_h2x128_b16
// SEVENTEEN: error: 'kvc.kernel' op cannot be generated: held-tokens 17 is not between 1 and 16 (a lane holds at most 128 values)
// ZERO: error: 'kvc.kernel' op cannot be generated: held-tokens 0 is not between 1 and 16 (a lane holds at most 128 values)
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 512, heads = 4, kv_heads = 2, head_dim = 128, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @save_had() {
  %q = kvc.kernel "gather_transform_quant"() : () -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard, quant = int4>> {
    %g = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    %t = kvc.transform %g
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>
    %r = kvc.quant %t
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard, quant = int4>>
    kvc.yield %r : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard, quant = int4>>
  }
  return
}
}

// RUN: kvc-opt %s --split-input-file --verify-diagnostics --kvc-lower-kernels=group-lanes=4 | FileCheck %s
// RUN: kvc-opt %s --split-input-file --kvc-lower-kernels="group-lanes=4 host=true" | FileCheck %s --check-prefix=HOST
// RUN: not kvc-opt %s --split-input-file --kvc-lower-kernels=group-lanes=3 2>&1 | FileCheck %s --check-prefix=THREE

// Tests that group-lanes splits an unrotated save's per-channel groups of
// 32 tokens among 4 lanes of 8 tokens, which each load their 8 tokens once
// (8 loads of 16 bytes, no scf.for), hold them for the encoding and combine
// their extremes with gpu.shuffle xor 1 and 2; the name and the spec say
// so, V's per-token groups and the restore kernel beside it are as without
// the option. The host form, whose items hold whole groups, ignores it.
// CHECK-LABEL: func.func @save
// CHECK:         kvc.kernel "gather_quant"(){{.*}} attributes {kvc.entry = @[[S:kvc_save_int4_kc_vt_g32_gl4_t64_l1_h2x64_b16]]}
// CHECK-LABEL: func.func @restore
// CHECK:         kvc.kernel "dequant_scatter"(%{{.+}}){{.*}} attributes {kvc.entry = @kvc_restore_int4_kc_vt_g32_t64_l1_h2x64_b16}
// CHECK:       func.func @[[S]](
// CHECK-SAME:    group_lanes = 4 : i64
// CHECK-SAME:    kind = "save"
// CHECK:             } else {
// CHECK-NOT:           scf.for
// CHECK-COUNT-8:       memref.view %{{.+}} to memref<?xvector<4xi32>>
// CHECK-NOT:           scf.for
// CHECK:               gpu.shuffle  xor %{{.+}}, %c1_i32
// CHECK:               gpu.shuffle  xor %{{.+}}, %c2_i32
// CHECK-NOT:           gpu.shuffle  xor %{{.+}}, %c4_i32
// CHECK-NOT:           scf.for
// CHECK:               return
// HOST-LABEL: func.func @save
// HOST:         kvc.entry = @kvc_save_int4_kc_vt_g32_t64_l1_h2x64_b16
// THREE: error: 'kvc.kernel' op cannot be generated: per-channel groups of 32 tokens split among 3 lanes need a power of two dividing the group, at most 32 lanes a group here, and whole warps per block
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @save() {
  %q = kvc.kernel "gather_quant"() : () -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>> {
    %g = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    %r = kvc.quant %g
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>
    kvc.yield %r : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>
  }
  return
}
func.func @restore(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>) {
  kvc.kernel "dequant_scatter"(%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>) -> () {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>):
    %d = kvc.dequant %in
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    kvc.scatter %d : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  }
  return
}
}

// -----

// Tests that a Hadamard save's lanes, a head row's 16 times the group's,
// must stay within a warp.
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 512, heads = 4, kv_heads = 2, head_dim = 128, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @save_had() {
  // expected-error @+1 {{cannot be generated: per-channel groups of 32 tokens split among 4 lanes need a power of two dividing the group, at most 2 lanes a group here, and whole warps per block}}
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

// RUN: kvc-opt %s --kvc-lower-kernels=scan-loads=4 | FileCheck %s
// RUN: kvc-opt %s --kvc-lower-kernels | FileCheck %s --check-prefix=DEFAULT
// RUN: not kvc-opt %s --kvc-lower-kernels=scan-loads=9 2>&1 | FileCheck %s --check-prefix=NINE

// Tests that scan-loads=4 has an unrotated per-channel save lane, whose
// groups of 32 tokens it scans twice (extremes, then values), issue 4
// tokens' loads of 16 bytes at a time in each scan where by default it
// issues 8 (a GPU lane then holds half as many widened values: 50-58
// registers against 75-80 for the benchmark's kernels, docs/kernels.md);
// the name and the spec say so; the loads are 1 to 8.
// CHECK:       kvc.entry = @[[S:kvc_save_int4_kc_vt_g32_sl4_t64_l1_h2x128_b16]]
// CHECK:       func.func @[[S]](
// CHECK-SAME:    scan_loads = 4 : i64
// CHECK:         } else {
// CHECK:           scf.for {{.*}} = %c0 to %c32 step %c4 iter_args
// CHECK-COUNT-4:     memref.load %view{{[_0-9]*}}[%{{[0-9]+}}] : memref<?xvector<4xi32>>
// CHECK-NOT:         memref.load
// CHECK:           scf.yield
// CHECK:           scf.for {{.*}} = %c0 to %c32 step %c4 {
// CHECK-COUNT-4:     memref.load %view{{[_0-9]*}}[%{{[0-9]+}}] : memref<?xvector<4xi32>>
// CHECK-NOT:         memref.load
// CHECK:         return
// DEFAULT:       func.func @kvc_save_int4_kc_vt_g32_t64_l1_h2x128_b16(
// DEFAULT-NOT:     scan_loads
// DEFAULT:         } else {
// DEFAULT:           scf.for {{.*}} = %c0 to %c32 step %c8 iter_args
// DEFAULT-COUNT-8:     memref.load %view{{[_0-9]*}}[%{{[0-9]+}}] : memref<?xvector<4xi32>>
// DEFAULT-NOT:         memref.load
// DEFAULT:           scf.yield
// NINE: error: 'kvc.kernel' op cannot be generated: scan-loads 9 is not between 1 and 8
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 512, heads = 4, kv_heads = 2, head_dim = 128, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @save_int4() {
  %q = kvc.kernel "gather_quant"() : () -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>> {
    %g = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    %r = kvc.quant %g
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>
    kvc.yield %r : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>
  }
  return
}
}

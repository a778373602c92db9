// RUN: kvc-opt %s --kvc-lower-kernels | FileCheck %s
// RUN: kvc-opt %s --kvc-lower-kernels=restore-items=8 | FileCheck %s --check-prefix=EIGHT
// RUN: kvc-opt %s --kvc-lower-kernels="restore-items=8 host=true" | FileCheck %s --check-prefix=HOST
// RUN: not kvc-opt %s --kvc-lower-kernels=restore-items=3 2>&1 | FileCheck %s --check-prefix=THREE

// Tests that a GPU-form int2 restore thread computes 4 items by default
// (their 2-byte packed loads, one per item of K and of V, and their 16-byte
// stores), as int4's does, where its packed values would fill 16 bytes at 8
// items; restore-items=8 gives it those 8, and the name and the spec say
// so. An int8 restore, 2 items a thread either way, is the same kernel
// under both (no _ri8_); the host form ignores the option; the items are
// 1, 2, 4 or 8.
// CHECK:         kvc.entry = @[[INT2:kvc_restore_int2_kc_vt_g32_t64_l1_h2x128_b16]]
// CHECK:         kvc.entry = @kvc_restore_int8_kc_vt_g32_t64_l1_h2x128_b16
// CHECK:       func.func @[[INT2]](
// CHECK-NOT:     restore_items
// CHECK-COUNT-8: memref.load %view{{[_0-9]*}}[%{{[0-9]+}}] : memref<?xi16>
// CHECK-NOT:     memref.load %view{{[_0-9]*}}[%{{[0-9]+}}] : memref<?xi16>
// CHECK:         return
// EIGHT:          kvc.entry = @[[INT2:kvc_restore_int2_kc_vt_g32_ri8_t64_l1_h2x128_b16]]
// EIGHT:          kvc.entry = @kvc_restore_int8_kc_vt_g32_t64_l1_h2x128_b16
// EIGHT:        func.func @[[INT2]](
// EIGHT-SAME:     restore_items = 8 : i64
// EIGHT-COUNT-16: memref.load %view{{[_0-9]*}}[%{{[0-9]+}}] : memref<?xi16>
// EIGHT-NOT:      memref.load %view{{[_0-9]*}}[%{{[0-9]+}}] : memref<?xi16>
// EIGHT:          return
// HOST:         kvc.entry = @kvc_restore_int2_kc_vt_g32_t64_l1_h2x128_b16
// THREE: error: 'kvc.kernel' op cannot be generated: restore-items 3 is not 1, 2, 4 or 8
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 512, heads = 4, kv_heads = 2, head_dim = 128, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @restore_int2(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int2>>) {
  kvc.kernel "restore"(%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int2>>) -> () {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int2>>):
    %d = kvc.dequant %in : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int2>> -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    kvc.scatter %d : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  }
  return
}
func.func @restore_int8(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>) {
  kvc.kernel "restore"(%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>) -> () {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>):
    %d = kvc.dequant %in : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>> -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    kvc.scatter %d : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  }
  return
}
}

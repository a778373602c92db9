// RUN: kvc-opt %s --split-input-file --verify-diagnostics --kvc-lower-kernels | FileCheck %s
// RUN: kvc-opt %s --split-input-file --verify-diagnostics --kvc-lower-kernels=host=true | FileCheck %s --check-prefix=HOST

// Tests that a dequant -> scatter kernel becomes a function specialized for
// its chunk (int4, K per channel and V per token, 64 tokens, 1 layer, 2 KV
// heads of 64): 64 * (128 / 8) work items per matrix, 4 per thread, so one
// block of 256 threads for V and one for K, each running its own matrix's
// code: all 4 items loaded and decoded (4-byte packed loads; K's scales and
// minimums in 16-byte loads) before the 4 guarded 16-byte stores. The grid
// runs once per record of the chunk table (3 values each), whose record
// gives the chunk's payload offset, first token and first layer.
// CHECK-LABEL: func.func @f
// CHECK:         kvc.kernel "dequant_scatter"{{.*}} attributes {kvc.entry = @[[K:kvc_restore_int4_kc_vt_g32_t64_l1_h2x64_b16]]}
// CHECK:       func.func @[[K]](%[[PAYLOAD:.+]]: memref<?xi8>, %[[KEYS:.+]]: memref<?xi8>, %[[VALUES:.+]]: memref<?xi8>, %{{.+}}: memref<?xi32>, %[[CHUNKS:.+]]: memref<?xi64>, %{{.+}}: index)
// CHECK-SAME:    attributes {kvc.entry = {block_size = 16 : i64, codec = #kvc.codec<quant = int4>, head_dim = 64 : i64, kind = "restore", kv_heads = 2 : i64, layers = 1 : i64, storage = bf16, threads = 256 : i64, tokens = 64 : i64}}
// CHECK:         %[[RECORDS:.+]] = memref.dim %[[CHUNKS]], %c0
// CHECK:         %[[N:.+]] = arith.divui %[[RECORDS]], %c3
// CHECK:         scf.parallel (%[[B:.+]], %[[C:.+]]) = (%c0, %c0) to (%c2, %[[N]]) step (%c1, %c1)
// CHECK:           scf.parallel (%[[T:.+]]) = (%c0) to (%c256) step (%c1)
// CHECK:             %[[RECORD:.+]] = arith.muli %[[C]], %c3
// CHECK:             memref.load %[[CHUNKS]][%[[RECORD]]]
// CHECK:             %[[IS_V:.+]] = arith.cmpi ne
// CHECK:             scf.if %[[IS_V]] {
// CHECK:               arith.minui %[[T]], %c1023
// CHECK-COUNT-3:       arith.minui %{{.+}}, %c1023
// CHECK:               memref.view %[[PAYLOAD]]{{.+}} to memref<?xi32>
// CHECK-COUNT-4:       arith.shrui {{.+}} : vector<8xi32>
// CHECK-NOT:           memref.store
// CHECK:               arith.cmpi ult, %[[T]], %c1024
// CHECK:               memref.view %[[VALUES]]
// CHECK-COUNT-4:       memref.store {{.+}} : memref<?xvector<4xi32>>
// CHECK:             } else {
// CHECK:               memref.view %[[PAYLOAD]]{{.+}} to memref<?xvector<4xi32>>
// CHECK:               memref.view %[[KEYS]]
// CHECK-COUNT-4:       memref.store {{.+}} : memref<?xvector<4xi32>>
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>) {
  kvc.kernel "dequant_scatter" (%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>) -> () {
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

// Tests that a project -> scatter kernel becomes the projection's epilogue:
// the function reads the GEMM's f32 K and V (32 bytes per item) and the RoPE
// table (its last argument), rotates K's pieces by their half of the head
// (channel +- 32) and stores bf16 into the cache; V's items only round. Its
// prologue normalizes the 128 rows of hidden states (256 values each) over
// 32 lanes of 8 values (8 rows per block of 256 threads): a loop that sums
// squares, a lane's total, 5 shuffle-and-add stages, 1 / sqrt(mean + eps),
// and a loop that scales, weights, rounds and stores.
// CHECK-LABEL: func.func @project
// CHECK:         kvc.kernel "project_scatter"{{.*}} attributes {kvc.entry = @[[E:kvc_rope_scatter_t64_l2_h2x64_b16]], kvc.prologue = @[[N:kvc_rms_norm_bf16_t64_l2_d256]]}
// CHECK:       func.func @[[E]](%[[PROJ:.+]]: memref<?xi8>, %{{.+}}: memref<?xi8>, %{{.+}}: memref<?xi8>, %{{.+}}: memref<?xi32>, %{{.+}}: memref<?xi64>, %{{.+}}: index, %[[ROPE:.+]]: memref<?xi8>)
// CHECK-SAME:    attributes {kvc.entry = {block_size = 16 : i64, head_dim = 64 : i64, kind = "rope_scatter", kv_heads = 2 : i64, layers = 2 : i64, storage = f32, threads = 256 : i64, tokens = 64 : i64}}
// CHECK:             scf.if
// CHECK:               memref.view %[[PROJ]]{{.+}} to memref<?xvector<4xi32>>
// CHECK:               memref.store {{.+}} : memref<?xvector<4xi32>>
// CHECK:             } else {
// CHECK:               %[[IN_HEAD:.+]] = arith.remui %{{.+}}, %c64
// CHECK:               %[[FIRST:.+]] = arith.cmpi ult, %[[IN_HEAD]], %c32
// CHECK:               arith.select %[[FIRST]], %{{.+}}, %{{.+}} : index
// CHECK:               memref.view %[[ROPE]]{{.+}} to memref<?xvector<4xi32>>
// CHECK:               memref.view %[[ROPE]]{{.+}} to memref<?xvector<4xi32>>
// CHECK:               %[[OWN_COS:.+]] = arith.mulf %{{.+}}, %{{.+}} : vector<8xf32>
// CHECK:               %[[PARTNER_SIN:.+]] = arith.mulf %{{.+}}, %{{.+}} : vector<8xf32>
// CHECK:               %[[SUB:.+]] = arith.subf %[[OWN_COS]], %[[PARTNER_SIN]]
// CHECK:               %[[ADD:.+]] = arith.addf %[[OWN_COS]], %[[PARTNER_SIN]]
// CHECK:               arith.select %[[FIRST]], %[[SUB]], %[[ADD]] : vector<8xf32>
// CHECK:               memref.store {{.+}} : memref<?xvector<4xi32>>
// CHECK:       func.func @[[N]](%[[HIDDEN:.+]]: memref<?xi8>, %[[WEIGHTS:.+]]: memref<?xi8>, %[[NORMED:.+]]: memref<?xi8>, %[[FIRST_LAYER:.+]]: index)
// CHECK-SAME:    eps = 1.000000e-05 : f64, {{.*}}hidden = 256 : i64, kind = "rms_norm"
// CHECK:         scf.parallel (%{{.+}}) = (%c0) to (%c16) step (%c1)
// CHECK:           scf.parallel (%[[T:.+]]) = (%c0) to (%c256) step (%c1)
// CHECK:             %[[LANE:.+]] = arith.remui %[[T]], %c32
// CHECK:             scf.for {{.+}} iter_args({{.+}}) -> (vector<8xf32>)
// CHECK:               memref.view %[[HIDDEN]]
// CHECK:               arith.mulf {{.+}} : vector<8xf32>
// CHECK:               arith.addf {{.+}} : vector<8xf32>
// CHECK-COUNT-5:     gpu.shuffle  xor
// CHECK:             llvm.inline_asm "sqrt.rn.f32 $0, $1;"
// CHECK:             scf.for
// CHECK:               memref.view %[[WEIGHTS]]
// CHECK:               arith.truncf {{.+}} : vector<8xf32> to vector<8xbf16>
// CHECK:               scf.if
// CHECK:                 memref.view %[[NORMED]]
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @project(%h: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>) {
  kvc.kernel "project_scatter" (%h) : (!kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>) -> () {
  ^bb0(%in: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>):
    %p = kvc.project %in
        : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
    kvc.scatter %p : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  }
  return
}
}

// -----

// Tests the two forms of a Hadamard restore (int4, head_dim 64). In the GPU
// form a thread holds 4 pieces of one head row, 2 pieces apart (thread u:
// row u / 2, clamped to the last of 128 rows; pieces u % 2 + 2 * s), and
// the row's other 4 pieces are the next lane's: each piece dequantizes by
// an FMA; the butterflies of stages 1, 2 and 4 run within the pieces, that
// of stage 8 across the two lanes (gpu.shuffle xor 1 of all 32 values, then
// an FMA by +-1), those of stages 16 and 32 across the thread's pieces;
// then bf16 by truncf, and the stores follow the 4th piece. In the host
// form (host=true) a thread holds a whole head row, its 8 pieces, and
// rounds in integers; kvc-kernels-to-llvm lowers only that one.
// CHECK-LABEL: func.func @hadamard
// CHECK:       func.func @kvc_restore_int4_kc_vt_g32_had_t64_l1_h2x64_b16(
// CHECK:         scf.parallel (%{{.+}}, %{{.+}}) = (%c0, %c0) to (%c2, %{{.+}}) step (%c1, %c1)
// CHECK:         scf.parallel (%[[T:.+]]) = (%c0) to (%c256) step (%c1)
// CHECK:           %[[ROW:.+]] = arith.divui %[[T]], %c2 : index
// CHECK:           arith.minui %[[ROW]], %c127 : index
// CHECK:           %[[PIECE:.+]] = arith.remui %[[T]], %c2 : index
// CHECK:           arith.addi %[[PIECE]], %c2 : index
// CHECK:           arith.addi %[[PIECE]], %c4 : index
// CHECK:           arith.addi %[[PIECE]], %c6 : index
// CHECK-COUNT-4:   vector.fma {{.+}} : vector<8xf32>
// CHECK-COUNT-3:   arith.subf {{.+}} : vector<16xf32>
// CHECK:           %[[SIGN:.+]] = vector.broadcast {{.+}} : f32 to vector<32xf32>
// CHECK:           %[[D1:.+]] = arith.constant 1 : i32
// CHECK-COUNT-32:  gpu.shuffle  xor %{{.+}}, %[[D1]], %{{.+}} : f32
// CHECK-NOT:       gpu.shuffle
// CHECK:           vector.fma %[[SIGN]], %{{.+}}, %{{.+}} : vector<32xf32>
// CHECK-NOT:       gpu.shuffle
// CHECK-COUNT-2:   arith.subf {{.+}} : vector<16xf32>
// CHECK-NOT:       gpu.shuffle
// CHECK:           arith.truncf {{.+}} : vector<8xf32> to vector<8xbf16>
// CHECK-NOT:       memref.store
// CHECK-COUNT-3:   arith.truncf
// CHECK:           memref.store
// HOST-LABEL:  func.func @hadamard
// HOST:        func.func @kvc_restore_int4_kc_vt_g32_had_host_t64_l1_h2x64_b16(
// HOST-SAME:     host
// HOST:          scf.parallel (%{{.+}}, %{{.+}}) = (%c0, %c0) to (%c2, %{{.+}}) step (%c1, %c1)
// HOST:          %[[HROW:.+]] = arith.minui %{{.+}}, %c127 : index
// HOST:          %[[HFIRST:.+]] = arith.muli %[[HROW]], %c8 : index
// HOST-COUNT-7:  arith.addi %[[HFIRST]], %c{{[1-7]}} : index
// HOST-NOT:      gpu.shuffle
// HOST:          arith.subf {{.+}} : vector<32xf32>
// HOST-NOT:      arith.truncf
// HOST:          arith.shrui {{.+}} : vector<8xi32>
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @hadamard(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard, quant = int4>>) {
  kvc.kernel "dequant_untransform_scatter" (%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard, quant = int4>>) -> () {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard, quant = int4>>):
    %d = kvc.dequant %in
        : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard, quant = int4>>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>
    %u = kvc.untransform %d
        : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    kvc.scatter %u : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  }
  return
}
}

// -----

// Tests that FP8 and int8 kernels of one shape have distinct symbols (the
// quantization's registry name, not its width): codes of one width decode
// differently, and a bundle holding both must launch each its own.
// CHECK-LABEL: func.func @int8_and_fp8
// CHECK:       kvc.kernel "restore"{{.+}}kvc.entry = @[[INT8:kvc_restore_int8_kc_vt_g32_t64_l1_h2x64_b16]]}
// CHECK:       kvc.kernel "restore"{{.+}}kvc.entry = @[[FP8:kvc_restore_fp8_kc_vt_g32_t64_l1_h2x64_b16]]}
// CHECK-DAG:   func.func @[[INT8]](
// CHECK-DAG:   func.func @[[FP8]](
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @int8_and_fp8(%a: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>, %b: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = fp8>>) {
  kvc.kernel "restore" (%a) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>) -> () {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>):
    %d = kvc.dequant %in
        : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    kvc.scatter %d : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  }
  kvc.kernel "restore" (%b) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = fp8>>) -> () {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = fp8>>):
    %d = kvc.dequant %in
        : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = fp8>>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    kvc.scatter %d : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  }
  return
}
}

// -----

// Tests that a gather -> quant kernel becomes a save kernel with the
// restore's ABI, its payload written: int4 with K per channel and V per
// token in groups of 32 (64 tokens, 2 KV heads of 64). V has 64 * 16 items,
// 4 blocks' worth; K's items are 16-channel-piece columns of 32-token groups,
// 2 * 16 = 32 of them, so K's blocks past the first skip their work. A V
// item reduces its 8 values, then across the 4 lanes of its group
// (gpu.shuffle xor 1 and 2), and the group's first lane stores the scale and
// minimum; a K item scans its group's 32 tokens for the extremes of its 8
// channels, stores their 8 parameter pairs, then scans again to quantize,
// each scan loading 8 tokens' pieces before it uses any.
// In the host form a V item is a whole group of 32 values.
// CHECK-LABEL: func.func @save
// CHECK:         kvc.kernel "gather_quant"(){{.*}} attributes {kvc.entry = @[[S:kvc_save_int4_kc_vt_g32_t64_l1_h2x64_b16]]}
// CHECK:       func.func @[[S]](%[[PAYLOAD:.+]]: memref<?xi8>, %[[KEYS:.+]]: memref<?xi8>, %[[VALUES:.+]]: memref<?xi8>, %{{.+}}: memref<?xi32>, %{{.+}}: memref<?xi64>, %{{.+}}: index)
// CHECK-SAME:    kind = "save"
// CHECK:         scf.parallel (%[[B:.+]], %{{.+}}) = (%c0, %c0) to (%c8, %{{.+}}) step (%c1, %c1)
// CHECK:           scf.parallel (%[[T:.+]]) = (%c0) to (%c256) step (%c1)
// CHECK:             scf.if
// CHECK:               memref.view %[[VALUES]]{{.+}} to memref<?xvector<4xi32>>
// CHECK:               arith.extf {{.+}} : vector<8xbf16> to vector<8xf32>
// CHECK:               arith.minnumf {{.+}} : vector<1xf32>
// CHECK:               gpu.shuffle  xor %{{.+}}, %c1_i32
// CHECK:               gpu.shuffle  xor %{{.+}}, %c2_i32
// CHECK:               arith.truncf {{.+}} : vector<1xf32> to vector<1xf16>
// CHECK:               arith.divf
// CHECK:               scf.if
// CHECK:                 memref.store {{.+}} : memref<?xi32>
// CHECK:                 arith.cmpi eq
// CHECK:                 scf.if
// CHECK:                   memref.store {{.+}} : memref<?xi32>
// CHECK:             } else {
// CHECK:               %[[WORK:.+]] = arith.cmpi ult, %{{.+}}, %c32
// CHECK:               scf.if %[[WORK]] {
// CHECK:                 %{{.+}}:2 = scf.for %{{.+}} = %c0 to %c32 step %c8 iter_args({{.+}}) -> (vector<8xf32>, vector<8xf32>)
// CHECK-NOT:               arith.minnumf
// CHECK:                   memref.view %[[KEYS]]
// CHECK:                   memref.load
// CHECK-NOT:               arith.minnumf
// CHECK:                   memref.view %[[KEYS]]
// CHECK:                   memref.load
// CHECK-NOT:               arith.minnumf
// CHECK:                   memref.view %[[KEYS]]
// CHECK:                   memref.load
// CHECK-NOT:               arith.minnumf
// CHECK:                   memref.view %[[KEYS]]
// CHECK:                   memref.load
// CHECK-NOT:               arith.minnumf
// CHECK:                   memref.view %[[KEYS]]
// CHECK:                   memref.load
// CHECK-NOT:               arith.minnumf
// CHECK:                   memref.view %[[KEYS]]
// CHECK:                   memref.load
// CHECK-NOT:               arith.minnumf
// CHECK:                   memref.view %[[KEYS]]
// CHECK:                   memref.load
// CHECK-NOT:               arith.minnumf
// CHECK:                   memref.view %[[KEYS]]
// CHECK:                   memref.load
// CHECK-COUNT-8:           arith.minnumf
// CHECK:                   scf.yield
// CHECK:                 arith.truncf {{.+}} : vector<8xf32> to vector<8xf16>
// CHECK:                 scf.if
// CHECK-COUNT-2:           memref.store {{.+}} : memref<?xvector<4xi32>>
// CHECK:                 scf.for %{{.+}} = %c0 to %c32 step %c8 {
// CHECK-NOT:               memref.store
// CHECK-COUNT-8:           memref.view %[[KEYS]]
// CHECK:                   arith.cmpi ult, %{{.+}}, %c64
// CHECK:                   scf.if
// CHECK:                     memref.store {{.+}} : memref<?xi32>
// HOST-LABEL:  func.func @kvc_save_int4_kc_vt_g32_t64_l1_h2x64_b16(
// HOST-NOT:      gpu.shuffle
// HOST:          arith.extf {{.+}} : vector<32xbf16> to vector<32xf32>
// HOST:          return
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @save() {
  %q = kvc.kernel "gather_quant"() : () -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>> {
    %g = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    %r = kvc.quant %g
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>
    kvc.yield %r : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>
  }
  %h = kvc.transfer_to_host %q
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int4>>
  return
}
}

// -----

// Tests that a save item of per-token groups under Hadamard holds several
// pieces of one head row, as a Hadamard restore's thread does: with int4
// over head_dim 64, V's item holds 2 pieces (min(16 / 4, 64 / 32)) 32
// values apart, so the row's 4 lanes exchange values in 2 butterfly stages
// (gpu.shuffle xor 1 and 2, 16 values each) and the last stage runs within
// the thread; each piece's group of 32 values lies on 4 aligned lanes,
// which combine their extremes (xor 1 and 2); each piece's packed values,
// and from its group's first lane its parameters, are stored apart.
// CHECK-LABEL: func.func @save_had
// CHECK:       func.func @kvc_save_int4_kc_vt_g32_had_t64_l1_h2x64_b16(
// CHECK:         scf.if
// CHECK-COUNT-2:   arith.extf {{.+}} : vector<8xbf16> to vector<8xf32>
// CHECK-COUNT-16:  gpu.shuffle  xor %{{.+}}, %c1_i32,
// CHECK-COUNT-16:  gpu.shuffle  xor %{{.+}}, %c2_i32,
// CHECK-NOT:       gpu.shuffle  xor %{{.+}}, %c4_i32,
// CHECK:           arith.minnumf {{.+}} : vector<2xf32>
// CHECK:           gpu.shuffle  xor %{{.+}}, %c1_i32
// CHECK:           gpu.shuffle  xor %{{.+}}, %c2_i32
// CHECK:           scf.if
// CHECK:             memref.store {{.+}} : memref<?xi32>
// CHECK:             scf.if
// CHECK:               memref.store {{.+}} : memref<?xi32>
// CHECK:             memref.store {{.+}} : memref<?xi32>
// CHECK:             scf.if
// CHECK:               memref.store {{.+}} : memref<?xi32>
// CHECK:         } else {
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
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
  %h = kvc.transfer_to_host %q
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard, quant = int4>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <transform = hadamard, quant = int4>>
  return
}
}

// -----

// Tests that a kernel whose chain has no generated form (dequant ->
// untransform, its result used outside) is left alone.
// CHECK-LABEL: func.func @partial
// CHECK:         kvc.kernel "dequant_untransform"
// CHECK-NOT:     kvc.entry
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @partial(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard, quant = int8>>) {
  %u = kvc.kernel "dequant_untransform" (%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard, quant = int8>>) -> (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>) {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard, quant = int8>>):
    %d = kvc.dequant %in
        : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard, quant = int8>>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>
    %v = kvc.untransform %d
        : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    kvc.yield %v : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  }
  kvc.scatter %u : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  return
}
}

// -----

// Tests that a save chain of hidden states is left for the runtime: they
// are the prefill's activations, not rows of the paged cache.
// CHECK-LABEL: func.func @save_hidden
// CHECK:         kvc.kernel "gather_quant"
// CHECK-NOT:     kvc.entry
// CHECK:         return
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @save_hidden() {
  %q = kvc.kernel "gather_quant"() : () -> !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>> {
    %g = kvc.gather : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device>
    %r = kvc.quant %g
      : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device>
      -> !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>
    kvc.yield %r : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>
  }
  return
}
}

// -----

// Tests that per-token groups the 8-value work items would straddle are
// diagnosed on the kernel, which is left to the runtime (no kvc.entry).
// CHECK-LABEL: func.func @group
// CHECK:         kvc.kernel "dequant_scatter"
// CHECK-NOT:     kvc.entry
// CHECK:         return
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @group(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4, group = 4>>) {
  // expected-warning @+1 {{kernel "dequant_scatter" has no generated form, so the runtime runs its steps: per-token groups of 4 values are not a multiple of 8}}
  kvc.kernel "dequant_scatter" (%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4, group = 4>>) -> () {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4, group = 4>>):
    %d = kvc.dequant %in
        : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4, group = 4>>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    kvc.scatter %d : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  }
  return
}
}

// -----

// Tests that a head_dim whose halves the 8-value RoPE pieces would straddle
// is diagnosed once, on the first of the kernels it leaves to the runtime.
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 192, heads = 8, kv_heads = 4, head_dim = 24, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @odd_head(%h: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>,
                    %h2: !kvc.chunk<hidden x bf16, tokens 64 to 128, layers 0 to 2, device>) {
  // expected-warning @+1 {{kernel "project_scatter" (and 1 more like it) has no generated form, so the runtime runs its steps: RoPE over head_dim 24 needs 8 or a multiple of 16}}
  kvc.kernel "project_scatter" (%h) : (!kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>) -> () {
  ^bb0(%in: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>):
    %p = kvc.project %in
        : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
    kvc.scatter %p : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  }
  kvc.kernel "project_scatter" (%h2) : (!kvc.chunk<hidden x bf16, tokens 64 to 128, layers 0 to 2, device>) -> () {
  ^bb0(%in: !kvc.chunk<hidden x bf16, tokens 64 to 128, layers 0 to 2, device>):
    %p = kvc.project %in
        : !kvc.chunk<hidden x bf16, tokens 64 to 128, layers 0 to 2, device>
        -> !kvc.chunk<kv x bf16, tokens 64 to 128, layers 0 to 2, device>
    kvc.scatter %p : !kvc.chunk<kv x bf16, tokens 64 to 128, layers 0 to 2, device>
  }
  return
}
}

// -----

// Tests that per-token groups that do not tile a row (64 of 96 values) are
// diagnosed on a save kernel, which reduces whole groups; the runtime
// encodes such a chunk.
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 192, heads = 2, kv_heads = 1, head_dim = 96, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @save_tiles() {
  // expected-warning @+1 {{kernel "gather_quant" has no generated form, so the runtime runs its steps: per-token groups of 64 values do not tile rows of 96}}
  %q = kvc.kernel "gather_quant"() : () -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8, group = 64, key_axis = token>> {
    %g = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    %r = kvc.quant %g
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8, group = 64, key_axis = token>>
    kvc.yield %r : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8, group = 64, key_axis = token>>
  }
  return
}
}

// -----

// Tests that a Hadamard transform over a head_dim that is not a power of
// two is diagnosed in both forms and left to the runtime.
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 192, heads = 4, kv_heads = 2, head_dim = 48, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @had_pow2(%c: !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device, codec <transform = hadamard>>) {
  // expected-warning @+1 {{kernel "untransform_scatter" has no generated form, so the runtime runs its steps: Hadamard over head_dim 48 needs a power of two of at least 8}}
  kvc.kernel "untransform_scatter" (%c) : (!kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device, codec <transform = hadamard>>) -> () {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device, codec <transform = hadamard>>):
    %u = kvc.untransform %in
        : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device, codec <transform = hadamard>>
        -> !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device>
    kvc.scatter %u : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device>
  }
  return
}
}

// -----

// Tests that a Hadamard transform over a head row shorter than one 8-value
// piece is diagnosed in both forms and left to the runtime.
module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 32, heads = 8, kv_heads = 8, head_dim = 4, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @had_narrow(%c: !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device, codec <transform = hadamard>>) {
  // expected-warning @+1 {{kernel "untransform_scatter" has no generated form, so the runtime runs its steps: Hadamard over head_dim 4 needs a power of two of at least 8}}
  kvc.kernel "untransform_scatter" (%c) : (!kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device, codec <transform = hadamard>>) -> () {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device, codec <transform = hadamard>>):
    %u = kvc.untransform %in
        : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device, codec <transform = hadamard>>
        -> !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device>
    kvc.scatter %u : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device>
  }
  return
}
}

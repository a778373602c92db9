// RUN: kvc-opt %s --kvc-lower-kernels --gpu-map-parallel-loops --convert-parallel-loops-to-gpu | FileCheck %s --check-prefix=LAUNCH
// RUN: kvc-opt %s --kvc-lower-kernels --gpu-map-parallel-loops --convert-parallel-loops-to-gpu --lower-affine --gpu-launch-sink-index-computations --gpu-kernel-outlining | FileCheck %s --check-prefix=OUTLINED
// RUN: kvc-opt %s --kvc-lower-kernels --gpu-map-parallel-loops --convert-parallel-loops-to-gpu --lower-affine --gpu-launch-sink-index-computations --gpu-kernel-outlining \
// RUN:   | kvc-opt --pass-pipeline='builtin.module(nvvm-attach-target{chip=sm_90 O=3}, gpu.module(kvc-gpu-data-layout, convert-scf-to-cf, convert-vector-to-llvm, convert-gpu-to-nvvm, canonicalize, cse, reconcile-unrealized-casts))' | FileCheck %s --check-prefix=NVVM
// RUN: kvc-opt %s --kvc-lower-kernels --kvc-kernels-to-ptx | FileCheck %s --check-prefix=PTX
// RUN: kvc-opt %s --kvc-lower-kernels --kvc-kernels-to-ptx | grep -o -E 'gpu.binary @[a-z0-9_]+|fma.rn.f32' | uniq | FileCheck %s --check-prefix=FMA
// RUN: kvc-opt %s --kvc-lower-kernels=host=true --kvc-kernels-to-llvm | FileCheck %s --check-prefix=HOST

// Tests the IR of one kernel of each kind (an int8 restore, a projection's
// RoPE epilogue and its RMSNorm prologue, a Hadamard restore, a Hadamard +
// int4 save) at each stage of kvc-kernels-to-ptx,
// and the host lowering the unit tests run: kvc-lower-kernels' two parallel
// loops become one gpu.launch (int8: 64 tokens x 128 / 8 pieces per matrix,
// 2 per thread, so 2 blocks of 256 threads per matrix, 4 in all, times the
// launch's chunks in y: the chunk table's records), outlined
// into a gpu.func, NVVM under the target's data layout with 16-byte vector
// loads and stores and the Hadamard's lane exchanges as shfl.sync.bfly, then
// PTX that reads the chunk record's three i64 fields with 8-byte loads, with
// ld.global.v4 / st.global.v4 and the hardware's round-to-nearest-even conversion to bf16.
// Fused multiply-adds appear only where the product is exact, so that one
// rounding is the runtime's multiply and add: a dequantized value (its f16
// scale times its integer) and a butterfly across lanes (+-1 times the
// lane's own value); the RoPE epilogue and the RMSNorm prologue, whose
// products round, have none. The
// save kernel splits K's per-channel groups of 32 tokens among 4 lanes of 8
// tokens each, which each load and transform their 8 tokens once, without a
// loop, and hold them for the encoding (the Hadamard's pieces of a head row
// 4 lanes apart, so its first stage shuffles xor 4; the lanes' extremes then
// combine with xor 1 and 2, and no transform follows), reduces V's per-token groups of 32 across 4 lanes (3 stages of
// 8 Hadamard shuffles, then 2 of a min and a max), and converts its scales
// and minimums with cvt.rn.f16.f32. The prologue sums a row's squares
// across 32 lanes and takes PTX's IEEE square root (sqrt.rn.f32; the host
// form llvm.intr.sqrt).

// LAUNCH-LABEL: func.func @kvc_restore_int8_kc_vt_g32_t64_l1_h2x64_b16
// LAUNCH:         %[[CHUNKS:.+]] = arith.divui
// LAUNCH:         %[[GRID:.+]] = affine.apply {{.+}}(%c4)
// LAUNCH:         %[[GRID_Y:.+]] = affine.apply {{.+}}(%[[CHUNKS]])
// LAUNCH:         gpu.launch blocks(%{{.+}}, %{{.+}}, %{{.+}}) in (%{{.+}} = %[[GRID]], %{{.+}} = %[[GRID_Y]], %{{.+}} = %c1{{.*}}) threads
// LAUNCH:           gpu.terminator
// LAUNCH-LABEL: func.func @kvc_rope_scatter_t64_l1_h2x64_b16
// LAUNCH:         gpu.launch blocks
// LAUNCH-LABEL: func.func @kvc_save_int4_kc_vt_g32_had_t64_l1_h2x64_b16
// LAUNCH:         gpu.launch blocks
// LAUNCH:           } else {
// LAUNCH-NOT:         scf.for
// LAUNCH-COUNT-8:     gpu.shuffle  xor %{{.+}}, %c4_i32
// LAUNCH-NOT:         scf.for
// LAUNCH:             gpu.shuffle  xor %{{.+}}, %c1_i32
// LAUNCH:             gpu.shuffle  xor %{{.+}}, %c2_i32
// LAUNCH-NOT:         gpu.shuffle  xor %{{.+}}, %c4_i32
// LAUNCH:           gpu.terminator

// OUTLINED-LABEL: func.func @kvc_restore_int8_kc_vt_g32_t64_l1_h2x64_b16(
// OUTLINED:         gpu.launch_func @[[R:kvc_restore_int8_kc_vt_g32_t64_l1_h2x64_b16_kernel]]::@[[R]] blocks in (%c4{{.*}}, %{{.+}}, %c1{{.*}}) threads in (%c256{{.*}}, %c1{{.*}}, %c1{{.*}})
// OUTLINED:       gpu.module @[[R]]
// OUTLINED:         gpu.func @[[R]](%{{.+}}: memref<?xi64>, {{.+}}) kernel attributes {known_block_size = array<i32: 256, 1, 1>}
// OUTLINED-LABEL: func.func @kvc_rope_scatter_t64_l1_h2x64_b16(
// OUTLINED:         gpu.launch_func @[[E:kvc_rope_scatter_t64_l1_h2x64_b16_kernel]]::@[[E]] blocks in (%c8{{.*}}, %{{.+}}, %c1{{.*}}) threads in (%c256{{.*}}, %c1{{.*}}, %c1{{.*}}) args({{.*}}%arg6 : memref<?xi8>
// OUTLINED:       gpu.module @[[E]]

// NVVM:       gpu.module @kvc_restore_int8_kc_vt_g32_t64_l1_h2x64_b16_kernel [#nvvm.target<O = 3, chip = "sm_90">] attributes {llvm.data_layout = "e-i64:64-{{.+}}"}
// NVVM:         llvm.func @kvc_restore_int8_kc_vt_g32_t64_l1_h2x64_b16_kernel({{.+}}) attributes {gpu.kernel, {{.*}}nvvm.kernel
// NVVM:           nvvm.read.ptx.sreg.ctaid.x
// NVVM:           nvvm.read.ptx.sreg.ctaid.y
// NVVM:           nvvm.read.ptx.sreg.tid.x
// NVVM:           llvm.intr.fmuladd({{.+}}) : (vector<8xf32>, vector<8xf32>, vector<8xf32>) -> vector<8xf32>
// NVVM:           llvm.store {{.+}} : vector<4xi32>, !llvm.ptr
// NVVM:           llvm.load {{.+}} -> vector<4xi32>
// NVVM:       gpu.module @kvc_rope_scatter_t64_l1_h2x64_b16_kernel
// NVVM:         llvm.func @kvc_rope_scatter_t64_l1_h2x64_b16_kernel
// NVVM:           llvm.store {{.+}} : vector<4xi32>, !llvm.ptr
// NVVM:           %[[COS:.+]] = llvm.fmul {{.+}} : vector<8xf32>
// NVVM:           %[[SIN:.+]] = llvm.fmul {{.+}} : vector<8xf32>
// NVVM:           llvm.fsub %[[COS]], %[[SIN]] : vector<8xf32>
// NVVM:           llvm.fadd %[[COS]], %[[SIN]] : vector<8xf32>
// NVVM:       gpu.module @kvc_restore_raw_bf16_had_t64_l1_h2x64_b16_kernel
// NVVM-COUNT-24:  nvvm.shfl.sync  bfly
// NVVM:           llvm.fptrunc {{.+}} : vector<8xf32> to vector<8xbf16>
// NVVM:       gpu.module @kvc_save_int4_kc_vt_g32_had_t64_l1_h2x64_b16_kernel
// NVVM:           llvm.fpext {{.+}} : vector<8xbf16> to vector<8xf32>
// NVVM-COUNT-24:  nvvm.shfl.sync  bfly
// NVVM:           llvm.intr.minnum({{.+}}) : (vector<8xf32>, vector<8xf32>) -> vector<8xf32>
// NVVM:           llvm.fptrunc {{.+}} : vector<8xf32> to vector<8xf16>
// NVVM:           llvm.fdiv {{.+}} : vector<8xf32>

// PTX:     gpu.binary @kvc_restore_int8_kc_vt_g32_t64_l1_h2x64_b16_kernel [#gpu.object<#nvvm.target<O = 3, chip = "sm_90">, {{.*}}assembly = "
// PTX-SAME:  .target sm_90
// PTX-SAME:  .entry kvc_restore_int8_kc_vt_g32_t64_l1_h2x64_b16_kernel(
// PTX-NOT:   ld.global.u32
// PTX-SAME:  ld.global.u64
// PTX-SAME:  ld.global.u64
// PTX-SAME:  ld.global.u64
// PTX-SAME:  ld.global.v4.u32
// PTX-SAME:  fma.rn.f32
// PTX-SAME:  st.global.v4.b32
// PTX:     gpu.binary @kvc_rope_scatter_t64_l1_h2x64_b16_kernel
// PTX-SAME:  .entry kvc_rope_scatter_t64_l1_h2x64_b16_kernel(
// PTX-SAME:  ld.global.v4.u32
// PTX-SAME:  mul.rn.f32
// PTX-SAME:  add.rn.f32
// PTX-SAME:  st.global.v4.b32
// PTX:     gpu.binary @kvc_rms_norm_bf16_t64_l1_d256_kernel
// PTX-SAME:  ld.global.v4.b32
// PTX-SAME:  shfl.sync.bfly.b32
// PTX-SAME:  sqrt.rn.f32
// PTX-SAME:  rcp.rn.f32
// PTX-SAME:  cvt.rn.bf16.f32
// PTX-SAME:  st.global.v4.b32
// PTX:     gpu.binary @kvc_restore_raw_bf16_had_t64_l1_h2x64_b16_kernel
// PTX-SAME:  shfl.sync.bfly.b32
// PTX-SAME:  cvt.rn.bf16.f32
// PTX-SAME:  st.global.v4.b32
// PTX:     gpu.binary @kvc_save_int4_kc_vt_g32_had_t64_l1_h2x64_b16_kernel
// PTX-SAME:  ld.global.v4.b32
// PTX-SAME:  shfl.sync.bfly.b32
// PTX-SAME:  min.f32
// PTX-SAME:  max.f32
// PTX-SAME:  cvt.rn.f16.f32
// PTX-SAME:  rcp.rn.f32
// PTX-SAME:  st.global.u32

// FMA:      gpu.binary @kvc_restore_int8_kc_vt_g32_t64_l1_h2x64_b16_kernel
// FMA-NEXT: fma.rn.f32
// FMA-NEXT: gpu.binary @kvc_rope_scatter_t64_l1_h2x64_b16_kernel
// FMA-NEXT: gpu.binary @kvc_rms_norm_bf16_t64_l1_d256_kernel
// FMA-NEXT: gpu.binary @kvc_restore_raw_bf16_had_t64_l1_h2x64_b16_kernel
// FMA-NEXT: fma.rn.f32
// FMA-NEXT: gpu.binary @kvc_save_int4_kc_vt_g32_had_t64_l1_h2x64_b16_kernel
// FMA-NEXT: fma.rn.f32
// FMA-NOT:  {{.}}

// HOST-NOT:   gpu.
// HOST:       llvm.func @kvc_restore_int8_kc_vt_g32_t64_l1_h2x64_b16(
// HOST:         llvm.cond_br
// HOST:         llvm.store {{.+}} : vector<4xi32>, !llvm.ptr
// HOST:       llvm.func @kvc_rope_scatter_t64_l1_h2x64_b16(
// HOST:       llvm.func @kvc_rms_norm_bf16_host_t64_l1_d256(
// HOST-NOT:   llvm.inline_asm
// HOST:         llvm.intr.sqrt
// HOST:       llvm.func @kvc_restore_raw_bf16_had_host_t64_l1_h2x64_b16(
// HOST:       llvm.func @kvc_save_int4_kc_vt_g32_had_host_t64_l1_h2x64_b16(

module attributes {kvc.model = #kvc.model<name = "t", layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16>} {
func.func @restore(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>) {
  kvc.kernel "dequant_scatter" (%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>) -> () {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>):
    %d = kvc.dequant %in
        : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    kvc.scatter %d : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  }
  return
}
func.func @project(%h: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device>) {
  kvc.kernel "project_scatter" (%h) : (!kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device>) -> () {
  ^bb0(%in: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device>):
    %p = kvc.project %in
        : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    kvc.scatter %p : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  }
  return
}
func.func @hadamard(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>) {
  kvc.kernel "untransform_scatter" (%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>) -> () {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>):
    %u = kvc.untransform %in
        : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    kvc.scatter %u : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  }
  return
}
func.func @save() -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard, quant = int4>> {
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
  return %q : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard, quant = int4>>
}
}

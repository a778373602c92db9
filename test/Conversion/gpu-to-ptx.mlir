// RUN: kvc-opt %s --pass-pipeline='builtin.module(gpu-kernel-outlining, nvvm-attach-target{chip=sm_90 O=3}, gpu.module(convert-scf-to-cf, convert-gpu-to-nvvm, canonicalize, cse, reconcile-unrealized-casts), gpu-module-to-binary{format=isa})' | FileCheck %s

// Tests that kvc-opt carries the upstream gpu -> NVVM -> PTX pipeline that
// kvc's fused kernels lower through: a scale kernel becomes PTX for sm_90.

// CHECK: gpu.binary @scale_kernel
// CHECK-SAME: .target sm_90
// CHECK-SAME: .entry scale_kernel
// CHECK-SAME: mul.rn.f32

func.func @scale(%buf: memref<1024xf32>, %factor: f32) {
  %c1 = arith.constant 1 : index
  %c256 = arith.constant 256 : index
  %c4 = arith.constant 4 : index
  gpu.launch blocks(%bx, %by, %bz) in (%gx = %c4, %gy = %c1, %gz = %c1)
             threads(%tx, %ty, %tz) in (%sx = %c256, %sy = %c1, %sz = %c1) {
    %base = arith.muli %bx, %c256 : index
    %i = arith.addi %base, %tx : index
    %v = memref.load %buf[%i] : memref<1024xf32>
    %s = arith.mulf %v, %factor : f32
    memref.store %s, %buf[%i] : memref<1024xf32>
    gpu.terminator
  }
  return
}

// RUN: kvc-opt %s --split-input-file --verify-diagnostics \
// RUN:     --pass-pipeline='builtin.module(gpu.module(kvc-gpu-data-layout))' | FileCheck %s

// Tests that a gpu.module gets the data layout of the NVPTX machine its
// #nvvm.target names: i64 aligned to 8 bytes, so a load of one is one
// 8-byte load.
// CHECK-LABEL: gpu.module @kernel
// CHECK-SAME:    [#nvvm.target<chip = "sm_90">]
// CHECK-SAME:    attributes {llvm.data_layout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"}
gpu.module @kernel [#nvvm.target<chip = "sm_90">] {
}

// -----

// Tests that a layout already there is replaced by the target's.
// CHECK-LABEL: gpu.module @stale
// CHECK-SAME:    attributes {llvm.data_layout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"}
gpu.module @stale [#nvvm.target<chip = "sm_90">] attributes {llvm.data_layout = "e"} {
}

// -----

// Tests that a module with no NVVM target is an error.
// expected-error @+1 {{has no #nvvm.target to take a data layout from (run nvvm-attach-target first)}}
gpu.module @untargeted {
}

// -----

// Tests that a chip NVPTX does not know is an error, not PTX the runtime
// would refuse.
// expected-error @+1 {{targets chip "sm_1", which NVPTX does not know (sm_90: H100, H200)}}
gpu.module @unknown [#nvvm.target<chip = "sm_1">] {
}

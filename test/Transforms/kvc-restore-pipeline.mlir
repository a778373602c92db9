// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-restore-pipeline | FileCheck %s --implicit-check-not=kvc.segment --implicit-check-not=kvc.restore
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-restore-pipeline=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=REPORT
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-restore-pipeline=gpu-chip=sm_90 --kvc-emit-bundle=file=%t.json -o /dev/null
// RUN: kvc-run inspect-bundle --bundle %t.json | FileCheck %s --check-prefix=GPU
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/h100-sxm.json --kvc-restore-pipeline --kvc-emit-bundle=file=%t-h100.json -o /dev/null
// RUN: kvc-run inspect-bundle --bundle %t-h100.json | FileCheck %s --check-prefix=GPU
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/h100-sxm.json --kvc-restore-pipeline=gpu-chip=none --kvc-emit-bundle=file=%t-none.json -o /dev/null
// RUN: kvc-run inspect-bundle --bundle %t-none.json | FileCheck %s --check-prefix=NONE
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%inputs/slow-wakeup.json --kvc-restore-pipeline --kvc-emit-bundle=file=%t-cpu.json -o /dev/null
// RUN: kvc-run inspect-bundle --bundle %t-cpu.json | FileCheck %s --check-prefix=NONE

// Tests that the pipeline takes a restore intent down to scheduled tasks with
// fused kernels and predicted times: int8 KV from DRAM for three layers,
// hidden states from the SSDs for the fourth.
// CHECK-LABEL: kvc.plan @chat tokens 0 to 1024 layers 0 to 4 strategy "joint" predicted {{[0-9]+}} us {
// CHECK:         kvc.task on io[0] slot 0 attributes {kvc.time_ns
// CHECK-NEXT:      kvc.fetch #{{.+}} tokens 0 to 512 layers 0 to 3
// CHECK:         kvc.task on decode[0]
// CHECK:         kvc.task on h2d[0]
// CHECK:         kvc.task on compute[0]
// CHECK-NEXT:      kvc.kernel "dequant_scatter"
// CHECK:         kvc.kernel "project_scatter"

// Tests that a raw KV chunk's scatter after its copy to the device is a
// kernel of its own, while a computed chunk's scatter stays a step.
// CHECK-LABEL: kvc.plan @raw tokens 0 to 1024 layers 0 to 4
// CHECK:         kvc.chunk_compute tokens 0 to 512 layers 0 to 1
// CHECK:         kvc.task on compute[0] after
// CHECK-NEXT:      kvc.scatter
// CHECK:         %{{.+}}, %[[KV:.+]] = kvc.task on h2d[0]
// CHECK-NEXT:      kvc.transfer_to_device
// CHECK:         kvc.task on compute[0]
// CHECK-NEXT:      kvc.kernel "scatter"(%[[KV]])

// Tests that with gpu-chip every fused task of each plan launches a kernel
// the bundle carries as PTX: the int8 restore, the projection's epilogue and
// prologue, and the raw restore; that a GPU target's own chip (the H100's
// sm_90) gives the same without gpu-chip, while an explicit gpu-chip wins
// over the target's (sm_90 on the A100 target, whose chip is sm_80); and
// that gpu-chip=none, or a target without a chip, gives no kernels.
// NONE:     plan chat:
// NONE:       kernels  0 of {{[0-9]+}} fused tasks launch 0 generated kernels
// NONE:     plan raw:
// NONE:       kernels  0 of {{[0-9]+}} fused tasks launch 0 generated kernels
// NONE-NOT: kernel kvc_
// GPU:      plan chat:
// GPU:        kernels  [[N:[0-9]+]] of [[N]] fused tasks launch 3 generated kernels
// GPU:      plan raw:
// GPU:        loads    kv as raw from dram
// GPU-NEXT:   kernels  [[M:[0-9]+]] of [[M]] fused tasks launch 1 generated kernels
// GPU-DAG:  kernel kvc_restore_int8_kc_vt_g32_{{.+}}: restore for sm_90
// GPU-DAG:  kernel kvc_rope_scatter_{{.+}}: rope_scatter for sm_90
// GPU-DAG:  kernel kvc_rms_norm_{{.+}}: rms_norm for sm_90
// GPU-DAG:  kernel kvc_restore_raw_f16_{{.+}}: restore for sm_90

// REPORT: remark: kvc-plan @chat:
// REPORT: joint
kvc.restore @chat tokens 0 to 1024 from [
    #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 1024, layers = 0 to 4>,
    #kvc.source<tier = "dram", form = kv, codec = <quant = int8, lossless = deflate>,
                tokens = 0 to 1024, layers = 0 to 4>]
kvc.restore @raw tokens 0 to 1024 from [
    #kvc.source<tier = "dram", form = kv, tokens = 0 to 1024, layers = 0 to 4>]

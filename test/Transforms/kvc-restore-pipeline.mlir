// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-restore-pipeline | FileCheck %s --implicit-check-not=kvc.segment --implicit-check-not=kvc.restore
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-restore-pipeline=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=REPORT

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

// REPORT: remark: kvc-plan @chat:
// REPORT: joint
kvc.restore @chat tokens 0 to 1024 from [
    #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 1024, layers = 0 to 4>,
    #kvc.source<tier = "dram", form = kv, codec = <quant = int8, lossless = deflate>,
                tokens = 0 to 1024, layers = 0 to 4>]

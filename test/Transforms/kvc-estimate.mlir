// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-estimate | FileCheck %s --check-prefixes=PLAN,SEGMENTS
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-expand --kvc-estimate | FileCheck %s --check-prefixes=PLAN,DATAFLOW
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-expand --kvc-fuse --kvc-schedule --kvc-estimate | FileCheck %s --check-prefixes=PLAN,TASKS

#kv = #kvc.source<tier = "ssd", form = kv, codec = <quant = int8, lossless = zstd>,
                  tokens = 0 to 1024, layers = 0 to 4>

// Tests that a plan predicts the same time at every level: as segments (as
// the planner simulates them), as dataflow and as scheduled tasks.
// PLAN: kvc.plan @p tokens 0 to 1024 layers 0 to 4 predicted 3686 us {

// Tests that each step gets its simulated start and finish: both fetches
// start at once on two of the four SSD lanes; the copies queue on the one
// copy engine. Each fetch also gets the bytes it is priced to read, which
// plan bundles carry and kvc-run prints beside the bytes it read.
// DATAFLOW:      kvc.fetch {{.+}} tokens 0 to 512 {{.*}}{kvc.bytes = [[BYTES:[0-9]+]] : i64, kvc.time_ns = array<i64: 0, 2268333>}
// DATAFLOW:      kvc.transfer_to_device {{.*}}{kvc.time_ns = array<i64: 2410802, 3010626>}
// DATAFLOW:      kvc.fetch {{.+}} tokens 512 to 1024 {{.*}}{kvc.bytes = [[BYTES]] : i64, kvc.time_ns = array<i64: 0, 2268333>}
// DATAFLOW:      kvc.transfer_to_device {{.*}}{kvc.time_ns = array<i64: 3010626, 3610450>}
// DATAFLOW:      kvc.scatter {{.*}}{kvc.time_ns = array<i64: 3642818, 3685975>}
// TASKS:         kvc.task on io[0] slot 0 attributes {kvc.time_ns = array<i64: 0, 2268333>}
// TASKS-NEXT:      kvc.fetch {{.+}} {kvc.bytes = {{[0-9]+}} : i64}
// SEGMENTS-NOT:  kvc.time_ns
kvc.plan @p tokens 0 to 1024 layers 0 to 4 {
  kvc.segment load_kv tokens 0 to 1024 layers 0 to 4 from #kv
}

// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-expand --kvc-fuse --kvc-schedule=staging-mib=20 --kvc-estimate=staging-mib=20 --kvc-emit-bundle=file=%t.json -o /dev/null
// RUN: FileCheck %s < %t.json
// RUN: kvc-run inspect-bundle --bundle %t.json | FileCheck %s --check-prefix=RUNTIME

#kv = #kvc.source<tier = "ssd", form = kv, codec = <quant = int8, lossless = zstd>,
                  tokens = 0 to 1024, layers = 0 to 4>

// Tests that every task is written with its resource, lane, dependencies,
// the tasks whose values it reads, its staging slot and its steps, and that
// the plan and its tasks carry the estimated times, its fetches the
// estimated bytes.
// CHECK:      "format": "kvc-plan-bundle",
// CHECK-NEXT: "version": 4,
// CHECK:      "name": "p",
// CHECK:      "predicted_us": [[US:[0-9]+]],
// CHECK-NEXT: "staging_slots": 1,
// CHECK:      "id": 0,
// CHECK-NEXT: "resource": "io",
// CHECK-NEXT: "lane": 0,
// CHECK-NEXT: "after": [],
// CHECK-NEXT: "inputs": [],
// CHECK-NEXT: "slot": 0,
// CHECK-NEXT: "predicted_ns": [
// CHECK:      "op": "fetch",
// CHECK-NEXT: "form": "kv",
// CHECK:      "codec": "int8/g32+zstd",
// CHECK-NEXT: "tier": "ssd",
// CHECK-NEXT: "predicted_bytes": {{[0-9]+}}
// CHECK:      "id": 1,
// CHECK-NEXT: "resource": "decode",
// CHECK:      "after": [
// CHECK-NEXT:  0
// CHECK:      "op": "decompress",
// CHECK:      "id": 3,
// CHECK-NEXT: "resource": "compute",
// CHECK:      "kernel": "dequant_scatter",
// CHECK:      "op": "dequant",
// CHECK:      "op": "scatter",
// CHECK:      "codec": "raw"

// Tests that the second chunk's fetch reuses the slot only after the first
// chunk's copy (task 2) and that the runtime accepts what the compiler wrote.
// CHECK:      "id": 4,
// CHECK-NEXT: "resource": "io",
// CHECK-NEXT: "lane": 1,
// CHECK-NEXT: "after": [
// CHECK-NEXT:  2
// CHECK-NEXT: ],
// CHECK:      "slot": 0,
// RUNTIME:      plan p: tokens 0 to 1024, layers 0 to 4, 8 tasks, 1 staging slots, predicted [[US:[0-9]+]] us
// RUNTIME-NEXT:   io       2 tasks on 2 lane(s)
// RUNTIME-NEXT:   decode   2 tasks on 1 lane(s)
// RUNTIME-NEXT:   h2d      2 tasks on 1 lane(s)
// RUNTIME-NEXT:   compute  2 tasks on 1 lane(s)
kvc.plan @p tokens 0 to 1024 layers 0 to 4 {
  kvc.segment load_kv tokens 0 to 1024 layers 0 to 4 from #kv
}

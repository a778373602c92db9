// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-estimate | FileCheck %s --check-prefixes=PLAN,SEGMENTS
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-expand --kvc-estimate | FileCheck %s --check-prefixes=PLAN,DATAFLOW
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-expand --kvc-fuse --kvc-schedule --kvc-estimate | FileCheck %s --check-prefixes=PLAN,TASKS
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%inputs/slow-wakeup.json --kvc-estimate | FileCheck %s --check-prefix=HANDOFF-PLAN
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%inputs/slow-wakeup.json --kvc-expand --kvc-estimate | FileCheck %s --check-prefixes=HANDOFF-PLAN,HANDOFF
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-expand --kvc-estimate | FileCheck %s --check-prefix=TRANSFER

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
// SEGMENTS:      kvc.transfer @t

// Tests that with host.handoff_us = 50 a step released by the start or by
// a step on another resource starts 50 us later (the fetch, the
// decompress, the copy; the dequant follows the copy onto the compute
// stream, so it pays another), while a step on its own resource's lane or
// one queued behind a busy lane does not: the second decompress starts as
// the first ends, and the planner's segments price the same 200 us more.
// HANDOFF-PLAN:  kvc.plan @p tokens 0 to 1024 layers 0 to 4 predicted 3886 us {
// HANDOFF:       kvc.fetch {{.+}} tokens 0 to 512 {{.*}}kvc.time_ns = array<i64: 50000, [[FETCHED:[0-9]+]]>}
// HANDOFF-NEXT:  kvc.decompress {{.*}}{kvc.time_ns = array<i64: 2368333, [[DECODED:[0-9]+]]>}
// HANDOFF-NEXT:  kvc.transfer_to_device {{.*}}{kvc.time_ns = array<i64: 2560802, 3160626>}
// HANDOFF-NEXT:  kvc.dequant {{.*}}{kvc.time_ns = array<i64: 3210626, [[DEQUANTIZED:[0-9]+]]>}
// HANDOFF-NEXT:  kvc.scatter {{.*}}{kvc.time_ns = array<i64: [[DEQUANTIZED]],
// HANDOFF:       kvc.fetch {{.+}} tokens 512 to 1024 {{.*}}kvc.time_ns = array<i64: 50000, [[FETCHED]]>}
// HANDOFF-NEXT:  kvc.decompress {{.*}}{kvc.time_ns = array<i64: [[DECODED]],
kvc.plan @p tokens 0 to 1024 layers 0 to 4 {
  kvc.segment load_kv tokens 0 to 1024 layers 0 to 4 from #kv
}

// Tests that a transfer is priced end to end. The sender runs beside a
// prefill of 256 tokens a step (2.67 ms on this target, 0.668 ms a layer,
// the first 0.165 ms of which project a layer's Q, K and V): the gather of
// tokens 0 to 256, layers 0 to 2 starts once the step has computed layer 0
// and written layer 1's K and V, the one of layers 2 to 4 once it has
// computed layers 0 to 2 and written layer 3's. Each of the receiver's recvs starts when the sender's send of
// the same object starts and takes as long, the wire's time. A receive
// plan without its sender starts its recvs at once, priced as the wire
// (0.67 ms here, as the sends).
// TRANSFER-LABEL: kvc.plan @t_send tokens 0 to 512 layers 0 to 4 strategy "send" prefill_step 256
// TRANSFER:         kvc.gather {kvc.time_ns = array<i64: 832852,
// TRANSFER:         kvc.send {{.*}}{kvc.time_ns = array<i64: [[#SEND0:]], [[#SENT0:]]>}
// TRANSFER:         kvc.gather {kvc.time_ns = array<i64: 2168173,
// TRANSFER:         kvc.send {{.*}}{kvc.time_ns = array<i64: [[#SEND1:]], [[#SENT1:]]>}
// TRANSFER-LABEL: kvc.plan @t_recv tokens 0 to 512 layers 0 to 4 strategy "receive" predicted
// TRANSFER-NEXT:    kvc.recv from "prefill" {kvc.time_ns = array<i64: [[#SEND0]], [[#SENT0]]>}
// TRANSFER:         kvc.recv from "prefill" {kvc.time_ns = array<i64: [[#SEND1]], [[#SENT1]]>}
// TRANSFER-LABEL: kvc.plan @lone_recv
// TRANSFER-NEXT:    kvc.recv from "prefill" {kvc.time_ns = array<i64: 0, 671089>}
kvc.transfer @t tokens 0 to 512 to "decode" {layer_group = 2 : i64}
kvc.plan @lone_recv tokens 0 to 256 layers 0 to 2 strategy "receive" {
  %r = kvc.recv from "prefill" : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, host>
  %d = kvc.transfer_to_device %r
      : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, host>
      -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, device>
  kvc.scatter %d : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, device>
}

// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%inputs/slow-link.json --kvc-save-pipeline | FileCheck %s
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%inputs/slow-link.json --kvc-save-pipeline --kvc-emit-bundle=file=%t.json -o /dev/null
// RUN: kvc-run inspect-bundle --bundle %t.json | FileCheck %s --check-prefix=BUNDLE
// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%inputs/slow-link.json --kvc-save-pipeline=gpu-chip=sm_90 --kvc-emit-bundle=file=%t-gpu.json -o /dev/null
// RUN: kvc-run inspect-bundle --bundle %t-gpu.json | FileCheck %s --check-prefix=GPU

// Tests that kvc-save-pipeline chooses each save's codec under its budget
// (a lossy one on the slow network tier when max_error allows it, a lossless
// one without a budget), expands the save into per-object steps, fuses each
// object's gather and quantization of KV into a kernel (a raw gather, copied
// to the host, is a kernel alone; a gather of hidden states stays a step)
// and schedules them as tasks with predicted
// times: kernels on the compute stream, the copy on d2h, compression on the
// decode lanes, stores on the tier's io lanes. Each save runs beside a
// prefill of one object's tokens a step, so its first gather starts once
// that prefill has computed the first object's layers, not at 0.
// CHECK-LABEL: kvc.plan @lossy tokens 0 to 512 layers 0 to 4 strategy "save" prefill_step 256 predicted {{[0-9]+}} us {
// CHECK:         %{{.+}}, %[[ENC:.+]] = kvc.task on compute[0] attributes {kvc.time_ns = array<i64: {{[1-9][0-9]*}}, {{[0-9]+}}>} {
// CHECK-NEXT:      kvc.kernel "gather_quant"() : () -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, device, codec <quant = {{int[248]}}
// CHECK-NEXT:        %[[G:.+]] = kvc.gather : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, device>
// CHECK-NEXT:        %[[Q:.+]] = kvc.quant %[[G]]
// CHECK-NEXT:        kvc.yield %[[Q]]
// CHECK:         kvc.task on d2h[0] after
// CHECK-NEXT:      kvc.transfer_to_host %[[ENC]]
// CHECK:         kvc.task on decode[0] after
// CHECK-NEXT:      kvc.compress
// CHECK:         kvc.task on io[0] after
// CHECK-NEXT:      kvc.store %{{.+}} to "net" : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, host, codec <quant = {{int[248]}}
// CHECK:         kvc.task on io[{{[0-9]}}] after
// CHECK-NEXT:      kvc.store %{{.+}} to "net" : !kvc.chunk<kv x f16, tokens 256 to 512, layers 0 to 4, host
// CHECK-LABEL: kvc.plan @exact tokens 0 to 512 layers 0 to 4 strategy "save" prefill_step 256 predicted {{[0-9]+}} us {
// CHECK-NOT:     quant =
// CHECK:           kvc.kernel "gather"() : () -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, device> {
// CHECK-NEXT:        %[[KV:.+]] = kvc.gather : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, device>
// CHECK-NEXT:        kvc.yield %[[KV]]
// CHECK:         kvc.task on compute[0] attributes
// CHECK-NEXT:      kvc.gather : !kvc.chunk<hidden x f16, tokens 0 to 256, layers 0 to 4, device>
// CHECK-NOT:     quant =
// CHECK:         kvc.store %{{.+}} to "net" : !kvc.chunk<hidden x f16, tokens 256 to 512, layers 0 to 4, host, codec <lossless = {{[a-z0-9]+}}>>
// CHECK-NOT:     quant =
// CHECK:       }
kvc.save @lossy tokens 0 to 512 kv to "net" {max_error = 0.12}
kvc.save @exact tokens 0 to 512 kv hidden to "net"

// BUNDLE:      plan lossy: tokens 0 to 512, layers 0 to 4, 8 tasks, 0 staging slots, beside a prefill of 256 tokens a step, predicted {{[0-9]+}} us
// BUNDLE:        stores   kv as {{int[248]}}/g{{[0-9]+}}{{.*}} to net: tokens 0 to 512, layers 0 to 4
// BUNDLE:      plan exact: tokens 0 to 512, layers 0 to 4, 16 tasks, 0 staging slots, beside a prefill of 256 tokens a step, predicted {{[0-9]+}} us
// BUNDLE:        stores   kv as [[LOSSLESS:deflate|zstd|lz4]] to net: tokens 0 to 512, layers 0 to 4
// BUNDLE-NEXT:   stores   hidden as [[LOSSLESS]] to net: tokens 0 to 512, layers 0 to 4
// BUNDLE-NEXT:   kernels  0 of 2 fused tasks launch 0 generated kernels
// BUNDLE-NOT:  kernel

// Tests that with gpu-chip each KV object's kernel is generated (the
// quantizing one, and the raw copy) and named by its tasks: every fused
// task launches one.
// GPU:      plan lossy: tokens 0 to 512, layers 0 to 4, 8 tasks
// GPU:        kernels  2 of 2 fused tasks launch 1 generated kernels
// GPU:      plan exact: tokens 0 to 512, layers 0 to 4, 16 tasks
// GPU:        kernels  2 of 2 fused tasks launch 1 generated kernels
// GPU-DAG:  kernel kvc_save_raw_f16_t256_l4_h32x128_b16: save for sm_90, grid {{[0-9]+}}x1x1 of 256 threads a chunk, 16777216 payload bytes, {{[0-9]+}} bytes of PTX
// GPU-DAG:  kernel kvc_save_{{int[248]}}_kc_vt_g{{[0-9]+}}_t256_l4_h32x128_b16: save for sm_90

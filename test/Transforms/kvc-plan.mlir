// RUN: kvc-opt %s --split-input-file --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-plan=allow-slo-miss=true | FileCheck %s
// RUN: kvc-opt %s --split-input-file --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json "--kvc-plan=report=true allow-slo-miss=true" 2>&1 | FileCheck %s --check-prefix=REPORT
// RUN: kvc-opt %s --split-input-file --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json "--kvc-plan=report=true allow-slo-miss=true layer-wise=true" 2>&1 | FileCheck %s --check-prefix=LAYERWISE

// Tests that the joint planner mixes methods no single paper does: here
// recomputing the first layers from tokens and loading int8 KV, compressed
// with deflate, for the rest.
// CHECK-LABEL: kvc.plan @chat tokens 0 to 4096 layers 0 to 32 strategy "joint"
// CHECK-NEXT:    kvc.segment compute tokens 0 to 4096 layers 0 to 3
// CHECK-NEXT:    kvc.segment load_kv tokens 0 to 4096 layers 3 to 32 from #[[KV:.+]]
// CHECK-NEXT:  }

// Tests that the report shows every baseline beside the chosen plan, with
// when layer 0 is complete (computed with every layer: at the end), busy
// time per resource, bytes read, FLOPs, and its time over the chosen
// plan's (compute takes longer: above 1), then what each plan chose.
// REPORT:      remark: kvc-plan @chat:
// REPORT-NEXT: strategy makespan layer 0 compute h2d decode io:dram io:ssd read GB TFLOP time/chosen
// REPORT-NEXT: compute [[COMPUTE:[0-9.]+]] ms [[COMPUTE]] ms {{.*}} 0.000 57.451 {{[1-9][0-9.]*}}x
// REPORT-NEXT: kv
// REPORT-NEXT: hidden
// REPORT-NEXT: cake
// REPORT-NEXT: hcache
// REPORT-NEXT: joint {{[0-9.]+}} ms {{.*}} 1.00x
// REPORT-NEXT: (layer 0: when it holds every token; time/chosen: each plan's makespan over the chosen joint plan's)
// REPORT-NEXT: compute compute tokens 0-4096 layers 0-32
// REPORT-NEXT: kv load kv tokens 0-4096 layers 0-32 (dram, int8/g32+deflate)
// REPORT-NEXT: hidden load hidden tokens 0-4096 layers 0-32 (ssd, raw)
// REPORT-NEXT: cake {{.+}}
// REPORT-NEXT: hcache {{.*}}load hidden tokens 0-4096 {{.*}}(ssd, raw)
// REPORT-NEXT: joint compute tokens 0-4096 layers 0-3; load kv tokens 0-4096 layers 3-32 (dram, int8/g32+deflate)
// REPORT-NEXT: chunks of 512 tokens, loads of 4 layers each
// LAYERWISE:   remark: kvc-plan @chat:
// LAYERWISE:   chunks of 512 tokens, loads of 2 layers each, issued layer by layer
kvc.restore @chat tokens 0 to 4096 from [
    #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 4096, layers = 0 to 32>,
    #kvc.source<tier = "dram", form = kv, codec = <quant = int8, lossless = deflate>,
                tokens = 0 to 4096, layers = 0 to 32>]

// -----

// Tests that a quality budget excludes lossy sources: with int8 KV off the
// table, the plan is HCache's.
// CHECK-LABEL: kvc.plan @strict tokens 0 to 4096 layers 0 to 32 strategy "joint"
// CHECK-NOT:     load_kv
// CHECK:         kvc.segment load_hidden
kvc.restore @strict tokens 0 to 4096 from [
    #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 4096, layers = 0 to 32>,
    #kvc.source<tier = "dram", form = kv, codec = <quant = int8, lossless = deflate>,
                tokens = 0 to 4096, layers = 0 to 32>]
    {max_error = 0.001}

// -----

// Tests that allow-slo-miss keeps a plan slower than the request's SLO and
// warns (without it the pass fails: kvc-plan-invalid.mlir).
// CHECK-LABEL: kvc.plan @hurry tokens 0 to 4096 layers 0 to 32 strategy "joint"
// REPORT: warning: the best joint plan takes {{[0-9.]+}} ms, more than slo_ms = 1
kvc.restore @hurry tokens 0 to 4096 from [] {slo_ms = 1.0}

// -----

// Tests that a forward pass after the restore changes what the search
// minimizes: its end, the first token. Layer-wise, the request alone
// recomputes its first layers; with a forward pass of 1024 tokens it loads
// every layer instead, since recomputed layers complete only with the last
// computed chunk and the pass would wait for them. The report adds when
// each plan's first token comes.
// CHECK-LABEL: kvc.plan @alone tokens 0 to 3072
// CHECK-LABEL: kvc.plan @next tokens 0 to 3072 layers 0 to 32 strategy "joint"
// CHECK-NEXT:    kvc.segment compute tokens 0 to 3072 layers 0 to 2
// CHECK-NEXT:    kvc.segment load_kv tokens 0 to 3072 layers 2 to 32
// REPORT:      remark: kvc-plan @next:
// REPORT-NEXT: strategy makespan layer 0 first token compute h2d decode io:dram io:ssd read GB TFLOP time/chosen
// REPORT:      joint {{[0-9.]+}} ms {{[0-9.]+}} ms {{[0-9.]+}} ms {{.*}} 1.00x
// REPORT-NEXT: (layer 0: when it holds every token; first token: when the server's forward pass over 1024 tokens ends beside the restore, its layers on the compute counted in its busy time; time/chosen: each plan's first token over the chosen joint plan's)
// LAYERWISE:   remark: kvc-plan @alone:
// LAYERWISE:   joint compute tokens 0-3072 layers 0-3; load kv tokens 0-3072 layers 3-32 (dram, int8/g32+deflate)
// LAYERWISE:   remark: kvc-plan @next:
// LAYERWISE:   joint load kv tokens 0-3072 layers 0-32 (dram, int8/g32+deflate)
kvc.restore @alone tokens 0 to 3072 from [
    #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 3072, layers = 0 to 32>,
    #kvc.source<tier = "dram", form = kv, codec = <quant = int8, lossless = deflate>,
                tokens = 0 to 3072, layers = 0 to 32>]
kvc.restore @next tokens 0 to 3072 from [
    #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 3072, layers = 0 to 32>,
    #kvc.source<tier = "dram", form = kv, codec = <quant = int8, lossless = deflate>,
                tokens = 0 to 3072, layers = 0 to 32>] {forward_tokens = 1024}

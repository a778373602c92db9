// RUN: kvc-opt %s --split-input-file --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-plan --verify-diagnostics
// RUN: not kvc-opt %s --split-input-file --kvc-plan 2>&1 | FileCheck %s --check-prefix=NOMODEL
// RUN: not kvc-opt %s --split-input-file --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-plan 2>&1 | FileCheck %s --check-prefix=NOTARGET
// RUN: not kvc-opt %s --split-input-file --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-plan=strategy=hcache 2>&1 | FileCheck %s --check-prefix=STRATEGY
// RUN: not kvc-opt %s --split-input-file --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-plan=strategy=cake 2>&1 | FileCheck %s --check-prefix=CAKE
// RUN: not kvc-opt %s --split-input-file --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-plan=strategy=magic 2>&1 | FileCheck %s --check-prefix=UNKNOWN

// NOMODEL: error: kvc-plan needs the model: attach one with --kvc-import-model=PATH/config.json
// NOMODEL-NOT: see current operation
// NOTARGET: error: kvc-plan needs the machine: attach one with --kvc-attach-target=targets/NAME.json
// UNKNOWN: error: 'kvc.restore' op cannot be planned with strategy "magic" (expected compute, kv, hidden, cake, hcache, joint)

// Tests that planning rejects requests it cannot serve, naming the problem,
// and that kvc-opt names the op of a diagnostic by its location only (the
// module is not printed after it; --mlir-print-op-on-diagnostic asks for it).

// expected-error @+1 {{'kvc.restore' op names tier "nvme", which target "a100-40gb" does not have}}
kvc.restore @r tokens 0 to 4096 from [
    #kvc.source<tier = "nvme", form = kv, tokens = 0 to 4096, layers = 0 to 32>]

// -----

// expected-error @+1 {{source 0 (hidden in "ssd") holds tokens 0 to 2048, which do not cover the request's 0 to 4096}}
kvc.restore @r tokens 0 to 4096 from [
    #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 2048, layers = 0 to 32>]

// -----

// Tests that a baseline strategy needs a source of the form it loads.
// STRATEGY: error: 'kvc.restore' op has no usable hidden-state source for strategy "hcache"
kvc.restore @kv_only tokens 0 to 4096 from [
    #kvc.source<tier = "dram", form = kv, tokens = 0 to 4096, layers = 0 to 32>]

// -----

// Tests that a request no plan serves within its SLO is an error, and that
// Cake's split needs stored KV.
// CAKE: error: 'kvc.restore' op has no usable KV source for strategy "cake"
// expected-error @+2 {{'kvc.restore' op the best joint plan takes}}
// expected-note @+1 {{allow-slo-miss keeps it with a warning}}
kvc.restore @hurry tokens 0 to 4096 from [] {slo_ms = 1.0}

// RUN: kvc-opt %s --kvc-attach-target=%kvc_src/targets/a100-40gb.json | FileCheck %s --check-prefix=A100
// RUN: kvc-opt %s --kvc-attach-target=%kvc_src/targets/cpu-2core.json | FileCheck %s --check-prefix=CPU
// RUN: kvc-opt %s --kvc-attach-target=%kvc_src/targets/a100-80gb.json | FileCheck %s --check-prefix=ANY
// RUN: kvc-opt %s --kvc-attach-target=%kvc_src/targets/h100-sxm.json | FileCheck %s --check-prefix=ANY
// RUN: kvc-opt %s --kvc-attach-target=%kvc_src/targets/h200.json | FileCheck %s --check-prefix=ANY
// RUN: kvc-opt %s --kvc-attach-target=%kvc_src/targets/l40s.json | FileCheck %s --check-prefix=ANY
// RUN: kvc-opt %s --kvc-attach-target=%kvc_src/targets/h200.json --kvc-attach-target=%kvc_src/targets/l40s.json | FileCheck %s --check-prefix=REPLACE
// RUN: kvc-opt %s --kvc-attach-target=%kvc_src/targets/cpu-2core.json --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json | kvc-opt | FileCheck %s --check-prefix=BOTH
// RUN: kvc-opt %s --kvc-attach-target=%inputs/slow-wakeup.json | kvc-opt | FileCheck %s --check-prefix=HANDOFF
// RUN: not kvc-opt %s --kvc-attach-target=%inputs/bad-target.json 2>&1 | FileCheck %s --check-prefix=BAD

// Tests that the HCache testbed keeps its four SSDs as four lanes of one tier.
// A100: #[[T:.+]] = #kvc.target<name = "a100-40gb", compute = <kind = gpu, name = "NVIDIA A100-SXM4-40GB", dense_tflops = 312, mem_gbs = 1555, mem_gib = 40, restore_share = 1, chip = "sm_80">
// A100-SAME: link = <h2d_gbs = 32, d2h_gbs = 32, latency_us = 10>
// A100-SAME: #kvc.tier<name = "ssd", kind = disk, read_gbs = 27.6, write_gbs = 16.4, latency_us = 80, lanes = 4>
// A100-SAME: #kvc.codec_rate<stage = deflate, encode_gbs = 0.12, decode_gbs = 0.3125>
// A100: module attributes {kvc.target = #[[T]]}

// Tests that the CPU-only description has a CPU compute device.
// CPU: #kvc.target<name = "cpu-2core", compute = <kind = cpu,
// CPU-SAME: host = <cores = 2, dram_gib = 24, nic_gbs = 0>

// Tests that a measured hand-off between lanes is carried (and printed
// only when not 0, as above).
// HANDOFF: host = <cores = 96, dram_gib = 256, nic_gbs = 12.5, handoff_us = 50>

// Tests that every shipped target attaches.
// ANY: module attributes {kvc.target = #target}

// Tests that a second target replaces the first.
// REPLACE-NOT: name = "h200"
// REPLACE: #kvc.target<name = "l40s"

// Tests that model and target coexist and the result round-trips.
// BOTH: module attributes {kvc.model = #model, kvc.target = #target}

// Tests that an invalid description names the JSON field.
// BAD: error: {{.*}}bad-target.json: tiers[1].read_gbs: expected a positive number, got -3

module {
}

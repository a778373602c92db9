// RUN: kvc-opt %s --split-input-file --kvc-import-model=%inputs/long-context/config.json --kvc-attach-target=%kvc_src/targets/cpu-2core.json --kvc-estimate --verify-diagnostics
// RUN: kvc-opt %s --split-input-file --kvc-import-model=%inputs/long-context/config.json --kvc-attach-target=%kvc_src/targets/cpu-2core.json --kvc-expand --kvc-estimate --verify-diagnostics

// Tests that a plan predicted to take longer than kvc.time_ns (int64
// nanoseconds) can hold is an error, not a wrapped negative time: a billion
// tokens recomputed on two CPU cores, for a Llama-3.1-8B-shaped model whose
// context is stretched to 2^62 positions.

// expected-error @+1 {{'kvc.plan' op is predicted to take 1.259370e+12 s, beyond the 9.200000e+09 s that kvc.time_ns (int64 nanoseconds) holds}}
kvc.plan @p tokens 0 to 1073741824 layers 0 to 32 {
  kvc.segment compute tokens 0 to 1073741824 layers 0 to 32
}

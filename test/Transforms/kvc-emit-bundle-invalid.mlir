// RUN: rm -f %t.json
// RUN: kvc-opt %s --kvc-emit-bundle=file=%t.json -verify-diagnostics -o /dev/null
// RUN: not test -e %t.json

#kv = #kvc.source<tier = "dram", form = kv, tokens = 0 to 64, layers = 0 to 1>

// Tests that a plan not yet scheduled into tasks is refused and that no
// bundle is written.
// expected-error @below {{is not scheduled (holds 'kvc.segment'); run kvc-schedule before kvc-emit-bundle}}
kvc.plan @unscheduled tokens 0 to 64 layers 0 to 1 {
  kvc.segment load_kv tokens 0 to 64 layers 0 to 1 from #kv
}

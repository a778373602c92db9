// RUN: rm -f %t.json
// RUN: kvc-opt %s --split-input-file --kvc-emit-bundle=file=%t.json -verify-diagnostics -o /dev/null
// RUN: not test -e %t.json

#kv = #kvc.source<tier = "dram", form = kv, tokens = 0 to 64, layers = 0 to 1>

// Tests that a plan not yet scheduled into tasks is refused, naming the
// passes it still needs, and that no bundle is written.
// expected-error @below {{is not scheduled (holds 'kvc.segment'); run kvc-expand, kvc-fuse and kvc-schedule (or --kvc-restore-pipeline) before kvc-emit-bundle}}
kvc.plan @unscheduled tokens 0 to 64 layers 0 to 1 {
  kvc.segment load_kv tokens 0 to 64 layers 0 to 1 from #kv
}

// -----

#kv = #kvc.source<tier = "dram", form = kv, tokens = 0 to 64, layers = 0 to 1>

// Tests that an expanded plan whose steps are not yet tasks names the one
// pass it still needs.
// expected-error @below {{is not scheduled (holds 'kvc.fetch'); run kvc-schedule (or --kvc-restore-pipeline) before kvc-emit-bundle}}
kvc.plan @expanded tokens 0 to 64 layers 0 to 1 {
  %0 = kvc.fetch #kv tokens 0 to 64 layers 0 to 1 : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
  %1 = kvc.transfer_to_device %0
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  kvc.scatter %1 : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
}

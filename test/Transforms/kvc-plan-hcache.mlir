// RUN: kvc-opt %s --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-plan=strategy=hcache | FileCheck %s --check-prefix=A100
// RUN: sed s/ssd/net/g %s | kvc-opt --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%inputs/balanced.json --kvc-plan=strategy=hcache | FileCheck %s --check-prefix=IOBOUND
// RUN: sed 's/layers = 0 to 32>/layers = 0 to 32, layer_group = 4>/' %s | kvc-opt --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-plan=strategy=hcache | FileCheck %s --check-prefix=GROUPED
// RUN: sed -e s/ssd/net/g -e 's/layers = 0 to 32>/layers = 0 to 32, layer_group = 4>/' %s | kvc-opt --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%inputs/balanced.json --kvc-plan=strategy=hcache | FileCheck %s --check-prefix=GROUPED-IOBOUND

// Tests that on HCache's testbed (Llama-2-7B on an A100-40GB with four SSDs),
// where projecting hidden states is the bottleneck, a few layers load KV to
// fill the bubble (HCache Table 3 reports 31 H + 1 KV).
// A100-LABEL: kvc.plan @chat tokens 0 to 4096 layers 0 to 32 strategy "hcache"
// A100-NEXT:    kvc.segment load_kv tokens 0 to 4096 layers 0 to 3 from #[[KV:.+]]
// A100-NEXT:    kvc.segment load_hidden tokens 0 to 4096 layers 3 to 32 from #[[HIDDEN:.+]]

// Tests that when IO is the bottleneck the complement is recomputing the
// first layers from tokens.
// IOBOUND-LABEL: kvc.plan @chat tokens 0 to 4096 layers 0 to 32 strategy "hcache"
// IOBOUND-NEXT:    kvc.segment compute tokens 0 to 4096 layers 0 to 8
// IOBOUND-NEXT:    kvc.segment load_hidden tokens 0 to 4096 layers 8 to 32 from

// Tests that with four layers per stored object the partition moves to an
// object boundary, as a load reads whole objects: 4 KV layers instead of 3
// (the IO-bound partition, 8 recomputed layers, is on one already).
// GROUPED-LABEL: kvc.plan @chat tokens 0 to 4096 layers 0 to 32 strategy "hcache"
// GROUPED-NEXT:    kvc.segment load_kv tokens 0 to 4096 layers 0 to 4 from
// GROUPED-NEXT:    kvc.segment load_hidden tokens 0 to 4096 layers 4 to 32 from
// GROUPED-IOBOUND-LABEL: kvc.plan @chat tokens 0 to 4096 layers 0 to 32 strategy "hcache"
// GROUPED-IOBOUND-NEXT:    kvc.segment compute tokens 0 to 4096 layers 0 to 8
// GROUPED-IOBOUND-NEXT:    kvc.segment load_hidden tokens 0 to 4096 layers 8 to 32 from

kvc.restore @chat tokens 0 to 4096 from [
    #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 4096, layers = 0 to 32>,
    #kvc.source<tier = "ssd", form = kv, tokens = 0 to 4096, layers = 0 to 32>]

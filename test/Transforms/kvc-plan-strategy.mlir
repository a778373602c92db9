// RUN: kvc-opt %s --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-plan=strategy=cake | FileCheck %s --check-prefix=CAKE
// RUN: kvc-opt %s --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-plan=strategy=hcache | FileCheck %s --check-prefix=HCACHE
// RUN: kvc-opt %s --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-plan=strategy=compute | FileCheck %s --check-prefix=COMPUTE
// RUN: kvc-opt %s --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-plan=strategy=hidden | FileCheck %s --check-prefix=HIDDEN
// RUN: kvc-opt %s --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-plan=strategy=kv | FileCheck %s --check-prefix=KV

// Tests that kvc-plan{strategy} plans the named baseline instead of the joint
// plan, each the best of its kind for the same request (the plans kvc-run
// compare runs side by side).

// CAKE-LABEL: kvc.plan @chat tokens 0 to 4096 layers 0 to 32 strategy "cake"
// CAKE-NEXT:    kvc.segment compute tokens 0 to [[M:[0-9]+]] layers 0 to 32
// CAKE-NEXT:    kvc.segment load_kv tokens [[M]] to 4096 layers 0 to 32 from #[[SRC:.+]]
// CAKE-NEXT:  }

// HCACHE-LABEL: kvc.plan @chat tokens 0 to 4096 layers 0 to 32 strategy "hcache"
// HCACHE:         kvc.segment load_hidden tokens 0 to 4096 layers [[K:[0-9]+]] to 32

// COMPUTE-LABEL: kvc.plan @chat tokens 0 to 4096 layers 0 to 32 strategy "compute"
// COMPUTE-NEXT:    kvc.segment compute tokens 0 to 4096 layers 0 to 32
// COMPUTE-NEXT:  }

// HIDDEN-LABEL: kvc.plan @chat tokens 0 to 4096 layers 0 to 32 strategy "hidden"
// HIDDEN-NEXT:    kvc.segment load_hidden tokens 0 to 4096 layers 0 to 32
// HIDDEN-NEXT:  }

// KV-LABEL: kvc.plan @chat tokens 0 to 4096 layers 0 to 32 strategy "kv"
// KV-NEXT:    kvc.segment load_kv tokens 0 to 4096 layers 0 to 32
// KV-NEXT:  }
kvc.restore @chat tokens 0 to 4096 from [
    #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 4096, layers = 0 to 32>,
    #kvc.source<tier = "dram", form = kv, codec = <quant = int8, lossless = deflate>,
                tokens = 0 to 4096, layers = 0 to 32>]

// RUN: kvc-opt %s --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%inputs/balanced.json --kvc-plan=strategy=cake | FileCheck %s --check-prefix=BALANCED
// RUN: kvc-opt %s --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%inputs/fast-io.json --kvc-plan=strategy=cake | FileCheck %s --check-prefix=FASTIO
// RUN: kvc-opt %s --kvc-import-model=%kvc_src/examples/models/llama-3.1-8b/config.json --kvc-attach-target=%inputs/balanced.json --kvc-plan=strategy=cake | FileCheck %s --check-prefix=GQA
// RUN: kvc-opt %s --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%inputs/balanced.json "--kvc-plan=strategy=cake chunk-tokens=256" | FileCheck %s --check-prefix=FINE
// RUN: kvc-opt %s --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json --kvc-attach-target=%inputs/slow-link.json --kvc-plan=strategy=cake | FileCheck %s --check-prefix=SLOW

// Tests that on a balanced machine (loading all KV takes as long as
// recomputing it) Cake meets in the middle, that with IO 20x faster it loads
// everything, and that a GQA model (4x less KV per token) computes less.
// BALANCED-LABEL: kvc.plan @chat tokens 0 to 4096 layers 0 to 32 strategy "cake"
// BALANCED-NEXT:    kvc.segment compute tokens 0 to 2048 layers 0 to 32
// BALANCED-NEXT:    kvc.segment load_kv tokens 2048 to 4096 layers 0 to 32 from #[[SRC:.+]]
// FASTIO-LABEL: kvc.plan @chat tokens 0 to 4096 layers 0 to 32 strategy "cake"
// FASTIO-NEXT:    kvc.segment load_kv tokens 0 to 4096 layers 0 to 32 from
// FASTIO-NEXT:  }
// GQA-LABEL: kvc.plan @chat tokens 0 to 4096 layers 0 to 32 strategy "cake"
// GQA-NEXT:    kvc.segment compute tokens 0 to 512 layers 0 to 32
// GQA-NEXT:    kvc.segment load_kv tokens 512 to 4096 layers 0 to 32 from

// Tests that the merge point lies on the chunk grid it is given, and that
// smaller chunks, whose GEMMs run further below peak, shift work to loading
// (Cake Table 4).
// FINE-LABEL: kvc.plan @chat
// FINE-NEXT:    kvc.segment compute tokens 0 to 1792 layers 0 to 32

kvc.restore @chat tokens 0 to 4096 from [
    #kvc.source<tier = "net", form = kv, tokens = 0 to 4096, layers = 0 to 32>]

// Tests that with a hopeless link (Cake Table 5's 0.99x case) Cake falls back
// to computing everything rather than paying for a few loads.
// SLOW-LABEL: kvc.plan @chat tokens 0 to 4096 layers 0 to 32 strategy "cake"
// SLOW-NEXT:    kvc.segment compute tokens 0 to 4096 layers 0 to 32
// SLOW-NEXT:  }


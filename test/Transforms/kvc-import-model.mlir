// RUN: kvc-opt %s --kvc-import-model=%kvc_src/examples/models/llama-2-7b/config.json | FileCheck %s --check-prefix=MHA
// RUN: kvc-opt %s --kvc-import-model=path=%kvc_src/examples/models/llama-3.1-8b/config.json | FileCheck %s --check-prefix=GQA
// RUN: kvc-opt %s --pass-pipeline='builtin.module(kvc-import-model{path=%kvc_src/examples/models/llama-3.1-8b/config.json})' | FileCheck %s --check-prefix=GQA
// RUN: not kvc-opt %s --kvc-import-model=%inputs/malformed/config.json 2>&1 | FileCheck %s --check-prefix=MALFORMED
// RUN: not kvc-opt %s --kvc-import-model=%inputs/unsupported/config.json 2>&1 | FileCheck %s --check-prefix=UNSUP
// RUN: not kvc-opt %s --kvc-import-model=%inputs/missing-field/config.json 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not kvc-opt %s --kvc-import-model=%inputs/no-such-model/config.json 2>&1 | FileCheck %s --check-prefix=NOFILE
// RUN: not kvc-opt %s --kvc-import-model 2>&1 | FileCheck %s --check-prefix=NOPATH

// Tests that Llama-2-7B (multi-head attention, fp16) imports with one KV head
// per attention head and the default RoPE base.
// MHA: #[[MODEL:.+]] = #kvc.model<name = "meta-llama/Llama-2-7b-hf", layers = 32, hidden = 4096, heads = 32, kv_heads = 32, head_dim = 128, ffn = 11008, vocab = 32000, max_positions = 4096, rope_theta = 10000, dtype = f16>
// MHA: module attributes {kvc.model = #[[MODEL]]}

// Tests that Llama-3.1-8B (grouped-query attention, bf16) imports with 8 KV
// heads, its RoPE base and its 128K context; the name falls back to the
// directory.
// GQA: #[[MODEL:.+]] = #kvc.model<name = "llama-3.1-8b", layers = 32, hidden = 4096, heads = 32, kv_heads = 8, head_dim = 128, ffn = 14336, vocab = 128256, max_positions = 131072, rope_theta = 500000, dtype = bf16>
// GQA: module attributes {kvc.model = #[[MODEL]]}

// Tests that malformed JSON, unsupported architectures, missing fields,
// missing files and a missing path are errors that name the problem.
// MALFORMED: error: {{.*}}malformed/config.json: invalid JSON: parse error at line 6
// UNSUP: error: {{.*}}unsupported/config.json: mlp_bias: biased MLP projections are not supported
// MISSING: error: {{.*}}missing-field/config.json: num_attention_heads: missing required field
// NOFILE: error: {{.*}}no-such-model/config.json: cannot open file
// NOPATH: error: kvc-import-model needs a path: --kvc-import-model=FILE.json

module {
}

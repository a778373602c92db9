// RUN: rm -rf %t && mkdir -p %t
// RUN: kvc-run gen-model --out %t/model --layers 4 --hidden 128 --heads 4 --kv-heads 2 --ffn 256 --vocab 512 --seed 1
// RUN: kvc-run save --model %t/model --store file://%t/store --random-tokens 1024 --seed 3 --forms kv,hidden
// RUN: kvc-opt %s --kvc-import-model=%t/model/config.json --kvc-attach-target=%kvc_src/targets/cpu-2core.json --kvc-expand=chunk-tokens=128 --kvc-fuse --kvc-schedule --kvc-estimate --kvc-emit-bundle=file=%t/plans.json -o /dev/null
// RUN: kvc-run restore --model %t/model --store file://%t/store --random-tokens 1024 --seed 3 --bundle %t/plans.json --plan compute --verify | FileCheck %s --check-prefix=COMPUTE
// RUN: kvc-run restore --model %t/model --store file://%t/store --random-tokens 1024 --seed 3 --bundle %t/plans.json --plan cake --verify --trace %t/trace.json | FileCheck %s --check-prefix=CAKE
// RUN: kvc-run restore --model %t/model --store file://%t/store --random-tokens 1024 --seed 3 --bundle %t/plans.json --plan hcache --verify | FileCheck %s --check-prefix=HCACHE

// Tests that plans compiled by kvc-opt run in the runtime and restore the
// exact cache (within bf16 rounding of a full prefill) with each method:
// recompute, Cake's token split (compute the front, load KV for the rest)
// and HCache's layer split (hidden states projected for three layers, KV for
// the fourth); the plans' 128-token chunks straddle the store's 256-token
// objects. Each measure is printed beside the plan's value: FLOPs, and the
// busy time and bytes kvc-estimate predicted. A plan that recomputes through
// L layers is held to sqrt(1 + L) bf16 roundings on average (4 layers:
// 0.00873; a projection: 0.00552), one that loads to one (0.00391).
// COMPUTE: restored 1024 tokens with plan compute: {{.*}} ms measured, {{.*}} ms predicted, [[GFLOP:[0-9.]+]] GFLOP (plan: [[GFLOP]])
// COMPUTE: busy compute {{[0-9.]+}} ms (predicted {{[0-9.]+}} ms)
// COMPUTE: verify: against a full prefill, max error {{.*}} (bound 0.00781), relative L2 {{.*}} (bound 0.00873): ok
// CAKE: busy io:dram {{[0-9.]+}} ms (predicted {{[0-9.]+}} ms)
// CAKE: read dram {{[0-9.]+}} MB (predicted {{[0-9.]+}} MB)
// CAKE: trace: {{.*}}trace.json
// CAKE: verify: against a full prefill, max error {{.*}} (bound 0.00781), relative L2 {{.*}} (bound 0.00873): ok
// HCACHE-NOT: fallback
// HCACHE: verify: against a full prefill, max error {{.*}} (bound 0.00781), relative L2 {{.*}} (bound 0.00552): ok

// Tests --dump-kv: the restored K and V of every layer and the request's
// tokens, in safetensors, for another implementation to hold its own KV
// against (scripts/hf-reference.py --kv); HCache's restore within bf16
// rounding of the recomputed one.
// RUN: kvc-run restore --model %t/model --store file://%t/store --random-tokens 1024 --seed 3 --bundle %t/plans.json --plan compute --dump-kv %t/compute.safetensors | FileCheck %s --check-prefix=DUMP
// RUN: kvc-run restore --model %t/model --store file://%t/store --random-tokens 1024 --seed 3 --bundle %t/plans.json --plan hcache --dump-kv %t/hcache.safetensors
// RUN: %python %kvc_src/test/lit-tools/kv-dump.py %t/hcache.safetensors --against %t/compute.safetensors --max-error 0.0079 | FileCheck %s --check-prefix=DUMPED
// DUMP: K and V: {{.*}}compute.safetensors
// DUMPED: tokens 1024, layers 4, kv heads 2, head dim 32
// DUMPED-NEXT: max error {{.*}} (bound 0.0079): ok

// Tests that compare runs and verifies every plan of the bundle and prints
// one table: predicted time, the fastest of --repeat runs and how far it is
// from the prediction, the median run, and the speedup of each plan over
// every other. The fallback column (fallbk) is matched by position: no plan
// fell back.
// RUN: kvc-run compare --model %t/model --store file://%t/store --random-tokens 1024 --seed 3 --bundle %t/plans.json --repeat 2 | FileCheck %s --check-prefix=COMPARE
// COMPARE:      plan       predicted ms fastest ms    off  median ms    read MB     GFLOP fallbk  max error  L2 error vs compute    vs cake  vs hcache
// COMPARE-NEXT: compute{{ +[0-9.]+ +[0-9.]+ +[-+][0-9]+% +[0-9.]+ +[0-9.]+ +[0-9.]+ +}}0{{ +[0-9.e-]+ +[0-9.e-]+}}      1.00x
// COMPARE-NEXT: cake{{ +[0-9.]+ +[0-9.]+ +[-+][0-9]+% +[0-9.]+ +[0-9.]+ +[0-9.]+ +}}0{{ +[0-9.e-]+ +[0-9.e-]+}}{{.*}}      1.00x
// COMPARE-NEXT: hcache{{ +[0-9.]+ +[0-9.]+ +[-+][0-9]+% +[0-9.]+ +[0-9.]+ +[0-9.]+ +}}0{{ +[0-9.e-]+ +[0-9.e-]+}}{{.*}}      1.00x
// COMPARE-NEXT: (of 2 runs each: off and the speedups compare the fastest runs; every run was verified, the errors are the worst)
// COMPARE-NEXT: verify: every plan within what its codecs allow of a full prefill: ok

// Tests Cake's dynamic mode: the sides meet where this run puts them, the
// compiler's merge point is printed beside it, and the cache is exact (also
// once the KV objects are deleted, below).
// RUN: kvc-run cake --model %t/model --store file://%t/store --random-tokens 1024 --seed 3 --predicted-merge 384 --verify | FileCheck %s --check-prefix=DYNAMIC
// DYNAMIC: restored 1024 tokens with dynamic Cake: {{.*}}; merge point at token {{[0-9]+}} (compiler: 384)
// DYNAMIC-NEXT: verify: against a full prefill, max error {{.*}} (bound 0.00781), relative L2 {{.*}} (bound 0.00873): ok

// Tests that a compiled Cake plan runs in the dynamic mode on its own tier
// and lanes, starting from its merge point (384) as the prediction, and
// restores the exact cache. (Where the sides meet depends on this run's
// timing; DynamicCakeTest checks that a slow store moves it.) Plans without
// Cake's shape are refused.
// RUN: kvc-run restore --model %t/model --store file://%t/store --random-tokens 1024 --seed 3 --bundle %t/plans.json --plan cake --dynamic --verify | FileCheck %s --check-prefix=PLAN-DYNAMIC
// PLAN-DYNAMIC: restored 1024 tokens with dynamic Cake: {{.*}}; merge point at token {{[0-9]+}} (plan cake: 384)
// PLAN-DYNAMIC-NEXT: verify: against a full prefill, max error {{.*}}: ok
// RUN: not kvc-run restore --model %t/model --store file://%t/store --random-tokens 1024 --seed 3 --bundle %t/plans.json --plan hcache --dynamic 2>&1 | FileCheck %s --check-prefix=NOT-CAKE
// NOT-CAKE: kvc-run restore: invalid_argument: plan hcache has no dynamic Cake mode: it loads hidden states

// Tests that deleted objects (every stored KV chunk) are recomputed and
// reported, and that the cache is still exact.
// RUN: rm -r %t/store/*/kv/0-4
// RUN: kvc-run restore --model %t/model --store file://%t/store --random-tokens 1024 --seed 3 --bundle %t/plans.json --plan cake --verify | FileCheck %s --check-prefix=FALLBACK
// FALLBACK: fallback: kv tokens 384 to 512, layers 0 to 4 recomputed: not_found: {{.*}}/raw (the plan loads it as raw; the store holds no encoding of it)
// FALLBACK: verify: against a full prefill, max error {{.*}} (bound 0.00781), relative L2 {{.*}} (bound 0.00873): ok
// RUN: kvc-run cake --model %t/model --store file://%t/store --random-tokens 1024 --seed 3 --verify | FileCheck %s --check-prefix=DYNAMIC-GONE
// DYNAMIC-GONE: restored 1024 tokens with dynamic Cake: {{.*}} loaded 0;
// DYNAMIC-GONE: verify: against a full prefill, max error {{.*}} (bound 0.00781), relative L2 {{.*}} (bound 0.00873): ok

// Tests that a truncated bundle, a missing plan and a request of another
// length are refused with clear errors.
// Tests that a plan never silently restores another encoding than it was
// compiled for: from a store that holds the same context as int2 only, the
// plans (which load raw KV) find no raw object, recompute every chunk, and
// stay within the lossless bound; so does the dynamic walk of the Cake plan.
// RUN: kvc-run save --model %t/model --store file://%t/int2 --random-tokens 1024 --seed 3 --forms kv,hidden --codec int2
// RUN: kvc-run restore --model %t/model --store file://%t/int2 --random-tokens 1024 --seed 3 --bundle %t/plans.json --plan cake --verify | FileCheck %s --check-prefix=OTHER-CODEC
// RUN: kvc-run restore --model %t/model --store file://%t/int2 --random-tokens 1024 --seed 3 --bundle %t/plans.json --plan cake --dynamic --verify | FileCheck %s --check-prefix=OTHER-CODEC
// OTHER-CODEC: fallback: kv tokens {{.*}} recomputed: not_found: {{.*}}: no object {{[0-9a-f]+}}/kv/{{[0-9]+-[0-9]+}}/raw (the plan loads it as raw; the store holds it as int2/g32)
// OTHER-CODEC: verify: against a full prefill, max error {{.*}} (bound 0.00781), relative L2 {{.*}} (bound 0.00873): ok

// Tests that saving the context raw beside its int2 objects keeps both
// encodings and says so, after which the plan loads raw with no fallback,
// and that Cake's walk without a plan asks which encoding to load.
// RUN: kvc-run save --model %t/model --store file://%t/int2 --random-tokens 1024 --seed 3 --forms kv,hidden | FileCheck %s --check-prefix=BOTH
// BOTH: with codec raw: 8 objects written, 0 already stored
// BOTH: the store also holds kv of tokens 0 to 1024 with codec int2/g32
// BOTH: the store also holds hidden of tokens 0 to 1024 with codec int2/g32
// RUN: not kvc-run cake --model %t/model --store file://%t/int2 --random-tokens 1024 --seed 3 2>&1 | FileCheck %s --check-prefix=TWO-CODECS
// TWO-CODECS: kvc-run cake: invalid_argument: the store holds the request's KV with codecs int2/g32 and raw: pick one with --codec
// RUN: kvc-run restore --model %t/model --store file://%t/int2 --random-tokens 1024 --seed 3 --bundle %t/plans.json --plan cake --verify | FileCheck %s --check-prefix=REPLACED
// REPLACED-NOT: fallback
// REPLACED: verify: against a full prefill

// Tests that a store records the layout it was saved with and a restore
// reads it; a restore is told no layout (the Connector reads the store's),
// not even the right one.
// RUN: kvc-run save --model %t/model --store file://%t/layout --random-tokens 1024 --seed 3 --forms kv --chunk-tokens 128 --layer-group 2
// RUN: ls %t/layout/layouts/* | FileCheck %s --check-prefix=RECORD
// RECORD: {{^}}128x2{{$}}
// RUN: kvc-run restore --model %t/model --store file://%t/layout --random-tokens 1024 --seed 3 --bundle %t/plans.json --plan cake --verify | FileCheck %s --check-prefix=LAYOUT
// LAYOUT-NOT: fallback
// LAYOUT: verify: against a full prefill{{.*}}: ok
// RUN: not kvc-run restore --model %t/model --store file://%t/layout --chunk-tokens 128 --layer-group 2 --random-tokens 1024 --seed 3 --bundle %t/plans.json --plan cake 2>&1 | FileCheck %s --check-prefix=OTHER-LAYOUT
// OTHER-LAYOUT: kvc-run restore: invalid_argument: --chunk-tokens and --layer-group: the Connector reads the store's layout from the store

// RUN: head -c 100 %t/plans.json > %t/truncated.json
// RUN: not kvc-run restore --model %t/model --store file://%t/store --random-tokens 1024 --bundle %t/truncated.json 2>&1 | FileCheck %s --check-prefix=TRUNCATED
// TRUNCATED: kvc-run restore: invalid_argument: {{.*}}truncated.json: invalid JSON: parse error
// RUN: not kvc-run restore --model %t/model --store file://%t/store --random-tokens 1024 --bundle %t/plans.json 2>&1 | FileCheck %s --check-prefix=NOPLAN
// NOPLAN: holds several plans: name one with --plan
// RUN: not kvc-run restore --model %t/model --store file://%t/store --random-tokens 512 --bundle %t/plans.json --plan cake 2>&1 | FileCheck %s --check-prefix=LENGTH
// LENGTH: restore: plan cake covers tokens 0 to 1024, the request has 512
// RUN: not kvc-run restore --model %t/model --store file://%t/store --random-tokens 2048 --seed 3 --bundle %t/plans.json --plan cake 2>&1 | FileCheck %s --check-prefix=SHORT
// SHORT: kvc-run restore: invalid_argument: plan cake restores 1024 of the request's 2048 tokens; a measured run restores them all

#kv = #kvc.source<tier = "dram", form = kv, tokens = 0 to 1024, layers = 0 to 4>
#hid = #kvc.source<tier = "dram", form = hidden, tokens = 0 to 1024, layers = 0 to 4>
kvc.plan @compute tokens 0 to 1024 layers 0 to 4 {
  kvc.segment compute tokens 0 to 1024 layers 0 to 4
}
kvc.plan @cake tokens 0 to 1024 layers 0 to 4 {
  kvc.segment compute tokens 0 to 384 layers 0 to 4
  kvc.segment load_kv tokens 384 to 1024 layers 0 to 4 from #kv
}
kvc.plan @hcache tokens 0 to 1024 layers 0 to 4 {
  kvc.segment load_hidden tokens 0 to 1024 layers 0 to 3 from #hid
  kvc.segment load_kv tokens 0 to 1024 layers 3 to 4 from #kv
}

// Tests that kvc-opt names the bundle's model by its fingerprint when the
// weights sit beside the config.json it imports, so that a model of the same
// shape with other weights is refused rather than run with predictions made
// for another model.
// RUN: %python -c "import json; print(json.load(open('%t/plans.json'))['model_fingerprint'])" | FileCheck %s --check-prefix=NAMED
// NAMED: {{^[0-9a-f]{64}$}}
// RUN: kvc-run gen-model --out %t/twin --layers 4 --hidden 128 --heads 4 --kv-heads 2 --ffn 256 --vocab 512 --seed 2
// RUN: not kvc-run restore --model %t/twin --store file://%t/store --random-tokens 1024 --seed 3 --bundle %t/plans.json --plan compute 2>&1 | FileCheck %s --check-prefix=TWIN
// TWIN: kvc-run restore: failed_precondition: {{.*}}plans.json: the plan bundle was compiled for model {{[0-9a-f]+}}, not {{[0-9a-f]+}}

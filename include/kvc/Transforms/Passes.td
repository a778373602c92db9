//===- Passes.td - kvc passes ------------------------------*- tablegen -*-===//

#ifndef KVC_TRANSFORMS_PASSES_TD
#define KVC_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def KVCImportModelPass : Pass<"kvc-import-model", "::mlir::ModuleOp"> {
  let summary = "Attaches a Hugging Face config.json as the module's #kvc.model";
  let description = [{
    Reads a Llama-family `config.json` (layers, hidden size, heads, KV heads,
    head dimension, MLP width, vocabulary, context length, RoPE base, dtype)
    and attaches it to the module as `kvc.model`, replacing any model already
    there. Missing fields, wrong JSON types and architectures kvc does not
    implement (biased projections, sliding windows, other activations) fail
    the pass with a message naming the field. Where the checkpoint's
    safetensors sit beside the `config.json`, the model's `fingerprint` is
    the one the runtime gives it (its shape and a SHA-256 of its weights), so
    that a bundle compiled for it names it and is refused for any other
    model; unreadable weights fail the pass. The path may be given bare:
    `--kvc-import-model=models/llama-2-7b/config.json`.

    Before:
    ```mlir
    module {}
    ```
    After `--kvc-import-model=llama-2-7b/config.json`:
    ```mlir
    module attributes {kvc.model = #kvc.model<name = "meta-llama/Llama-2-7b-hf",
        layers = 32, hidden = 4096, heads = 32, kv_heads = 32, head_dim = 128,
        ffn = 11008, vocab = 32000, max_positions = 4096, rope_theta = 10000,
        dtype = f16>} {}
    ```
  }];
  let dependentDialects = ["::kvc::compiler::KVCDialect"];
  let options = [
    Option<"path", "path", "std::string", /*default=*/"\"\"",
           "Path of the Hugging Face config.json">,
  ];
}

def KVCAttachTargetPass : Pass<"kvc-attach-target", "::mlir::ModuleOp"> {
  let summary = "Attaches a hardware description as the module's #kvc.target";
  let description = [{
    Reads a target description (schema `kvc-target/1`, documented in
    docs/targets.md; the shipped ones are in targets/) and attaches it to
    the module as `kvc.target`, replacing any target already there. An
    invalid file fails the pass with a message naming the JSON field. The
    path may be given bare: `--kvc-attach-target=targets/h100-sxm.json`.

    Before:
    ```mlir
    module {}
    ```
    After `--kvc-attach-target=targets/cpu-2core.json` (abridged):
    ```mlir
    module attributes {kvc.target = #kvc.target<name = "cpu-2core",
        compute = <kind = cpu, name = "2x Xeon @ 2.5GHz (AVX-512)",
                   dense_tflops = 0.32, mem_gbs = 10, mem_gib = 24,
                   restore_share = 1>,
        host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
        link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>,
        tiers = [#kvc.tier<name = "dram", kind = dram, read_gbs = 10,
                           write_gbs = 10, latency_us = 1>]>} {}
    ```
  }];
  let dependentDialects = ["::kvc::compiler::KVCDialect"];
  let options = [
    Option<"path", "path", "std::string", /*default=*/"\"\"",
           "Path of the target description (JSON)">,
  ];
}

//===----------------------------------------------------------------------===//
// Planning
//===----------------------------------------------------------------------===//

/// Options every pass that consults the cost model takes.
defvar KVC_CostModelOptions = [
  Option<"codecProfile", "codec-profile", "std::string", /*default=*/"\"\"",
         "Codec profile (kvc-codec-profile/1 JSON); empty for the built-in "
         "estimate">,
  Option<"chunkTokens", "chunk-tokens", "int64_t", /*default=*/"0",
         "Tokens per chunk; 0 chooses from the target">,
  Option<"stagingMiB", "staging-mib", "int64_t", /*default=*/"256",
         "Host staging memory for fetched chunks, MiB">,
  Option<"layerWise", "layer-wise", "bool", /*default=*/"false",
         "Plan restores for a server that runs its forward pass beside "
         "them, layer by layer: loads as deep as the stored objects (at most "
         "16 layer groups), issued layer by layer so the first layers "
         "complete early; saves and transfers issue their objects layer "
         "group by layer group, as a prefill of the whole request in one "
         "step completes them">,
  Option<"candidates", "candidates", "int", /*default=*/"4",
         "Analytic candidates the planner's search times with the "
         "simulator">,
];

/// Options every pass that plans a kvc.restore takes.
defvar KVC_RestorePlanningOptions = !listconcat(KVC_CostModelOptions, [
  Option<"allowSloMiss", "allow-slo-miss", "bool", /*default=*/"false",
         "Keep the fastest plan, with a warning, when it takes longer than "
         "the request's slo_ms (otherwise that is an error)">,
]);

def KVCSelectCodecPass : Pass<"kvc-select-codec", "::mlir::ModuleOp"> {
  let summary = "Chooses codecs under latency, SLO and quality budgets (KVServe)";
  let description = [{
    KVServe's codec selection. A `kvc.save` or `kvc.transfer` without a
    codec gets the fastest codec of the profile (transform x quantization x
    lossless coder, or raw data) whose error is within `max_error` (0 when
    absent: lossless codecs only) and whose latency is within `slo_ms`;
    a Hadamard codec only when the model's rows rotate (head_dim a power of
    two for KV). Latency follows KVServe's model: host encoding, the encoded
    bytes over the tier's write bandwidth (save) or the NIC (transfer), and
    decoding.
    When no codec is feasible the op is rejected, naming the fastest codec
    within the error budget and the fastest overall. For a `kvc.restore`
    that stores the same data in several encodings, sources beyond the error
    budget or slower to load than another encoding are dropped, with a
    remark each. The profile is the built-in estimate unless
    `codec-profile` names a measured one (docs/planning.md).

    Before (on a target whose network tier writes at 0.05 GB/s):
    ```mlir
    kvc.save @doc tokens 0 to 4096 kv to "net" {max_error = 0.12}
    ```
    After:
    ```mlir
    kvc.save @doc tokens 0 to 4096 kv to "net"
        codec <quant = int4, group = 128, lossless = zstd> {max_error = 0.12}
    ```
  }];
  let dependentDialects = ["::kvc::compiler::KVCDialect"];
  let options = KVC_CostModelOptions;
}

def KVCPlanPass : Pass<"kvc-plan", "::mlir::ModuleOp"> {
  let summary = "Plans restores jointly over tokens, layers and codecs";
  let description = [{
    The joint planner: tokens x layers x codecs together. It searches plans
    of the form compute `[0, m)` for every layer, then for `[m, T)` a
    complement (compute or KV load) for layers `[0, k)` and hidden states or
    KV for `[k, L)`, choosing among the stored encodings of each form. This
    space holds compute-only, KV-only, hidden-only, Cake and HCache; the
    chosen plan is never slower, by the simulator, than the best of them
    (docs/planning.md describes the search). `report` prints, as a remark,
    one line per baseline and for the chosen plan: makespan, busy time per
    resource and lane, bytes read, FLOPs, and its makespan over the chosen
    plan's (`time/chosen`); then each plan's segments (what it computes and
    loads, from which tier with which codec). When even the chosen plan
    takes longer than the request's `slo_ms` the pass fails, naming the
    plan's time; `allow-slo-miss` keeps that plan with a warning instead
    (every restore-planning pass takes this option).
    `strategy` plans one baseline instead (`kvc-run compare` runs them all);
    a request that stores nothing the baseline loads is an error.

    `strategy=cake` is Cake's split of tokens: recompute `[0, m)` from the
    front while KV for `[m, T)` loads from the back, with `m` on the chunk
    grid where both finish together by the simulator (later tokens cost
    more to compute, so the whole grid is searched rather than a closed
    form); unlike Cake it falls back to one resource when mixing would be
    slower (m = T when loading is hopeless, m = 0 when it is fast).
    `strategy=hcache` is HCache's split of layers: hidden states for layers
    `[k, L)`, projected to K and V on the device, and a complement for
    `[0, k)`, KV loads when projection is the bottleneck and recomputing the
    first layers from tokens when IO is; k is chosen with the simulator
    (HCache solves for it in closed form, section 4.1.2), which also sees
    pipeline fill, lanes and staging limits. Loads begin and end where the
    sources' stored objects do (`layer_group` of `#kvc.source`): a load
    reads whole objects.

    Before (Llama-2-7B on an A100-40GB, hidden states on the SSDs and int8
    KV in host DRAM):
    ```mlir
    kvc.restore @chat tokens 0 to 4096 from [
        #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 4096, layers = 0 to 32>,
        #kvc.source<tier = "dram", form = kv, codec = <quant = int8, lossless = deflate>,
                    tokens = 0 to 4096, layers = 0 to 32>]
    ```
    After:
    ```mlir
    kvc.plan @chat tokens 0 to 4096 layers 0 to 32 strategy "joint" predicted 37729 us {
      kvc.segment compute tokens 0 to 4096 layers 0 to 3
      kvc.segment load_kv tokens 0 to 4096 layers 3 to 32
          from #kvc.source<tier = "dram", form = kv, codec = <quant = int8, lossless = deflate>,
                           tokens = 0 to 4096, layers = 0 to 32>
    }
    ```
  }];
  let dependentDialects = ["::kvc::compiler::KVCDialect"];
  let options = !listconcat(KVC_RestorePlanningOptions, [
    Option<"report", "report", "bool", /*default=*/"false",
           "Print every baseline beside the chosen plan as a remark">,
    Option<"strategy", "strategy", "std::string", /*default=*/"\"joint\"",
           "joint, or one baseline to plan instead: compute, kv, hidden, "
           "cake or hcache (each the best of its kind)">,
  ]);
}

def KVCExpandPass : Pass<"kvc-expand", "::mlir::ModuleOp"> {
  let summary = "Expands plan segments, saves and transfers into per-chunk dataflow";
  let description = [{
    A `kvc.save` becomes a save plan of the same name with strategy "save":
    per stored object (a chunk of its `chunk_tokens` x a group of its
    `layer_group` layers, in token then layer order) and form, the object
    is gathered on the device, transformed and quantized there, copied to
    the host still quantized, compressed and stored, as its codec says (raw
    data when it has none).

    Before:
    ```mlir
    kvc.save @s tokens 0 to 256 kv to "ssd" codec <quant = int8, lossless = zstd>
        {layer_group = 4 : i64}
    ```
    After (one object of 4 layers):
    ```mlir
    kvc.plan @s tokens 0 to 256 layers 0 to 4 strategy "save" {
      %0 = kvc.gather : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, device>
      %1 = kvc.quant %0
          : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, device>
          -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, device, codec <quant = int8>>
      %2 = kvc.transfer_to_host %1
          : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, device, codec <quant = int8>>
          -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, host, codec <quant = int8>>
      %3 = kvc.compress %2
          : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, host, codec <quant = int8>>
          -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, host, codec <quant = int8, lossless = zstd>>
      kvc.store %3 to "ssd"
          : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, host, codec <quant = int8, lossless = zstd>>
    }
    ```

    A `kvc.transfer @t` becomes two plans over the same objects, one per
    node: `@t_send` (strategy "send"), the save steps with each object sent
    to node `to` instead of stored, and `@t_recv` (strategy "receive"), each
    object received from node `from`, decompressed on the host, copied to
    the device still quantized, dequantized, untransformed and scattered.
    Both issue the objects chunk by chunk, each chunk's layer groups in
    turn, as a prefill chunk by chunk completes them; with `layer-wise`,
    layer group by layer group, as a prefill of the whole request in one
    step completes them (so is a kvc.save's plan).

    Before:
    ```mlir
    kvc.transfer @t tokens 0 to 256 from "prefill-0" to "decode-0"
    ```
    After (a raw transfer of one 4-layer object):
    ```mlir
    kvc.plan @t_send tokens 0 to 256 layers 0 to 4 strategy "send" {
      %0 = kvc.gather : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, device>
      %1 = kvc.transfer_to_host %0
          : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, device>
          -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, host>
      kvc.send %1 to "decode-0" : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, host>
    }
    kvc.plan @t_recv tokens 0 to 256 layers 0 to 4 strategy "receive" {
      %0 = kvc.recv from "prefill-0" : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, host>
      %1 = kvc.transfer_to_device %0
          : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, host>
          -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, device>
      kvc.scatter %1 : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, device>
    }
    ```

    A plan that holds segments: every segment is split into the chunks the
    planner simulated (token blocks of `chunk-tokens`, chosen from the
    target's GEMM efficiency when 0, and for loads layer groups that fit a
    quarter of the staging budget, or with `layer-wise` 1/16 of the
    layers), and each chunk's dataflow is emitted in the planner's order:
    by token, or with `layer-wise` each segment's loads layer by layer.
    Loads fetch on the host, decompress there,
    cross the link still quantized, then dequantize, untransform, project
    (hidden states) and scatter on the device. Computed chunks run a chunked
    prefill after every chunk holding their earlier tokens, reading the
    hidden states entering their first layer from the segment's source when
    they start above layer 0.

    Before:
    ```mlir
    kvc.plan @p tokens 0 to 1024 layers 0 to 4 {
      kvc.segment compute tokens 0 to 512 layers 0 to 4
      kvc.segment load_hidden tokens 512 to 1024 layers 0 to 4
          from #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 1024, layers = 0 to 4>
    }
    ```
    After:
    ```mlir
    kvc.plan @p tokens 0 to 1024 layers 0 to 4 {
      %0 = kvc.chunk_compute tokens 0 to 512 layers 0 to 4
          : !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 4, device>
      kvc.scatter %0 : !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 4, device>
      %1 = kvc.fetch #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 1024, layers = 0 to 4>
          tokens 512 to 1024 layers 0 to 4
          : !kvc.chunk<hidden x f16, tokens 512 to 1024, layers 0 to 4, host>
      %2 = kvc.transfer_to_device %1
          : !kvc.chunk<hidden x f16, tokens 512 to 1024, layers 0 to 4, host>
          -> !kvc.chunk<hidden x f16, tokens 512 to 1024, layers 0 to 4, device>
      %3 = kvc.project %2
          : !kvc.chunk<hidden x f16, tokens 512 to 1024, layers 0 to 4, device>
          -> !kvc.chunk<kv x f16, tokens 512 to 1024, layers 0 to 4, device>
      kvc.scatter %3 : !kvc.chunk<kv x f16, tokens 512 to 1024, layers 0 to 4, device>
    }
    ```
  }];
  let dependentDialects = ["::kvc::compiler::KVCDialect"];
  let options = KVC_CostModelOptions;
}

def KVCFusePass : Pass<"kvc-fuse", "::mlir::ModuleOp"> {
  let summary = "Fuses chains of elementwise device steps into kvc.kernel";
  let description = [{
    Folds maximal chains of fusible steps on device chunks of KV, each
    feeding only the next, into one `kvc.kernel` named after its steps
    (dequant -> untransform -> scatter, project -> scatter, ...). A value the
    chain produces for a step outside it becomes the kernel's result; a
    chunk compute that takes it as a prefix does not end the chain, so the
    compute runs after the whole kernel, scatter included. Host decoding and
    copies stay outside, and so do the steps on hidden states other than
    their projection (the runtime's host decode and encode do those). A lone
    scatter of a chunk copied to the device, or a lone gather of one copied
    to the host (a raw chunk loaded or saved), becomes a kernel too: one
    launch can then copy many chunks between the link and the paged cache.

    Before:
    ```mlir
    func.func @f(%g: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <quant = int4>>) {
      %q = kvc.dequant %g
          : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <quant = int4>>
          -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
      kvc.scatter %q : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
      return
    }
    ```
    After:
    ```mlir
    func.func @f(%g: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <quant = int4>>) {
      kvc.kernel "dequant_scatter"(%g)
          : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <quant = int4>>) -> () {
      ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <quant = int4>>):
        %q = kvc.dequant %in
            : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <quant = int4>>
            -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
        kvc.scatter %q : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
      }
      return
    }
    ```
  }];
  let dependentDialects = ["::kvc::compiler::KVCDialect"];
}

def KVCSchedulePass : Pass<"kvc-schedule", "::mlir::ModuleOp"> {
  let summary = "Assigns steps to resources and staging slots as kvc.task";
  let description = [{
    Wraps every top-level step of a dataflow plan in a `kvc.task` on the
    resource that runs it: fetches on the lanes of their tier in turn (as
    HCache stripes chunks over SSDs), host decoding on the decode pool,
    copies on the copy engine, kernels and computes on the compute stream.
    A task runs after the tasks whose values it uses. Staging memory is
    bounded as in ShadowServe: each fetch takes one of
    floor(staging budget / largest fetch) buffer slots until its chunk's copy
    to the device has finished; a fetch reusing a slot waits for that copy,
    so a request larger than the budget runs in rounds.

    Before:
    ```mlir
    kvc.plan @p tokens 0 to 512 layers 0 to 1 {
      %0 = kvc.fetch #kvc.source<tier = "dram", form = kv, tokens = 0 to 512, layers = 0 to 1>
          tokens 0 to 512 layers 0 to 1 : !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 1, host>
      %1 = kvc.transfer_to_device %0
          : !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 1, host>
          -> !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 1, device>
      kvc.scatter %1 : !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 1, device>
    }
    ```
    After:
    ```mlir
    kvc.plan @p tokens 0 to 512 layers 0 to 1 {
      %done, %values = kvc.task on io[0] slot 0 {
        %0 = kvc.fetch #kvc.source<tier = "dram", form = kv, tokens = 0 to 512, layers = 0 to 1>
            tokens 0 to 512 layers 0 to 1 : !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 1, host>
        kvc.yield %0 : !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 1, host>
      } : !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 1, host>
      %done_0, %values_1 = kvc.task on h2d[0] after %done {
        %0 = kvc.transfer_to_device %values
            : !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 1, host>
            -> !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 1, device>
        kvc.yield %0 : !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 1, device>
      } : !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 1, device>
      %done_2 = kvc.task on compute[0] after %done_0 {
        kvc.scatter %values_1 : !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 1, device>
      }
    }
    ```
  }];
  let dependentDialects = ["::kvc::compiler::KVCDialect"];
  let options = KVC_CostModelOptions;
}

def KVCEstimatePass : Pass<"kvc-estimate", "::mlir::ModuleOp"> {
  let summary = "Attaches simulated times to plans and their steps";
  let description = [{
    Times every plan with the planning library's simulator and records it:
    `predicted N us` on the plan and `kvc.time_ns = array<i64: start,
    finish>` on each step or task. A strategy-level plan is simulated as
    the planner simulates it, by chunks of its segments; a dataflow or exec
    plan step by step, each step's cost from the cost model, its
    dependencies from the values and tokens it uses, and fetches holding
    staging memory until their chunk's copy ends. The levels agree: a plan
    predicts the same time before and after kvc-expand and kvc-schedule.

    Two inputs come from outside a plan. The gathers of a plan with a
    `prefill_step` (a save, a transfer's sender) wait until the prefill
    beside it, computing that many tokens a step through every layer, has
    written their chunk's last layer (the layers below it, then its Q, K
    and V projections); its prediction therefore includes the prefill. A receive plan `X_recv` is timed after its sender `X_send`
    (kvc-expand's two plans of a kvc.transfer): each recv starts no earlier
    than the send of the same object does and takes the wire's time, as
    that send does, so the receiver's predicted layer times include the
    sender's prefill, encoding and link. A recv with no such send starts at
    once.

    Before:
    ```mlir
    kvc.plan @p tokens 0 to 1024 layers 0 to 4 {
      kvc.segment load_kv tokens 0 to 1024 layers 0 to 4
          from #kvc.source<tier = "ssd", form = kv, codec = <quant = int8, lossless = zstd>,
                           tokens = 0 to 1024, layers = 0 to 4>
    }
    ```
    After (a four-layer model on an A100-40GB):
    ```mlir
    kvc.plan @p tokens 0 to 1024 layers 0 to 4 predicted 3686 us {
      kvc.segment load_kv tokens 0 to 1024 layers 0 to 4
          from #kvc.source<tier = "ssd", form = kv, codec = <quant = int8, lossless = zstd>,
                           tokens = 0 to 1024, layers = 0 to 4>
    }
    ```
  }];
  let dependentDialects = ["::kvc::compiler::KVCDialect"];
  let options = KVC_CostModelOptions;
}

//===----------------------------------------------------------------------===//
// Kernel generation
//===----------------------------------------------------------------------===//

def KVCEmitBundlePass : Pass<"kvc-emit-bundle", "::mlir::ModuleOp"> {
  let summary = "Writes the scheduled plans as a plan bundle for the runtime";
  let description = [{
    Serializes every exec-level plan of the module (every `kvc.plan` whose
    body is `kvc.task`s, as `kvc-schedule` leaves it) into one plan bundle,
    the versioned JSON the runtime executes (format in docs/plan-bundle.md):
    per task its resource and lane, the tasks it waits for, the tasks whose
    values it reads, its staging slot, its fused kernel and its steps with
    their chunk's form, token and layer ranges, codec and tier; per plan the
    predicted makespan and per task the predicted times when `kvc-estimate`
    has run. A plan that still holds segments or bare steps fails the pass.
    The IR is left unchanged. `file=-` writes to stdout.

    For example, `--kvc-emit-bundle=file=-` on the plan after `kvc-schedule`
    in the example above prints (abridged; one task shown):
    ```
    {"format": "kvc-plan-bundle", "version": 1, "model_fingerprint": "",
     "plans": [
      {"name": "p", "tokens": [0, 512], "layers": [0, 1], "staging_slots": 1,
       "tasks": [
        {"id": 0, "resource": "io", "lane": 0, "after": [], "inputs": [],
         "slot": 0, "steps": [
          {"op": "fetch", "form": "kv", "tokens": [0, 512], "layers": [0, 1],
           "codec": "raw", "tier": "dram"}
         ]
        }
       ]
      }
     ]
    }
    ```
  }];
  let options = [
    Option<"file", "file", "std::string", /*default=*/"\"-\"",
           "Where to write the bundle (- for stdout)">,
  ];
}

#endif // KVC_TRANSFORMS_PASSES_TD

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
    the pass with a message naming the field. The path may be given bare:
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
  let dependentDialects = ["::mlir::kvc::KVCDialect"];
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
  let dependentDialects = ["::mlir::kvc::KVCDialect"];
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
];

def KVCSelectCodecPass : Pass<"kvc-select-codec", "::mlir::ModuleOp"> {
  let summary = "Chooses codecs under latency, SLO and quality budgets (KVServe)";
  let description = [{
    PLACEHOLDER
  }];
  let dependentDialects = ["::mlir::kvc::KVCDialect"];
  let options = KVC_CostModelOptions;
}

def KVCChooseMergePointPass : Pass<"kvc-choose-merge-point", "::mlir::ModuleOp"> {
  let summary = "Plans restores the Cake way: compute the front, load KV for the back";
  let description = [{
    PLACEHOLDER
  }];
  let dependentDialects = ["::mlir::kvc::KVCDialect"];
  let options = KVC_CostModelOptions;
}

def KVCPartitionLayersPass : Pass<"kvc-partition-layers", "::mlir::ModuleOp"> {
  let summary = "Plans restores the HCache way: hidden states for most layers, a complement for the rest";
  let description = [{
    PLACEHOLDER
  }];
  let dependentDialects = ["::mlir::kvc::KVCDialect"];
  let options = KVC_CostModelOptions;
}

def KVCPlanPass : Pass<"kvc-plan", "::mlir::ModuleOp"> {
  let summary = "Plans restores jointly over tokens, layers and codecs";
  let description = [{
    PLACEHOLDER
  }];
  let dependentDialects = ["::mlir::kvc::KVCDialect"];
  let options = !listconcat(KVC_CostModelOptions, [
    Option<"report", "report", "bool", /*default=*/"false",
           "Print every baseline beside the chosen plan as a remark">,
  ]);
}

def KVCExpandPass : Pass<"kvc-expand", "::mlir::ModuleOp"> {
  let summary = "Expands plan segments into per-chunk dataflow";
  let description = [{
    PLACEHOLDER
  }];
  let dependentDialects = ["::mlir::kvc::KVCDialect"];
  let options = KVC_CostModelOptions;
}

def KVCFusePass : Pass<"kvc-fuse", "::mlir::ModuleOp"> {
  let summary = "Fuses chains of elementwise device steps into kvc.kernel";
  let description = [{
    PLACEHOLDER
  }];
  let dependentDialects = ["::mlir::kvc::KVCDialect"];
}

def KVCSchedulePass : Pass<"kvc-schedule", "::mlir::ModuleOp"> {
  let summary = "Assigns steps to resources and staging slots as kvc.task";
  let description = [{
    PLACEHOLDER
  }];
  let dependentDialects = ["::mlir::kvc::KVCDialect"];
  let options = KVC_CostModelOptions;
}

def KVCEstimatePass : Pass<"kvc-estimate", "::mlir::ModuleOp"> {
  let summary = "Attaches simulated times to plans and their steps";
  let description = [{
    PLACEHOLDER
  }];
  let dependentDialects = ["::mlir::kvc::KVCDialect"];
  let options = KVC_CostModelOptions;
}

#endif // KVC_TRANSFORMS_PASSES_TD

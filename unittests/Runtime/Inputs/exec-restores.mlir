// Restores of the executor fixture's request (300 tokens of exec-model) from
// its store's KV in tier "dram", raw and as int4+zstd, and a plan that loads
// the first 192 tokens as int4+zstd and computes the rest after them:
// compiled with kvc-restore-pipeline's gpu-chip (strategy=kv, chunk-tokens=64,
// the store's objects), each loaded chunk's task names the restore kernel
// that decodes it.
kvc.restore @raw tokens 0 to 300 from [
    #kvc.source<tier = "dram", form = kv, tokens = 0 to 300, layers = 0 to 4>]
kvc.restore @int4 tokens 0 to 300 from [
    #kvc.source<tier = "dram", form = kv, codec = <quant = int4, lossless = zstd>,
                tokens = 0 to 300, layers = 0 to 4>]
kvc.plan @int4_then_compute tokens 0 to 300 layers 0 to 4 {
  kvc.segment load_kv tokens 0 to 192 layers 0 to 4 from
      #kvc.source<tier = "dram", form = kv, codec = <quant = int4, lossless = zstd>,
                  tokens = 0 to 300, layers = 0 to 4>
  kvc.segment compute tokens 192 to 300 layers 0 to 4
}

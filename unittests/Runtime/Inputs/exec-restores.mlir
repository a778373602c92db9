// Restores of the executor fixture's request (300 tokens of exec-model) from
// its store's KV in tier "dram", raw and as int4+zstd; a plan that loads the
// first 192 tokens as int4+zstd and computes the rest after them; and one
// that projects int8+zstd hidden states. Compiled with kvc-restore-pipeline's
// gpu-chip (strategy=kv, chunk-tokens=64, the store's objects), each loaded
// chunk's task names the kernel that decodes (or projects) it.
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
kvc.plan @hidden_int8 tokens 0 to 300 layers 0 to 4 {
  kvc.segment load_hidden tokens 0 to 300 layers 0 to 4 from
      #kvc.source<tier = "dram", form = hidden, codec = <quant = int8, lossless = zstd>,
                  tokens = 0 to 300, layers = 0 to 4>
}

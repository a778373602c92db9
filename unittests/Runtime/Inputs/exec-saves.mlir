// Saves of the executor fixture's request (300 tokens of exec-model) in its
// store's layout, raw with lz4 and as int4+zstd: compiled with
// kvc-save-pipeline's gpu-chip, each object's gather names the save kernel
// that encodes it.
kvc.save @raw tokens 0 to 300 kv to "dram" codec <lossless = lz4>
    {chunk_tokens = 64 : i64, layer_group = 2 : i64}
kvc.save @int4 tokens 0 to 300 kv to "dram" codec <quant = int4, lossless = zstd>
    {chunk_tokens = 64 : i64, layer_group = 2 : i64}

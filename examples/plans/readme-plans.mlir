// The plans of the README's restore: the 4-layer model `kvc-run gen-model`
// makes there, 4096 tokens whose KV and hidden states `kvc-run save` stored
// as int8+zstd on a disk store. Recompute everything; Cake's token split
// (compute the first 1024 tokens, load the KV of the rest); HCache's layer
// split (project stored hidden states for three layers, load KV for the
// fourth).
#kv = #kvc.source<tier = "disk", form = kv, codec = <quant = int8, lossless = zstd>, tokens = 0 to 4096, layers = 0 to 4>
#hid = #kvc.source<tier = "disk", form = hidden, codec = <quant = int8, lossless = zstd>, tokens = 0 to 4096, layers = 0 to 4>
kvc.plan @compute tokens 0 to 4096 layers 0 to 4 {
  kvc.segment compute tokens 0 to 4096 layers 0 to 4
}
kvc.plan @cake tokens 0 to 4096 layers 0 to 4 {
  kvc.segment compute tokens 0 to 1024 layers 0 to 4
  kvc.segment load_kv tokens 1024 to 4096 layers 0 to 4 from #kv
}
kvc.plan @hcache tokens 0 to 4096 layers 0 to 4 {
  kvc.segment load_hidden tokens 0 to 4096 layers 0 to 3 from #hid
  kvc.segment load_kv tokens 0 to 4096 layers 3 to 4 from #kv
}

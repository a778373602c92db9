// Strategy level: HCache splits layers (recompute the first 2 from tokens,
// project hidden states for the rest); Cake splits tokens (compute the front,
// load KV from the back); the joint plan mixes both.
#hidden = #kvc.source<tier = "disk", form = hidden, tokens = 0 to 4096, layers = 0 to 32>
#kv = #kvc.source<tier = "dram", form = kv, codec = <quant = int8, lossless = deflate>,
                  tokens = 0 to 4096, layers = 0 to 32>

kvc.plan @hcache tokens 0 to 4096 layers 0 to 32 {
  kvc.segment compute tokens 0 to 4096 layers 0 to 2
  kvc.segment load_hidden tokens 0 to 4096 layers 2 to 32 from #hidden
}

kvc.plan @cake tokens 0 to 4096 layers 0 to 32 {
  kvc.segment compute tokens 0 to 1536 layers 0 to 32
  kvc.segment load_kv tokens 1536 to 4096 layers 0 to 32 from #kv
}

kvc.plan @joint tokens 0 to 4096 layers 0 to 32 {
  kvc.segment compute tokens 0 to 1024 layers 0 to 32
  kvc.segment load_hidden tokens 1024 to 4096 layers 0 to 16 from #hidden
  kvc.segment load_kv tokens 1024 to 4096 layers 16 to 32 from #kv
}

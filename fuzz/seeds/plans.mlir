// The plan bundle fuzzer's seed: the three strategies over a short request,
// one source stored as Hadamard + int4 so that the bundle carries a
// generated restore kernel (fuzz/CMakeLists.txt compiles it with kvc-opt).
#hidden = #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 512, layers = 0 to 32>
#kv = #kvc.source<tier = "dram", form = kv,
                  codec = <transform = hadamard, quant = int4, lossless = zstd>,
                  tokens = 0 to 512, layers = 0 to 32>

kvc.plan @hcache tokens 0 to 512 layers 0 to 32 {
  kvc.segment compute tokens 0 to 512 layers 0 to 2
  kvc.segment load_hidden tokens 0 to 512 layers 2 to 32 from #hidden
}

kvc.plan @cake tokens 0 to 512 layers 0 to 32 {
  kvc.segment compute tokens 0 to 256 layers 0 to 32
  kvc.segment load_kv tokens 256 to 512 layers 0 to 32 from #kv
}

kvc.plan @joint tokens 0 to 512 layers 0 to 32 {
  kvc.segment compute tokens 0 to 128 layers 0 to 32
  kvc.segment load_hidden tokens 128 to 512 layers 0 to 16 from #hidden
  kvc.segment load_kv tokens 128 to 512 layers 16 to 32 from #kv
}

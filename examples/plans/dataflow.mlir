// Dataflow level: a 512-token, 2-layer slice of a Cake plan after expansion.
// Tokens 0-256 are recomputed; tokens 256-512 are fetched from DRAM, decoded
// on the host, copied to the device and scattered into the paged cache.
#kv = #kvc.source<tier = "dram", form = kv, codec = <quant = int4, lossless = deflate>,
                  tokens = 0 to 4096, layers = 0 to 32>

kvc.plan @cake_slice tokens 0 to 512 layers 0 to 2 {
  %c = kvc.chunk_compute tokens 0 to 256 layers 0 to 2
      : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, device>
  kvc.scatter %c : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, device>
  %f = kvc.fetch #kv tokens 256 to 512 layers 0 to 2
      : !kvc.chunk<kv x f16, tokens 256 to 512, layers 0 to 2, host,
                   codec <quant = int4, lossless = deflate>>
  %d = kvc.decompress %f
      : !kvc.chunk<kv x f16, tokens 256 to 512, layers 0 to 2, host,
                   codec <quant = int4, lossless = deflate>>
      -> !kvc.chunk<kv x f16, tokens 256 to 512, layers 0 to 2, host, codec <quant = int4>>
  %q = kvc.dequant %d
      : !kvc.chunk<kv x f16, tokens 256 to 512, layers 0 to 2, host, codec <quant = int4>>
      -> !kvc.chunk<kv x f16, tokens 256 to 512, layers 0 to 2, host>
  %g = kvc.transfer_to_device %q
      : !kvc.chunk<kv x f16, tokens 256 to 512, layers 0 to 2, host>
      -> !kvc.chunk<kv x f16, tokens 256 to 512, layers 0 to 2, device>
  kvc.scatter %g : !kvc.chunk<kv x f16, tokens 256 to 512, layers 0 to 2, device>
}

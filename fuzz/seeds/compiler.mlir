// The compiler fuzzer's seed (kvc-plan-fuzz, fuzz/compiler/PlanFuzzer.cpp):
// plans at every level for Llama-3.1-8B on an H100 (a restore, a save and a
// transfer intent, a strategy, a dataflow slice whose chunk decodes on the
// device), short enough to compile in milliseconds.
#kv8 = #kvc.source<tier = "dram", form = kv, codec = <quant = int8, lossless = zstd>,
                   tokens = 0 to 512, layers = 0 to 32>
#kv4 = #kvc.source<tier = "ssd", form = kv,
                   codec = <transform = hadamard, quant = int4, key_axis = channel,
                            value_axis = token, group = 32>,
                   tokens = 0 to 512, layers = 0 to 32>
#hid = #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 512, layers = 0 to 32>

kvc.restore @chat tokens 0 to 512 from [#hid, #kv8] {slo_ms = 50.0, max_error = 0.01}

kvc.save @doc tokens 0 to 256 kv hidden to "ssd" codec <quant = int4, lossless = lz4>

kvc.transfer @move tokens 0 to 300 from "prefill-0" to "decode-0"
    codec <quant = int8, lossless = zstd> {layer_group = 4 : i64}

kvc.plan @joint tokens 0 to 512 layers 0 to 32 {
  kvc.segment compute tokens 0 to 128 layers 0 to 32
  kvc.segment load_hidden tokens 128 to 512 layers 0 to 16 from #hid
  kvc.segment load_kv tokens 128 to 512 layers 16 to 32 from #kv4
}

kvc.plan @slice tokens 0 to 256 layers 0 to 2 {
  %c = kvc.chunk_compute tokens 0 to 128 layers 0 to 2
      : !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 2, device>
  kvc.scatter %c : !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 2, device>
  %f = kvc.fetch #kv4 tokens 128 to 256 layers 0 to 2
      : !kvc.chunk<kv x bf16, tokens 128 to 256, layers 0 to 2, host,
                   codec <transform = hadamard, quant = int4>>
  %d = kvc.transfer_to_device %f
      : !kvc.chunk<kv x bf16, tokens 128 to 256, layers 0 to 2, host,
                   codec <transform = hadamard, quant = int4>>
      -> !kvc.chunk<kv x bf16, tokens 128 to 256, layers 0 to 2, device,
                    codec <transform = hadamard, quant = int4>>
  %q = kvc.dequant %d
      : !kvc.chunk<kv x bf16, tokens 128 to 256, layers 0 to 2, device,
                   codec <transform = hadamard, quant = int4>>
      -> !kvc.chunk<kv x bf16, tokens 128 to 256, layers 0 to 2, device,
                    codec <transform = hadamard>>
  %u = kvc.untransform %q
      : !kvc.chunk<kv x bf16, tokens 128 to 256, layers 0 to 2, device,
                   codec <transform = hadamard>>
      -> !kvc.chunk<kv x bf16, tokens 128 to 256, layers 0 to 2, device>
  kvc.scatter %u : !kvc.chunk<kv x bf16, tokens 128 to 256, layers 0 to 2, device>
}

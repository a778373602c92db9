// RUN: kvc-opt %s -split-input-file -verify-diagnostics

// Tests that every verifier rule rejects what cannot run, naming the field.

//===----------------------------------------------------------------------===//
// Ranges
//===----------------------------------------------------------------------===//

// expected-error @+1 {{'kvc.restore' op tokens range 5 to 5 is empty}}
kvc.restore @r tokens 5 to 5 from []

// -----

// expected-error @+1 {{'kvc.restore' op tokens range 8 to 4 is reversed}}
kvc.restore @r tokens 8 to 4 from []

// -----

// expected-error @+1 {{'kvc.plan' op layers range -1 to 4 starts below 0}}
kvc.plan @p tokens 0 to 4 layers -1 to 4 {
}

// -----

module attributes {kvc.model = #kvc.model<name = "m", layers = 4, hidden = 64, heads = 4,
    kv_heads = 2, head_dim = 16, ffn = 128, vocab = 100, max_positions = 1024,
    rope_theta = 10000, dtype = bf16>} {
  // expected-error @+1 {{'kvc.restore' op tokens range 0 to 2048 exceeds the model's max_positions (1024)}}
  kvc.restore @r tokens 0 to 2048 from []
}

// -----

// expected-error @+1 {{'kvc.restore' op forward_tokens must be 1 or more, got 0}}
kvc.restore @r tokens 0 to 16 from [] {forward_tokens = 0 : i64}

// -----

module attributes {kvc.model = #kvc.model<name = "m", layers = 4, hidden = 64, heads = 4,
    kv_heads = 2, head_dim = 16, ffn = 128, vocab = 100, max_positions = 1024,
    rope_theta = 10000, dtype = bf16>} {
  // expected-error @+1 {{'kvc.restore' op forward_tokens 32 after 1000 restored tokens exceed the model's max_positions (1024)}}
  kvc.restore @r tokens 0 to 1000 from [] {forward_tokens = 32 : i64}
}

// -----

module attributes {kvc.model = #kvc.model<name = "m", layers = 4, hidden = 64, heads = 4,
    kv_heads = 2, head_dim = 16, ffn = 128, vocab = 100, max_positions = 1024,
    rope_theta = 10000, dtype = bf16>} {
  // expected-error @+1 {{'kvc.plan' op layers range 0 to 8 exceeds the model's layers (4)}}
  kvc.plan @p tokens 0 to 16 layers 0 to 8 {
  }
}

// -----

module attributes {kvc.model = #kvc.model<name = "m", layers = 4, hidden = 64, heads = 4,
    kv_heads = 2, head_dim = 16, ffn = 128, vocab = 100, max_positions = 1024,
    rope_theta = 10000, dtype = bf16>} {
  // expected-error @+1 {{'kvc.restore' op source layers 0 to 32 exceed the model's layers (4)}}
  kvc.restore @r tokens 0 to 16 from [#kvc.source<tier = "ssd", form = kv, tokens = 0 to 16, layers = 0 to 32>]
}

// -----

// A Hadamard codec needs the power-of-two blocks the runtime rotates: KV
// over head_dim, hidden states over a power of two dividing their rows.
module attributes {kvc.model = #kvc.model<name = "m", layers = 4, hidden = 240, heads = 3,
    kv_heads = 1, head_dim = 80, ffn = 128, vocab = 100, max_positions = 1024,
    rope_theta = 10000, dtype = bf16>} {
  // expected-error @+1 {{'kvc.restore' op rotates KV with Hadamard over head_dim 80, which is not a power of two}}
  kvc.restore @r tokens 0 to 16 from [#kvc.source<tier = "ssd", form = kv, codec = <transform = hadamard, quant = int4>, tokens = 0 to 16, layers = 0 to 4>]
}

// -----

module attributes {kvc.model = #kvc.model<name = "m", layers = 4, hidden = 240, heads = 3,
    kv_heads = 1, head_dim = 80, ffn = 128, vocab = 100, max_positions = 1024,
    rope_theta = 10000, dtype = bf16>} {
  // expected-error @+1 {{'kvc.save' op rotates KV with Hadamard over head_dim 80, which is not a power of two}}
  kvc.save @s tokens 0 to 16 kv to "ssd" codec <transform = hadamard, quant = int8>
}

// -----

module attributes {kvc.model = #kvc.model<name = "m", layers = 4, hidden = 240, heads = 3,
    kv_heads = 1, head_dim = 80, ffn = 128, vocab = 100, max_positions = 1024,
    rope_theta = 10000, dtype = bf16>} {
  // expected-error @+1 {{'kvc.transfer' op rotates KV with Hadamard over head_dim 80, which is not a power of two}}
  kvc.transfer @t tokens 0 to 16 to "decode-0" codec <transform = hadamard, quant = int8>
}

// -----

module attributes {kvc.model = #kvc.model<name = "m", layers = 4, hidden = 9, heads = 9,
    kv_heads = 1, head_dim = 1, ffn = 128, vocab = 100, max_positions = 1024,
    rope_theta = 10000, dtype = bf16>} {
  // expected-error @+1 {{'kvc.save' op rotates hidden states with Hadamard, whose rows of 9 values have no power-of-two blocks}}
  kvc.save @s tokens 0 to 16 hidden to "ssd" codec <transform = hadamard, quant = int8>
}

// -----

// expected-error @+1 {{tokens range 4 to 0 is reversed}}
func.func private @f(!kvc.chunk<kv x bf16, tokens 4 to 0, layers 0 to 1, host>)

// -----

// expected-error @+1 {{layers range 3 to 3 is empty}}
kvc.restore @r tokens 0 to 4 from [#kvc.source<tier = "ssd", form = kv, tokens = 0 to 4, layers = 3 to 3>]

// -----

// expected-error @+1 {{source token_group must be at least 1, got 0}}
kvc.restore @r tokens 0 to 4 from [#kvc.source<tier = "ssd", form = kv, tokens = 0 to 4, layers = 0 to 4, token_group = 0>]

// -----

// expected-error @+1 {{source layer_group must be at least 1, got 0}}
kvc.restore @r tokens 0 to 4 from [#kvc.source<tier = "ssd", form = kv, tokens = 0 to 4, layers = 0 to 4, layer_group = 0>]

//===----------------------------------------------------------------------===//
// Models and targets
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{kv_heads (3) must divide heads (32)}}
module attributes {kvc.model = #kvc.model<name = "m", layers = 32, hidden = 4096, heads = 32,
    kv_heads = 3, head_dim = 128, ffn = 11008, vocab = 32000, max_positions = 4096,
    rope_theta = 10000, dtype = bf16>} {}

// -----

// expected-error @+1 {{heads * head_dim (32 * 64) must equal hidden (4096)}}
module attributes {kvc.model = #kvc.model<name = "m", layers = 32, hidden = 4096, heads = 32,
    kv_heads = 8, head_dim = 64, ffn = 11008, vocab = 32000, max_positions = 4096,
    rope_theta = 10000, dtype = bf16>} {}

// -----

// expected-error @+1 {{rms_norm_eps must be positive, got 0}}
module attributes {kvc.model = #kvc.model<name = "m", layers = 32, hidden = 4096, heads = 32,
    kv_heads = 8, head_dim = 128, ffn = 11008, vocab = 32000, max_positions = 4096,
    rope_theta = 10000, dtype = bf16, rms_norm_eps = 0.0>} {}

// -----

// expected-error @+1 {{layers must be positive, got 0}}
module attributes {kvc.model = #kvc.model<name = "m", layers = 0, hidden = 4096, heads = 32,
    kv_heads = 8, head_dim = 128, ffn = 11008, vocab = 32000, max_positions = 4096,
    rope_theta = 10000, dtype = bf16>} {}

// -----

// expected-error @+1 {{dtype must be bf16, f16 or f32, got 'i8'}}
module attributes {kvc.model = #kvc.model<name = "m", layers = 2, hidden = 64, heads = 4,
    kv_heads = 4, head_dim = 16, ffn = 128, vocab = 100, max_positions = 64,
    rope_theta = 10000, dtype = i8>} {}

// -----

// expected-error @+1 {{'kvc.model' expects a #kvc.model, got "llama"}}
module attributes {kvc.model = "llama"} {}

// -----

// expected-error @+1 {{unknown kvc attribute 'kvc.modle'}}
module attributes {kvc.modle = 1} {}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.time_ns' expects array<i64: start, finish> with 0 <= start <= finish, got array<i64: 5, 2>}}
  %f = kvc.fetch #kvc.source<tier = "ssd", form = kv, tokens = 0 to 64, layers = 0 to 2>
      tokens 0 to 64 layers 0 to 2 {kvc.time_ns = array<i64: 5, 2>}
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.bytes' expects a non-negative i64, got -1 : i64}}
  %f = kvc.fetch #kvc.source<tier = "ssd", form = kv, tokens = 0 to 64, layers = 0 to 2>
      tokens 0 to 64 layers 0 to 2 {kvc.bytes = -1 : i64}
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host>
  return
}

// -----

// expected-error @+1 {{'kvc.bytes' belongs on kvc.fetch}}
module attributes {kvc.bytes = 8 : i64} {}

// -----

// expected-error @+1 {{'kvc.prologue' names a generated function on a kvc.kernel, got @f}}
func.func @prologue() attributes {kvc.prologue = @f} {
  return
}

// -----

// expected-error @+1 {{'kvc.entry' names the generated function on a kvc.kernel and holds that function's specialization elsewhere, got unit}}
func.func @entry() attributes {kvc.entry} {
  return
}

// -----

func.func @entry(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>) {
  // expected-error @+1 {{'kvc.entry' names the generated function on a kvc.kernel and holds that function's specialization elsewhere, got "k"}}
  kvc.kernel "scatter" (%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>) -> () attributes {kvc.entry = "k"} {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>):
    kvc.scatter %in : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  }
  return
}

// -----

// expected-error @+3 {{restore_share must lie in (0, 1], got 1.5}}
// expected-error @+2 {{failed to parse KVC_TargetAttr parameter 'compute'}}
module attributes {kvc.target = #kvc.target<name = "t",
    compute = <kind = gpu, name = "g", dense_tflops = 1, mem_gbs = 1, mem_gib = 1, restore_share = 1.5>,
    host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
    link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>,
    tiers = [#kvc.tier<name = "dram", kind = dram, read_gbs = 10, write_gbs = 10, latency_us = 1>]>} {}

// -----

// expected-error @+3 {{attention_tflops must not be negative}}
// expected-error @+2 {{failed to parse KVC_TargetAttr parameter 'compute'}}
module attributes {kvc.target = #kvc.target<name = "t",
    compute = <kind = cpu, name = "c", dense_tflops = 1, mem_gbs = 1, mem_gib = 1, restore_share = 1, attention_tflops = -1>,
    host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
    link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>,
    tiers = [#kvc.tier<name = "dram", kind = dram, read_gbs = 10, write_gbs = 10, latency_us = 1>]>} {}

// -----

// expected-error @+1 {{cores must be positive, got 0}}
module attributes {kvc.example = #kvc.host<cores = 0, dram_gib = 24, nic_gbs = 0>} {}

// -----

// expected-error @+1 {{dram_gib must be positive, got 0}}
module attributes {kvc.example = #kvc.host<cores = 2, dram_gib = 0, nic_gbs = 0>} {}

// -----

// expected-error @+1 {{nic_gbs must not be negative}}
module attributes {kvc.example = #kvc.host<cores = 2, dram_gib = 24, nic_gbs = -1>} {}

// -----

// expected-error @+1 {{handoff_us must not be negative}}
module attributes {kvc.example = #kvc.host<cores = 2, dram_gib = 24, nic_gbs = 0, handoff_us = -5>} {}

// -----

// expected-error @+1 {{check_gbs must not be negative}}
module attributes {kvc.example = #kvc.host<cores = 2, dram_gib = 24, nic_gbs = 0, check_gbs = -1>} {}

// -----

// expected-error @+1 {{read_check_gbs must not be negative}}
module attributes {kvc.example = #kvc.host<cores = 2, dram_gib = 24, nic_gbs = 0, read_check_gbs = -1>} {}

// -----

// expected-error @+1 {{read_gbs must be positive, got 0}}
module attributes {kvc.example = #kvc.tier<name = "ssd", kind = disk, read_gbs = 0, write_gbs = 1, latency_us = 1>} {}

// -----

// expected-error @+1 {{duplicate tier "dram"}}
module attributes {kvc.target = #kvc.target<name = "t",
    compute = <kind = gpu, name = "g", dense_tflops = 1, mem_gbs = 1, mem_gib = 1, restore_share = 1>,
    host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
    link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>,
    tiers = [#kvc.tier<name = "dram", kind = dram, read_gbs = 10, write_gbs = 10, latency_us = 1>,
             #kvc.tier<name = "dram", kind = disk, read_gbs = 1, write_gbs = 1, latency_us = 1>]>} {}

// -----

// expected-error @+1 {{duplicate codec stage zstd on int4}}
module attributes {kvc.target = #kvc.target<name = "t",
    compute = <kind = gpu, name = "g", dense_tflops = 1, mem_gbs = 1, mem_gib = 1, restore_share = 1>,
    host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
    link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>,
    tiers = [#kvc.tier<name = "dram", kind = dram, read_gbs = 10, write_gbs = 10, latency_us = 1>],
    codecs = [#kvc.codec_rate<stage = zstd, encode_gbs = 1, decode_gbs = 1>,
              #kvc.codec_rate<stage = zstd, on = int4, encode_gbs = 1, decode_gbs = 2>,
              #kvc.codec_rate<stage = zstd, on = int4, encode_gbs = 1, decode_gbs = 3>]>} {}

// -----

// expected-error @+1 {{a target needs at least one tier}}
module attributes {kvc.target = #kvc.target<name = "t",
    compute = <kind = gpu, name = "g", dense_tflops = 1, mem_gbs = 1, mem_gib = 1, restore_share = 1>,
    host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
    link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>, tiers = []>} {}

// -----

// expected-error @+1 {{tiers must hold #kvc.tier attributes, got 1 : i64}}
module attributes {kvc.target = #kvc.target<name = "t",
    compute = <kind = gpu, name = "g", dense_tflops = 1, mem_gbs = 1, mem_gib = 1, restore_share = 1>,
    host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
    link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>, tiers = [1]>} {}

// -----

module attributes {kvc.target = #kvc.target<name = "t",
    compute = <kind = gpu, name = "g", dense_tflops = 1, mem_gbs = 1, mem_gib = 1, restore_share = 1>,
    host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
    link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>,
    tiers = [#kvc.tier<name = "dram", kind = dram, read_gbs = 10, write_gbs = 10, latency_us = 1>]>} {
  // expected-error @+1 {{'kvc.restore' op names tier "ssd", which target "t" does not have}}
  kvc.restore @r tokens 0 to 16 from [#kvc.source<tier = "ssd", form = kv, tokens = 0 to 16, layers = 0 to 2>]
}

// -----

module attributes {kvc.target = #kvc.target<name = "t",
    compute = <kind = gpu, name = "g", dense_tflops = 1, mem_gbs = 1, mem_gib = 1, restore_share = 1>,
    host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
    link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>,
    tiers = [#kvc.tier<name = "dram", kind = dram, read_gbs = 10, write_gbs = 10, latency_us = 1>]>} {
  // expected-error @+1 {{'kvc.save' op names tier "nvme", which target "t" does not have}}
  kvc.save @s tokens 0 to 16 kv to "nvme"
}

//===----------------------------------------------------------------------===//
// Codecs and sources
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{codec does nothing: raw data carries no codec}}
kvc.save @s tokens 0 to 16 kv to "ssd" codec <>

// -----

// expected-error @+1 {{group must be a positive power of two, got 48}}
kvc.save @s tokens 0 to 16 kv to "ssd" codec <quant = int4, group = 48>

// -----

// expected-error @+1 {{key_axis, value_axis and group need quant}}
kvc.save @s tokens 0 to 16 kv to "ssd" codec <group = 64, lossless = zstd>

// -----

// expected-error @+1 {{'kvc.save' op saves nothing: name kv, hidden or both}}
kvc.save @s tokens 0 to 16 to "ssd"

// -----

// expected-error @+1 {{'kvc.save' op chunk_tokens and layer_group must be positive, got 256 and 0}}
kvc.save @s tokens 0 to 16 kv to "ssd" {layer_group = 0 : i64}

// -----

// expected-error @+1 {{'kvc.transfer' op needs a destination node}}
kvc.transfer @t tokens 0 to 16 to ""

// -----

// expected-error @+1 {{'kvc.transfer' op needs a sending node when it names one}}
kvc.transfer @t tokens 0 to 16 from "" to "decode-0"

// -----

// expected-error @+1 {{'kvc.transfer' op chunk_tokens and layer_group must be positive, got 0 and 4}}
kvc.transfer @t tokens 0 to 16 to "decode-0" {chunk_tokens = 0 : i64}

//===----------------------------------------------------------------------===//
// Plans and segments
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{'kvc.plan' op 'p' segments overlap on tokens 64 to 128 of layers 0 to 2}}
kvc.plan @p tokens 0 to 256 layers 0 to 2 {
  kvc.segment compute tokens 0 to 128 layers 0 to 2
  kvc.segment compute tokens 64 to 256 layers 0 to 2
}

// -----

// expected-error @+1 {{'kvc.plan' op 'p' segments leave tokens 0 to 256 of layers 1 to 2 uncovered}}
kvc.plan @p tokens 0 to 256 layers 0 to 2 {
  kvc.segment compute tokens 0 to 256 layers 0 to 1
}

// -----

// Segments and the steps that carry them out are two levels of one plan.
// expected-error @+1 {{'kvc.plan' op 'p' holds segments and 'kvc.chunk_compute': a plan holds segments or the steps that carry them out, not both}}
kvc.plan @p tokens 0 to 16 layers 0 to 2 {
  kvc.segment compute tokens 0 to 16 layers 0 to 2
  %c = kvc.chunk_compute tokens 0 to 16 layers 0 to 2
      : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 2, device>
  kvc.scatter %c : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 2, device>
}

// -----

// A step outside the plan, though no scatter ends its chain.
kvc.plan @p tokens 0 to 16 layers 0 to 2 {
  %c = kvc.chunk_compute tokens 0 to 16 layers 0 to 2
      : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 2, device>
  kvc.scatter %c : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 2, device>
  // expected-error @+1 {{'kvc.fetch' op covers tokens 16 to 32 of layers 0 to 2, outside plan @p (tokens 0 to 16, layers 0 to 2)}}
  %f = kvc.fetch #kvc.source<tier = "ssd", form = kv, tokens = 0 to 32, layers = 0 to 2>
      tokens 16 to 32 layers 0 to 2
      : !kvc.chunk<kv x bf16, tokens 16 to 32, layers 0 to 2, host>
}

// -----

// expected-error @+1 {{'kvc.plan' op 'p' scatters leave tokens 0 to 16 of layers 0 to 2 uncovered}}
kvc.plan @p tokens 0 to 16 layers 0 to 2 {
}

// -----

// A transfer's sender: its sends must tile it.
// expected-error @+1 {{'kvc.plan' op 'p' kv sends leave tokens 8 to 16 of layers 0 to 2 uncovered}}
kvc.plan @p tokens 0 to 16 layers 0 to 2 strategy "send" {
  %k = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 8, layers 0 to 2, device>
  %kh = kvc.transfer_to_host %k
      : !kvc.chunk<kv x bf16, tokens 0 to 8, layers 0 to 2, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 8, layers 0 to 2, host>
  kvc.send %kh to "decode-0" : !kvc.chunk<kv x bf16, tokens 0 to 8, layers 0 to 2, host>
}

// -----

// expected-error @+1 {{'kvc.plan' op prefill_step 0: a prefill step computes 1 token or more}}
kvc.plan @p tokens 0 to 8 layers 0 to 2 strategy "send" prefill_step 0 {
  %k = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 8, layers 0 to 2, device>
  %kh = kvc.transfer_to_host %k
      : !kvc.chunk<kv x bf16, tokens 0 to 8, layers 0 to 2, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 8, layers 0 to 2, host>
  kvc.send %kh to "decode-0" : !kvc.chunk<kv x bf16, tokens 0 to 8, layers 0 to 2, host>
}

// -----

// A receiver runs beside no prefill.
// expected-error @+1 {{'kvc.plan' op 'p' has a prefill_step but gathers nothing: only a save or a sender runs beside a prefill}}
kvc.plan @p tokens 0 to 8 layers 0 to 2 strategy "receive" prefill_step 8 {
  %r = kvc.recv from "prefill-0" : !kvc.chunk<kv x bf16, tokens 0 to 8, layers 0 to 2, host>
  %d = kvc.transfer_to_device %r
      : !kvc.chunk<kv x bf16, tokens 0 to 8, layers 0 to 2, host>
      -> !kvc.chunk<kv x bf16, tokens 0 to 8, layers 0 to 2, device>
  kvc.scatter %d : !kvc.chunk<kv x bf16, tokens 0 to 8, layers 0 to 2, device>
}

// -----

// A save plan: each form's stores must tile it.
// expected-error @+1 {{'kvc.plan' op 'p' hidden stores leave tokens 0 to 16 of layers 1 to 2 uncovered}}
kvc.plan @p tokens 0 to 16 layers 0 to 2 strategy "save" {
  %k = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 2, device>
  %kh = kvc.transfer_to_host %k
      : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 2, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 2, host>
  kvc.store %kh to "ssd" : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 2, host>
  %h = kvc.gather : !kvc.chunk<hidden x bf16, tokens 0 to 16, layers 0 to 1, device>
  %hh = kvc.transfer_to_host %h
      : !kvc.chunk<hidden x bf16, tokens 0 to 16, layers 0 to 1, device>
      -> !kvc.chunk<hidden x bf16, tokens 0 to 16, layers 0 to 1, host>
  kvc.store %hh to "ssd" : !kvc.chunk<hidden x bf16, tokens 0 to 16, layers 0 to 1, host>
}

// -----

// expected-error @+1 {{'kvc.plan' op 'p' kv stores overlap on tokens 8 to 16 of layers 0 to 2}}
kvc.plan @p tokens 0 to 16 layers 0 to 2 strategy "save" {
  %a = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 2, device>
  %ah = kvc.transfer_to_host %a
      : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 2, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 2, host>
  kvc.store %ah to "ssd" : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 2, host>
  %b = kvc.gather : !kvc.chunk<kv x bf16, tokens 8 to 16, layers 0 to 2, device>
  %bh = kvc.transfer_to_host %b
      : !kvc.chunk<kv x bf16, tokens 8 to 16, layers 0 to 2, device>
      -> !kvc.chunk<kv x bf16, tokens 8 to 16, layers 0 to 2, host>
  kvc.store %bh to "ssd" : !kvc.chunk<kv x bf16, tokens 8 to 16, layers 0 to 2, host>
}

// -----

kvc.plan @p tokens 0 to 256 layers 0 to 2 {
  // expected-error @+1 {{'kvc.segment' op covers tokens 0 to 512 of layers 0 to 2, outside plan @p (tokens 0 to 256, layers 0 to 2)}}
  kvc.segment compute tokens 0 to 512 layers 0 to 2
}

// -----

kvc.plan @p tokens 0 to 16 layers 0 to 2 {
  %c = kvc.chunk_compute tokens 0 to 16 layers 0 to 2
      : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 2, device>
  kvc.scatter %c : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 2, device>
  // expected-error @+1 {{'kvc.chunk_compute' op covers tokens 0 to 32 of layers 0 to 2, outside plan @p}}
  %c2 = kvc.chunk_compute tokens 0 to 32 layers 0 to 2
      : !kvc.chunk<kv x bf16, tokens 0 to 32, layers 0 to 2, device>
  kvc.scatter %c2 : !kvc.chunk<kv x bf16, tokens 0 to 32, layers 0 to 2, device>
}

// -----

kvc.plan @p tokens 0 to 16 layers 0 to 2 {
  // expected-error @+1 {{'kvc.segment' op load_kv segment needs a source}}
  kvc.segment load_kv tokens 0 to 16 layers 0 to 2
}

// -----

kvc.plan @p tokens 0 to 16 layers 0 to 2 {
  // expected-error @+1 {{'kvc.segment' op load_hidden segment needs a hidden source, got a kv source}}
  kvc.segment load_hidden tokens 0 to 16 layers 0 to 2
      from #kvc.source<tier = "ssd", form = kv, tokens = 0 to 16, layers = 0 to 2>
}

// -----

kvc.plan @p tokens 0 to 16 layers 0 to 2 {
  // expected-error @+1 {{'kvc.segment' op compute segment can only take hidden states from its source, got a kv source}}
  kvc.segment compute tokens 0 to 16 layers 0 to 2
      from #kvc.source<tier = "ssd", form = kv, tokens = 0 to 16, layers = 0 to 2>
}

// -----

kvc.plan @p tokens 0 to 64 layers 0 to 2 {
  // expected-error @+1 {{'kvc.segment' op tokens 0 to 64 lie outside the source's tokens 0 to 32}}
  kvc.segment load_kv tokens 0 to 64 layers 0 to 2
      from #kvc.source<tier = "ssd", form = kv, tokens = 0 to 32, layers = 0 to 2>
}

// -----

kvc.plan @p tokens 0 to 64 layers 0 to 4 {
  kvc.segment compute tokens 0 to 64 layers 0 to 2
  // expected-error @+1 {{'kvc.segment' op layers 2 to 4 lie outside the source's layers 0 to 2}}
  kvc.segment load_hidden tokens 0 to 64 layers 2 to 4
      from #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 64, layers = 0 to 2>
}

// -----

kvc.plan @p tokens 0 to 64 layers 0 to 4 {
  kvc.segment load_kv tokens 0 to 64 layers 0 to 2
      from #kvc.source<tier = "ssd", form = kv, tokens = 0 to 64, layers = 0 to 4>
  // expected-error @+1 {{'kvc.segment' op compute segment of layers 2 to 4 needs the hidden states entering layer 2: no compute segment of tokens 0 to 64 ends there and it names no hidden-state source}}
  kvc.segment compute tokens 0 to 64 layers 2 to 4
}

// -----

// expected-error @+1 {{'kvc.segment' op expects parent op 'kvc.plan'}}
kvc.segment compute tokens 0 to 16 layers 0 to 2

//===----------------------------------------------------------------------===//
// Dataflow
//===----------------------------------------------------------------------===//

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.fetch' op result codec #kvc.codec<quant = int8> differs from the codec the source is stored in, #kvc.codec<quant = int4>}}
  %f = kvc.fetch #kvc.source<tier = "ssd", form = kv, codec = <quant = int4>, tokens = 0 to 64, layers = 0 to 2>
      tokens 0 to 64 layers 0 to 2
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host, codec <quant = int8>>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.fetch' op result codec (raw) differs from the codec the source is stored in, #kvc.codec<lossless = zstd>}}
  %f = kvc.fetch #kvc.source<tier = "ssd", form = kv, codec = <lossless = zstd>, tokens = 0 to 64, layers = 0 to 2>
      tokens 0 to 64 layers 0 to 2 : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.fetch' op result form hidden differs from the source's kv}}
  %f = kvc.fetch #kvc.source<tier = "ssd", form = kv, tokens = 0 to 64, layers = 0 to 2>
      tokens 0 to 64 layers 0 to 2 : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, host>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.fetch' op tokens 32 to 96 lie outside the source's tokens 0 to 64}}
  %f = kvc.fetch #kvc.source<tier = "ssd", form = kv, tokens = 0 to 64, layers = 0 to 2>
      tokens 32 to 96 layers 0 to 2 : !kvc.chunk<kv x bf16, tokens 32 to 96, layers 0 to 2, host>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.fetch' op fetches into host memory; the result must be host}}
  %f = kvc.fetch #kvc.source<tier = "ssd", form = kv, tokens = 0 to 64, layers = 0 to 2>
      tokens 0 to 64 layers 0 to 2 : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>) {
  // expected-error @+1 {{'kvc.dequant' op input is not quantized}}
  %d = kvc.dequant %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8, lossless = lz4>>) {
  // expected-error @+1 {{'kvc.dequant' op input is still compressed (lz4); decompress it first}}
  %d = kvc.dequant %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8, lossless = lz4>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <lossless = lz4>>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8>>) {
  // expected-error @+1 {{'kvc.decompress' op input is not compressed}}
  %d = kvc.decompress %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8>>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <lossless = deflate>>) {
  // expected-error @+1 {{'kvc.decompress' op result type '!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>' does not match the expected '!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>'}}
  %d = kvc.decompress %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <lossless = deflate>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <lossless = deflate>>) {
  // expected-error @+1 {{'kvc.decompress' op result tokens 0 to 32 differ from input tokens 0 to 64}}
  %d = kvc.decompress %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <lossless = deflate>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 32, layers 0 to 1, host>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <lossless = deflate>>) {
  // expected-error @+1 {{'kvc.decompress' op result layers 0 to 2 differ from input layers 0 to 1}}
  %d = kvc.decompress %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <lossless = deflate>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <lossless = deflate>>) {
  // expected-error @+1 {{'kvc.decompress' op changes the form or element type of its chunk}}
  %d = kvc.decompress %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <lossless = deflate>>
      -> !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, host>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <transform = hadamard, quant = int4>>) {
  // expected-error @+1 {{'kvc.untransform' op input is still quantized (int4); dequantize it first}}
  %d = kvc.untransform %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <transform = hadamard, quant = int4>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int4>>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>) {
  // expected-error @+1 {{'kvc.untransform' op input is not transformed}}
  %d = kvc.untransform %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8>>) {
  // expected-error @+1 {{'kvc.quant' op input is still quantized (int8); it cannot be quantized twice}}
  %q = kvc.quant %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int4>>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>) {
  // expected-error @+1 {{'kvc.quant' op result names no quantization}}
  %q = kvc.quant %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <lossless = zstd>>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <lossless = zstd>>) {
  // expected-error @+1 {{'kvc.compress' op input is still compressed (zstd); it cannot be compressed twice}}
  %z = kvc.compress %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <lossless = zstd>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <lossless = lz4>>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8>>) {
  // expected-error @+1 {{'kvc.transform' op input is still quantized (int8); transform before quantizing}}
  %t = kvc.transform %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <transform = hadamard, quant = int8>>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>) {
  // expected-error @+1 {{'kvc.transfer_to_device' op input is already on the device}}
  %d = kvc.transfer_to_device %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>) {
  // expected-error @+1 {{'kvc.transfer_to_host' op input is already in host memory}}
  %d = kvc.transfer_to_host %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>) {
  // expected-error @+1 {{'kvc.project' op needs hidden-state input, got a kv chunk}}
  %p = kvc.project %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  return
}

// -----

func.func @f(%c: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, host>) {
  // expected-error @+1 {{'kvc.project' op input is in host memory; transfer it to the device first}}
  %p = kvc.project %c : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, host>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  return
}

// -----

func.func @f(%c: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>) {
  // expected-error @+1 {{'kvc.project' op input is still encoded with #kvc.codec<quant = int8>; decode it first}}
  %p = kvc.project %c : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  return
}

// -----

func.func @f(%c: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device>) {
  // expected-error @+1 {{'kvc.project' op result type '!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>' does not match the expected '!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>'}}
  %p = kvc.project %c : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.chunk_compute' op attends to tokens 0 to 128 of layers 0 to 2, which no 'after' operand provides}}
  %c = kvc.chunk_compute tokens 128 to 256 layers 0 to 2
      : !kvc.chunk<kv x bf16, tokens 128 to 256, layers 0 to 2, device>
  return
}

// -----

func.func @f(%p: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>) {
  // expected-error @+1 {{'kvc.chunk_compute' op attends to tokens 64 to 128 of layers 0 to 2, which no 'after' operand provides}}
  %c = kvc.chunk_compute tokens 128 to 256 layers 0 to 2
      after(%p : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>)
      : !kvc.chunk<kv x bf16, tokens 128 to 256, layers 0 to 2, device>
  return
}

// -----

func.func @f(%p: !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 1, device>) {
  // expected-error @+1 {{'kvc.chunk_compute' op attends to tokens 0 to 128 of layers 1 to 2, which no 'after' operand provides}}
  %c = kvc.chunk_compute tokens 128 to 256 layers 0 to 2
      after(%p : !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 1, device>)
      : !kvc.chunk<kv x bf16, tokens 128 to 256, layers 0 to 2, device>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.chunk_compute' op starts at layer 2 and needs the hidden states entering it ('from')}}
  %c = kvc.chunk_compute tokens 0 to 64 layers 2 to 4
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 2 to 4, device>
  return
}

// -----

func.func @f(%h: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device>) {
  // expected-error @+1 {{'kvc.chunk_compute' op starts at layer 0, which reads token embeddings; drop the hidden-state input}}
  %c = kvc.chunk_compute tokens 0 to 64 layers 0 to 4
      from %h : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device>
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 4, device>
  return
}

// -----

func.func @f(%h: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>) {
  // expected-error @+1 {{'kvc.chunk_compute' op 'from' operand (tokens 0 to 64, layers 0 to 2) does not hold the hidden states entering layer 2 for tokens 0 to 64}}
  %c = kvc.chunk_compute tokens 0 to 64 layers 2 to 4
      from %h : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 2 to 4, device>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.chunk_compute' op result ranges differ from the computed tokens 0 to 64 and layers 0 to 2}}
  %c = kvc.chunk_compute tokens 0 to 64 layers 0 to 2
      : !kvc.chunk<kv x bf16, tokens 0 to 32, layers 0 to 2, device>
  return
}

// -----

func.func @f(%c: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device>) {
  // expected-error @+1 {{'kvc.scatter' op writes KV into the cache, got a hidden chunk; project it first}}
  kvc.scatter %c : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>) {
  // expected-error @+1 {{'kvc.scatter' op input is still encoded with #kvc.codec<quant = int4>; decode it first}}
  kvc.scatter %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>) {
  // expected-error @+1 {{'kvc.store' op writes from host memory; transfer the chunk to the host first}}
  kvc.store %c to "ssd" : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>) {
  // expected-error @+1 {{'kvc.send' op sends from host memory; transfer the chunk to the host first}}
  kvc.send %c to "decode-0" : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.recv' op receives into host memory; the result must be host}}
  %c = kvc.recv from "prefill-0" : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.gather' op result is still encoded with #kvc.codec<quant = int8>; decode it first}}
  %g = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int8>>
  return
}

// -----

// expected-error @+1 {{chunk element type must be bf16, f16 or f32, got 'i8'}}
func.func private @f(!kvc.chunk<kv x i8, tokens 0 to 4, layers 0 to 1, host>)

//===----------------------------------------------------------------------===//
// Exec
//===----------------------------------------------------------------------===//

// -----

func.func @f() {
  %t = kvc.task on compute[0] {
    // expected-error @+1 {{'kvc.fetch' op cannot run on compute}}
    %c = kvc.fetch #kvc.source<tier = "ssd", form = kv, tokens = 0 to 64, layers = 0 to 1>
        tokens 0 to 64 layers 0 to 1 : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
  }
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>) {
  %t = kvc.task on io[0] {
    // expected-error @+1 {{'kvc.kernel' op runs on compute, not on io}}
    kvc.kernel "k" (%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>) -> () {
    ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>):
      kvc.scatter %in : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    }
  }
  return
}

// -----

func.func @f() {
  %t = kvc.task on compute[0] {
    %x = arith.constant 0 : i32
    // expected-error @-1 {{'arith.constant' op is not a dataflow step and cannot run in a task}}
  }
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.task' op lane must not be negative, got -1}}
  %t = kvc.task on io[-1] {
  }
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.task' op slot must not be negative, got -2}}
  %t = kvc.task on io[0] slot -2 {
  }
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>) {
  // expected-error @+1 {{'kvc.task' op body yields 1 values of types '!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>', but the op returns}}
  %t = kvc.task on io[0] {
    kvc.yield %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
  }
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>) {
  kvc.kernel "k" (%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>) -> () {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>):
    // expected-error @+1 {{'kvc.fetch' op cannot be fused into a kernel}}
    %x = kvc.fetch #kvc.source<tier = "ssd", form = kv, tokens = 0 to 64, layers = 0 to 1>
        tokens 0 to 64 layers 0 to 1 : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
  }
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>) {
  // expected-error @+1 {{'kvc.kernel' op body arguments}}
  kvc.kernel "k" (%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>) -> () {
  ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 32, layers 0 to 1, device>):
    kvc.scatter %in : !kvc.chunk<kv x bf16, tokens 0 to 32, layers 0 to 1, device>
  }
  return
}

// -----

// expected-error @+3 {{gemm_peak_fraction must lie in (0, 1], got 1.5}}
// expected-error @+2 {{failed to parse KVC_TargetAttr parameter 'compute'}}
module attributes {kvc.target = #kvc.target<name = "t",
    compute = <kind = gpu, name = "g", dense_tflops = 1, mem_gbs = 1, mem_gib = 1, restore_share = 1, gemm_peak_fraction = 1.5>,
    host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
    link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>,
    tiers = [#kvc.tier<name = "dram", kind = dram, read_gbs = 10, write_gbs = 10, latency_us = 1>]>} {}

// -----

// expected-error @+3 {{gemm_half_tokens must not be negative}}
// expected-error @+2 {{failed to parse KVC_TargetAttr parameter 'compute'}}
module attributes {kvc.target = #kvc.target<name = "t",
    compute = <kind = gpu, name = "g", dense_tflops = 1, mem_gbs = 1, mem_gib = 1, restore_share = 1, gemm_half_tokens = -1>,
    host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
    link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>,
    tiers = [#kvc.tier<name = "dram", kind = dram, read_gbs = 10, write_gbs = 10, latency_us = 1>]>} {}

// -----

// expected-error @+1 {{latency_us must not be negative}}
module attributes {kvc.example = #kvc.link<h2d_gbs = 10, d2h_gbs = 10, latency_us = -1>} {}

// -----

// expected-error @+1 {{tier name must not be empty}}
module attributes {kvc.example = #kvc.tier<name = "", kind = dram, read_gbs = 10, write_gbs = 10, latency_us = 1>} {}

// -----

// expected-error @+1 {{latency_us must not be negative}}
module attributes {kvc.example = #kvc.tier<name = "ssd", kind = disk, read_gbs = 1, write_gbs = 1, latency_us = -3>} {}

// -----

// expected-error @+1 {{throttle_gbs must not be negative}}
module attributes {kvc.example = #kvc.tier<name = "ssd", kind = disk, read_gbs = 1, write_gbs = 1, latency_us = 3, throttle_gbs = -1>} {}

// -----

// expected-error @+1 {{target name must not be empty}}
module attributes {kvc.target = #kvc.target<name = "",
    compute = <kind = gpu, name = "g", dense_tflops = 1, mem_gbs = 1, mem_gib = 1, restore_share = 1>,
    host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
    link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>,
    tiers = [#kvc.tier<name = "dram", kind = dram, read_gbs = 10, write_gbs = 10, latency_us = 1>]>} {}

// -----

// expected-error @+1 {{codecs must hold #kvc.codec_rate attributes, got 1 : i64}}
module attributes {kvc.target = #kvc.target<name = "t",
    compute = <kind = gpu, name = "g", dense_tflops = 1, mem_gbs = 1, mem_gib = 1, restore_share = 1>,
    host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
    link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>,
    tiers = [#kvc.tier<name = "dram", kind = dram, read_gbs = 10, write_gbs = 10, latency_us = 1>],
    codecs = [1 : i64]>} {}

// -----

// expected-error @+1 {{source tier must not be empty}}
kvc.restore @r tokens 0 to 4 from [#kvc.source<tier = "", form = kv, tokens = 0 to 4, layers = 0 to 1>]

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8>>) {
  // expected-error @+1 {{'kvc.compress' op result names no lossless coder}}
  %z = kvc.compress %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8>>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>) {
  // expected-error @+1 {{'kvc.transform' op input is already transformed}}
  %t = kvc.transform %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>
  return
}

// -----

func.func @f(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>) {
  // expected-error @+1 {{'kvc.transform' op result names no transform}}
  %t = kvc.transform %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.fetch' op result ranges differ from the fetched tokens 0 to 64 and layers 0 to 1}}
  %c = kvc.fetch #kvc.source<tier = "ssd", form = kv, tokens = 0 to 64, layers = 0 to 1> tokens 0 to 64 layers 0 to 1
      : !kvc.chunk<kv x bf16, tokens 0 to 32, layers 0 to 1, host>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.chunk_compute' op result must be raw KV on the device, got a hidden chunk}}
  %c = kvc.chunk_compute tokens 0 to 64 layers 0 to 2
      : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>
  return
}

// -----

func.func @f(%k: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>) {
  // expected-error @+1 {{'kvc.chunk_compute' op 'from' operand must hold hidden states, got a kv chunk}}
  %c = kvc.chunk_compute tokens 0 to 64 layers 2 to 4
      from %k : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 2 to 4, device>
  return
}

// -----

func.func @f(%h: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>) {
  // expected-error @+1 {{'kvc.chunk_compute' op 'after' operands must hold KV, got a hidden chunk}}
  %c = kvc.chunk_compute tokens 64 to 128 layers 0 to 2
      after(%h : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>)
      : !kvc.chunk<kv x bf16, tokens 64 to 128, layers 0 to 2, device>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'kvc.recv' op needs a source node}}
  %r = kvc.recv from "" : !kvc.chunk<kv x f32, tokens 0 to 64, layers 0 to 32, host>
  return
}

// -----

// expected-error @+3 {{chip "sm_90" names a GPU architecture, but the compute is a cpu}}
// expected-error @+2 {{failed to parse KVC_TargetAttr parameter 'compute'}}
module attributes {kvc.target = #kvc.target<name = "t",
    compute = <kind = cpu, name = "c", dense_tflops = 1, mem_gbs = 1, mem_gib = 1, restore_share = 1, chip = "sm_90">,
    host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
    link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>,
    tiers = [#kvc.tier<name = "dram", kind = dram, read_gbs = 10, write_gbs = 10, latency_us = 1>]>} {}

// -----

// expected-error @+3 {{chip "sm_70" is no architecture kvc generates kernels for (expected sm_80, sm_86, sm_89, sm_90 or sm_90a)}}
// expected-error @+2 {{failed to parse KVC_TargetAttr parameter 'compute'}}
module attributes {kvc.target = #kvc.target<name = "t",
    compute = <kind = gpu, name = "g", dense_tflops = 1, mem_gbs = 1, mem_gib = 1, restore_share = 1, chip = "sm_70">,
    host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
    link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>,
    tiers = [#kvc.tier<name = "dram", kind = dram, read_gbs = 10, write_gbs = 10, latency_us = 1>]>} {}

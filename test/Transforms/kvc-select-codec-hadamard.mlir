// RUN: kvc-opt %s --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%inputs/slow-link.json "--kvc-select-codec=codec-profile=%inputs/hadamard-profile.json" | FileCheck %s --check-prefix=POW2
// RUN: kvc-opt %s --kvc-import-model=%inputs/head-dim-80/config.json --kvc-attach-target=%inputs/slow-link.json "--kvc-select-codec=codec-profile=%inputs/hadamard-profile.json" | FileCheck %s --check-prefix=DIM80

// Tests that a profile's Hadamard codec is a candidate only for a model
// whose KV rows it can rotate: with head_dim 128 the rotated int4 codec,
// smaller and within the budget, wins; with head_dim 80 (no power-of-two
// blocks) it is left out and int8 is chosen.
// POW2:  kvc.save @s tokens 0 to 4096 kv to "net" codec <transform = hadamard, quant = int4>
// POW2:  kvc.transfer @t tokens 0 to 4096 to "decode-0" codec <transform = hadamard, quant = int4>
// DIM80: kvc.save @s tokens 0 to 4096 kv to "net" codec <quant = int8>
// DIM80: kvc.transfer @t tokens 0 to 4096 to "decode-0" codec <quant = int8>
kvc.save @s tokens 0 to 4096 kv to "net" {max_error = 0.05}
kvc.transfer @t tokens 0 to 4096 to "decode-0" {max_error = 0.05}

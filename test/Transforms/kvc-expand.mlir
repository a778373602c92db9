// RUN: kvc-opt %s --split-input-file --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-expand | FileCheck %s
// RUN: kvc-opt %s --split-input-file --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json --kvc-expand=chunk-tokens=128 | FileCheck %s --check-prefix=OBJECTS
// RUN: kvc-opt %s --split-input-file --kvc-import-model=%inputs/four-layers/config.json --kvc-attach-target=%kvc_src/targets/a100-40gb.json "--kvc-expand=chunk-tokens=128 layer-wise=true" | FileCheck %s --check-prefix=LAYERWISE

#hidden = #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 1024, layers = 0 to 4>
#kv = #kvc.source<tier = "dram", form = kv,
                  codec = <transform = hadamard, quant = int4, lossless = deflate>,
                  tokens = 0 to 1024, layers = 0 to 4>

// Tests that each segment becomes per-chunk dataflow on the 512-token grid:
// loads are decompressed on the host, cross the link still quantized, and
// are dequantized, untransformed (KV) or projected (hidden states) and
// scattered on the device.
// CHECK-LABEL: kvc.plan @joint tokens 0 to 1024 layers 0 to 4 {
// CHECK:         %[[C:.+]] = kvc.chunk_compute tokens 0 to 512 layers 0 to 4 : !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 4, device>
// CHECK-NEXT:    kvc.scatter %[[C]]
// CHECK-NEXT:    %[[F:.+]] = kvc.fetch #{{.+}} tokens 512 to 1024 layers 0 to 1 : !kvc.chunk<kv x f16, tokens 512 to 1024, layers 0 to 1, host, codec <transform = hadamard, quant = int4, lossless = deflate>>
// CHECK-NEXT:    %[[D:.+]] = kvc.decompress %[[F]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 512 to 1024, layers 0 to 1, host, codec <transform = hadamard, quant = int4>>
// CHECK-NEXT:    %[[G:.+]] = kvc.transfer_to_device %[[D]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 512 to 1024, layers 0 to 1, device, codec <transform = hadamard, quant = int4>>
// CHECK-NEXT:    %[[Q:.+]] = kvc.dequant %[[G]]
// CHECK-NEXT:    %[[U:.+]] = kvc.untransform %[[Q]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 512 to 1024, layers 0 to 1, device>
// CHECK-NEXT:    kvc.scatter %[[U]]
// CHECK-NEXT:    %[[H:.+]] = kvc.fetch #{{.+}} tokens 512 to 1024 layers 1 to 4 : !kvc.chunk<hidden x f16, tokens 512 to 1024, layers 1 to 4, host>
// CHECK-NEXT:    %[[HD:.+]] = kvc.transfer_to_device %[[H]]
// CHECK-NEXT:    %[[P:.+]] = kvc.project %[[HD]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 512 to 1024, layers 1 to 4, device>
// CHECK-NEXT:    kvc.scatter %[[P]]
// CHECK-NEXT:  }
kvc.plan @joint tokens 0 to 1024 layers 0 to 4 {
  kvc.segment compute tokens 0 to 512 layers 0 to 4
  kvc.segment load_kv tokens 512 to 1024 layers 0 to 1 from #kv
  kvc.segment load_hidden tokens 512 to 1024 layers 1 to 4 from #hidden
}

// -----

#kv = #kvc.source<tier = "dram", form = kv, tokens = 0 to 1536, layers = 0 to 4>

// Tests that a computed chunk runs after every chunk holding its earlier
// tokens, whether computed or loaded.
// CHECK-LABEL: kvc.plan @compute_after_load
// CHECK:         %[[L:.+]] = kvc.transfer_to_device
// CHECK:         kvc.scatter %[[L]]
// CHECK:         %[[C1:.+]] = kvc.chunk_compute tokens 512 to 1024 layers 0 to 4 after(%[[L]] : !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 4, device>)
// CHECK:         %[[C2:.+]] = kvc.chunk_compute tokens 1024 to 1536 layers 0 to 4 after(%[[L]], %[[C1]] : !kvc.chunk<kv x f16, tokens 0 to 512, layers 0 to 4, device>, !kvc.chunk<kv x f16, tokens 512 to 1024, layers 0 to 4, device>)
kvc.plan @compute_after_load tokens 0 to 1536 layers 0 to 4 {
  kvc.segment load_kv tokens 0 to 512 layers 0 to 4 from #kv
  kvc.segment compute tokens 512 to 1536 layers 0 to 4
}

// -----

#hidden = #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 512, layers = 0 to 4>

// Tests that a compute segment above layer 0 reads the hidden states entering
// its first layer from its source.
// CHECK-LABEL: kvc.plan @compute_from_hidden
// CHECK:         %[[H:.+]] = kvc.fetch #{{.+}} tokens 0 to 512 layers 2 to 3 : !kvc.chunk<hidden x f16
// CHECK-NEXT:    %[[HD:.+]] = kvc.transfer_to_device %[[H]]
// CHECK-NEXT:    %[[C:.+]] = kvc.chunk_compute tokens 0 to 512 layers 2 to 4 from %[[HD]]
kvc.plan @compute_from_hidden tokens 0 to 512 layers 0 to 4 {
  kvc.segment load_hidden tokens 0 to 512 layers 0 to 2 from #hidden
  kvc.segment compute tokens 0 to 512 layers 2 to 4 from #hidden
}

// -----

#kv = #kvc.source<tier = "dram", form = kv, tokens = 0 to 1024, layers = 0 to 4,
                  token_group = 256, layer_group = 2>

// Tests that a source's stored objects set the grain of its loads: with
// 256-token, 2-layer objects each fetch reads whole objects, never the
// finer 128-token chunks asked for.
// OBJECTS-LABEL: kvc.plan @whole_objects
// OBJECTS:         kvc.fetch #{{.+}} tokens 0 to 256 layers 0 to 4 :
// OBJECTS:         kvc.fetch #{{.+}} tokens 256 to 512 layers 0 to 4 :
// OBJECTS:         kvc.fetch #{{.+}} tokens 512 to 768 layers 0 to 4 :
// OBJECTS:         kvc.fetch #{{.+}} tokens 768 to 1024 layers 0 to 4 :
// OBJECTS-NEXT:    kvc.transfer_to_device
// OBJECTS-NOT:     kvc.fetch

// Tests that layer-wise, loads are as deep as the stored objects and issued
// layer by layer: every token of layers 0 to 2 before any of layers 2 to 4.
// LAYERWISE-LABEL: kvc.plan @whole_objects
// LAYERWISE:         kvc.fetch #{{.+}} tokens 0 to 256 layers 0 to 2 :
// LAYERWISE:         kvc.fetch #{{.+}} tokens 256 to 512 layers 0 to 2 :
// LAYERWISE:         kvc.fetch #{{.+}} tokens 512 to 768 layers 0 to 2 :
// LAYERWISE:         kvc.fetch #{{.+}} tokens 768 to 1024 layers 0 to 2 :
// LAYERWISE:         kvc.fetch #{{.+}} tokens 0 to 256 layers 2 to 4 :
// LAYERWISE:         kvc.fetch #{{.+}} tokens 256 to 512 layers 2 to 4 :
// LAYERWISE:         kvc.fetch #{{.+}} tokens 512 to 768 layers 2 to 4 :
// LAYERWISE:         kvc.fetch #{{.+}} tokens 768 to 1024 layers 2 to 4 :
// LAYERWISE-NOT:     kvc.fetch
kvc.plan @whole_objects tokens 0 to 1024 layers 0 to 4 {
  kvc.segment load_kv tokens 0 to 1024 layers 0 to 4 from #kv
}

// -----

// Tests that a kvc.save becomes a save plan: per object of its layout (256
// tokens x 2 layers, the last chunk partial) and form, gather, quant on the
// device, the copy to the host, compress and store; the transform comes
// first when the codec has one, and raw data goes straight to the host.
// CHECK-LABEL: kvc.plan @save tokens 0 to 300 layers 0 to 4 strategy "save" prefill_step 256 {
// CHECK-NEXT:    %[[G:.+]] = kvc.gather : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, device>
// CHECK-NEXT:    %[[T:.+]] = kvc.transform %[[G]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, device, codec <transform = hadamard>>
// CHECK-NEXT:    %[[Q:.+]] = kvc.quant %[[T]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, device, codec <transform = hadamard, quant = int4>>
// CHECK-NEXT:    %[[H:.+]] = kvc.transfer_to_host %[[Q]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, host, codec <transform = hadamard, quant = int4>>
// CHECK-NEXT:    %[[Z:.+]] = kvc.compress %[[H]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, host, codec <transform = hadamard, quant = int4, lossless = zstd>>
// CHECK-NEXT:    kvc.store %[[Z]] to "ssd"
// CHECK-NEXT:    kvc.gather : !kvc.chunk<hidden x f16, tokens 0 to 256, layers 0 to 2, device>
// CHECK:         kvc.gather : !kvc.chunk<kv x f16, tokens 0 to 256, layers 2 to 4, device>
// CHECK:         kvc.gather : !kvc.chunk<kv x f16, tokens 256 to 300, layers 0 to 2, device>
// CHECK:         %[[LAST:.+]] = kvc.compress {{.*}} -> !kvc.chunk<hidden x f16, tokens 256 to 300, layers 2 to 4, host, codec <transform = hadamard, quant = int4, lossless = zstd>>
// CHECK-NEXT:    kvc.store %[[LAST]] to "ssd"
// CHECK-NEXT:  }
// CHECK-LABEL: kvc.plan @raw tokens 0 to 256 layers 0 to 4 strategy "save" prefill_step 256 {
// CHECK-NEXT:    %[[G:.+]] = kvc.gather : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, device>
// CHECK-NEXT:    %[[H:.+]] = kvc.transfer_to_host %[[G]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, host>
// CHECK-NEXT:    kvc.store %[[H]] to "ssd" : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, host>
// CHECK-NEXT:  }
// CHECK-NOT:   kvc.save
//
// Layer-wise, the objects go layer group by layer group, each object's
// forms together, beside a prefill of the whole request in one step (the
// multiple of the 256-token objects that covers it).
// LAYERWISE-LABEL: kvc.plan @save tokens 0 to 300 layers 0 to 4 strategy "save" prefill_step 512 {
// LAYERWISE:         kvc.gather : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, device>
// LAYERWISE:         kvc.gather : !kvc.chunk<hidden x f16, tokens 0 to 256, layers 0 to 2, device>
// LAYERWISE:         kvc.gather : !kvc.chunk<kv x f16, tokens 256 to 300, layers 0 to 2, device>
// LAYERWISE:         kvc.gather : !kvc.chunk<hidden x f16, tokens 256 to 300, layers 0 to 2, device>
// LAYERWISE:         kvc.gather : !kvc.chunk<kv x f16, tokens 0 to 256, layers 2 to 4, device>
kvc.save @save tokens 0 to 300 kv hidden to "ssd"
    codec <transform = hadamard, quant = int4, lossless = zstd> {layer_group = 2 : i64}
kvc.save @raw tokens 0 to 256 kv to "ssd"

// -----

// Tests that a kvc.transfer becomes two plans over the same objects (256
// tokens x 2 layers, the last chunk partial): the sender's gathers,
// quantizes on the device, copies to the host, compresses and sends each to
// the receiving node; the receiver's receives each from the sending node,
// decompresses it on the host, copies it to the device still quantized,
// dequantizes and scatters it.
// CHECK-LABEL: kvc.plan @req_send tokens 0 to 300 layers 0 to 4 strategy "send" prefill_step 256 {
// CHECK-NEXT:    %[[G:.+]] = kvc.gather : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, device>
// CHECK-NEXT:    %[[Q:.+]] = kvc.quant %[[G]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, device, codec <quant = int8>>
// CHECK-NEXT:    %[[H:.+]] = kvc.transfer_to_host %[[Q]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, host, codec <quant = int8>>
// CHECK-NEXT:    %[[Z:.+]] = kvc.compress %[[H]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, host, codec <quant = int8, lossless = zstd>>
// CHECK-NEXT:    kvc.send %[[Z]] to "decode-0"
// CHECK:         kvc.gather : !kvc.chunk<kv x f16, tokens 0 to 256, layers 2 to 4, device>
// CHECK:         kvc.gather : !kvc.chunk<kv x f16, tokens 256 to 300, layers 0 to 2, device>
// CHECK:         %[[LAST:.+]] = kvc.compress {{.*}} -> !kvc.chunk<kv x f16, tokens 256 to 300, layers 2 to 4, host, codec <quant = int8, lossless = zstd>>
// CHECK-NEXT:    kvc.send %[[LAST]] to "decode-0"
// CHECK-NEXT:  }
// CHECK-LABEL: kvc.plan @req_recv tokens 0 to 300 layers 0 to 4 strategy "receive" {
// CHECK-NEXT:    %[[R:.+]] = kvc.recv from "prefill-0" : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, host, codec <quant = int8, lossless = zstd>>
// CHECK-NEXT:    %[[D:.+]] = kvc.decompress %[[R]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, host, codec <quant = int8>>
// CHECK-NEXT:    %[[V:.+]] = kvc.transfer_to_device %[[D]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, device, codec <quant = int8>>
// CHECK-NEXT:    %[[X:.+]] = kvc.dequant %[[V]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, device>
// CHECK-NEXT:    kvc.scatter %[[X]]
// CHECK:         kvc.recv from "prefill-0" : !kvc.chunk<kv x f16, tokens 256 to 300, layers 2 to 4, host, codec <quant = int8, lossless = zstd>>
// CHECK:       }
// CHECK-LABEL: kvc.plan @raw_send tokens 0 to 256 layers 0 to 4 strategy "send" prefill_step 256 {
// CHECK-NEXT:    %[[G:.+]] = kvc.gather : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, device>
// CHECK-NEXT:    %[[H:.+]] = kvc.transfer_to_host %[[G]] : {{.*}} -> !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, host>
// CHECK-NEXT:    kvc.send %[[H]] to "decode-1"
// CHECK-NEXT:  }
// CHECK-LABEL: kvc.plan @raw_recv tokens 0 to 256 layers 0 to 4 strategy "receive" {
// CHECK-NEXT:    %[[R:.+]] = kvc.recv from "prefill" : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 4, host>
// CHECK-NEXT:    %[[V:.+]] = kvc.transfer_to_device %[[R]]
// CHECK-NEXT:    kvc.scatter %[[V]]
// CHECK-NEXT:  }
// CHECK-NOT:   kvc.transfer @
//
// Layer-wise, both plans issue the objects layer group by layer group, as
// a prefill of the whole request in one step completes them.
// LAYERWISE-LABEL: kvc.plan @req_send tokens 0 to 300 layers 0 to 4 strategy "send" prefill_step 512 {
// LAYERWISE:         kvc.gather : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2, device>
// LAYERWISE:         kvc.gather : !kvc.chunk<kv x f16, tokens 256 to 300, layers 0 to 2, device>
// LAYERWISE:         kvc.gather : !kvc.chunk<kv x f16, tokens 0 to 256, layers 2 to 4, device>
// LAYERWISE:         kvc.gather : !kvc.chunk<kv x f16, tokens 256 to 300, layers 2 to 4, device>
// LAYERWISE-LABEL: kvc.plan @req_recv tokens 0 to 300 layers 0 to 4 strategy "receive" {
// LAYERWISE:         kvc.recv from "prefill-0" : !kvc.chunk<kv x f16, tokens 0 to 256, layers 0 to 2,
// LAYERWISE:         kvc.recv from "prefill-0" : !kvc.chunk<kv x f16, tokens 256 to 300, layers 0 to 2,
// LAYERWISE:         kvc.recv from "prefill-0" : !kvc.chunk<kv x f16, tokens 0 to 256, layers 2 to 4,
// LAYERWISE:         kvc.recv from "prefill-0" : !kvc.chunk<kv x f16, tokens 256 to 300, layers 2 to 4,
kvc.transfer @req tokens 0 to 300 from "prefill-0" to "decode-0"
    codec <quant = int8, lossless = zstd> {layer_group = 2 : i64}
kvc.transfer @raw tokens 0 to 256 to "decode-1"

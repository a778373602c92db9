// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s --check-prefix=MODEL

// Tests that every kvc op round-trips through its custom and generic forms.

// CHECK-DAG: #[[HIDDEN:.+]] = #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 4096, layers = 0 to 32, token_group = 256, layer_group = 4>
// CHECK-DAG: #[[KV8:.+]] = #kvc.source<tier = "dram", form = kv, codec = <quant = int8, lossless = deflate>, tokens = 0 to 2048, layers = 0 to 32>
// CHECK-DAG: #[[KV4:.+]] = #kvc.source<tier = "ssd", form = kv, codec = <transform = hadamard, quant = int4, group = 64, lossless = zstd>, tokens = 0 to 512, layers = 0 to 2>
// CHECK-DAG: #[[HID2:.+]] = #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 512, layers = 0 to 2>
#hidden = #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 4096, layers = 0 to 32,
                      token_group = 256, layer_group = 4>
#kv8 = #kvc.source<tier = "dram", form = kv, codec = <quant = int8, lossless = deflate>,
                   tokens = 0 to 2048, layers = 0 to 32>
#kv4 = #kvc.source<tier = "ssd", form = kv,
                   codec = <transform = hadamard, quant = int4, group = 64, lossless = zstd>,
                   tokens = 0 to 512, layers = 0 to 2>
#hid2 = #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 512, layers = 0 to 2>

// Intent level.

// CHECK: kvc.restore @chat tokens 0 to 4096 from [#[[HIDDEN]], #[[KV8]]] {forward_tokens = 512 : i64, max_error = 1.000000e-02 : f64, slo_ms = 2.000000e+02 : f64}
kvc.restore @chat tokens 0 to 4096 from [#hidden, #kv8] {slo_ms = 200.0, max_error = 0.01, forward_tokens = 512}
// CHECK: kvc.restore @cold tokens 0 to 128 from []
kvc.restore @cold tokens 0 to 128 from []
// CHECK: kvc.save @doc tokens 0 to 4096 kv hidden to "ssd" codec <quant = int8, lossless = zstd>
kvc.save @doc tokens 0 to 4096 kv hidden to "ssd" codec <quant = int8, lossless = zstd>
// CHECK: kvc.save @hidden_only tokens 0 to 64 hidden to "dram"{{$}}
kvc.save @hidden_only tokens 0 to 64 hidden to "dram"
// CHECK: kvc.transfer @req tokens 0 to 2048 to "decode-0" codec <quant = int2, key_axis = token, value_axis = channel, group = 128> {slo_ms = 5.000000e+01 : f64}
kvc.transfer @req tokens 0 to 2048 to "decode-0"
    codec <quant = int2, key_axis = token, value_axis = channel, group = 128> {slo_ms = 50.0}
// CHECK: kvc.transfer @pd tokens 0 to 512 from "prefill-0" to "decode-1" {layer_group = 1 : i64}
kvc.transfer @pd tokens 0 to 512 from "prefill-0" to "decode-1" {layer_group = 1 : i64}

// Strategy level.

// CHECK-LABEL: kvc.plan @joint tokens 0 to 4096 layers 0 to 32 {
// CHECK-NEXT:    kvc.segment compute tokens 0 to 1024 layers 0 to 32
// CHECK-NEXT:    kvc.segment compute tokens 1024 to 4096 layers 0 to 2
// CHECK-NEXT:    kvc.segment load_hidden tokens 1024 to 4096 layers 2 to 30 from #[[HIDDEN]]
// CHECK-NEXT:    kvc.segment compute tokens 1024 to 4096 layers 30 to 32 from #[[HIDDEN]]
// CHECK-NEXT:  }
kvc.plan @joint tokens 0 to 4096 layers 0 to 32 {
  kvc.segment compute tokens 0 to 1024 layers 0 to 32
  kvc.segment compute tokens 1024 to 4096 layers 0 to 2
  kvc.segment load_hidden tokens 1024 to 4096 layers 2 to 30 from #hidden
  kvc.segment compute tokens 1024 to 4096 layers 30 to 32 from #hidden
}

// CHECK-LABEL: kvc.plan @kv_load tokens 0 to 2048 layers 0 to 32 {
// CHECK-NEXT:    kvc.segment load_kv tokens 0 to 2048 layers 0 to 32 from #[[KV8]]
kvc.plan @kv_load tokens 0 to 2048 layers 0 to 32 {
  kvc.segment load_kv tokens 0 to 2048 layers 0 to 32 from #kv8
}

// Dataflow level: restore side.

// CHECK-LABEL: kvc.plan @dataflow tokens 0 to 512 layers 0 to 2 {
// CHECK:         %[[C0:.+]] = kvc.chunk_compute tokens 0 to 128 layers 0 to 2 : !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 2, device>
// CHECK:         kvc.scatter %[[C0]] : !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 2, device>
// CHECK:         %[[C1:.+]] = kvc.chunk_compute tokens 128 to 256 layers 0 to 1 after(%[[C0]] : !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 2, device>) : !kvc.chunk<kv x bf16, tokens 128 to 256, layers 0 to 1, device>
// CHECK:         %[[H:.+]] = kvc.fetch #[[HID2]] tokens 128 to 256 layers 1 to 2 : !kvc.chunk<hidden x bf16, tokens 128 to 256, layers 1 to 2, host>
// CHECK:         %[[HD:.+]] = kvc.transfer_to_device %[[H]]
// CHECK:         %[[C2:.+]] = kvc.chunk_compute tokens 128 to 256 layers 1 to 2 from %[[HD]] : !kvc.chunk<hidden x bf16, tokens 128 to 256, layers 1 to 2, device> after(%[[C0]] : !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 2, device>) : !kvc.chunk<kv x bf16, tokens 128 to 256, layers 1 to 2, device>
// CHECK:         %[[F:.+]] = kvc.fetch #[[KV4]] tokens 256 to 512 layers 0 to 2 : !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, host, codec <transform = hadamard, quant = int4, group = 64, lossless = zstd>>
// CHECK:         %[[D:.+]] = kvc.decompress %[[F]] : {{.*}} -> !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, host, codec <transform = hadamard, quant = int4, group = 64>>
// CHECK:         %[[Q:.+]] = kvc.dequant %[[D]] : {{.*}} -> !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, host, codec <transform = hadamard>>
// CHECK:         %[[G:.+]] = kvc.transfer_to_device %[[Q]]
// CHECK:         %[[U:.+]] = kvc.untransform %[[G]] : {{.*}} -> !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, device>
// CHECK:         kvc.scatter %[[U]]
kvc.plan @dataflow tokens 0 to 512 layers 0 to 2 {
  %c0 = kvc.chunk_compute tokens 0 to 128 layers 0 to 2
      : !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 2, device>
  kvc.scatter %c0 : !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 2, device>
  %c1 = kvc.chunk_compute tokens 128 to 256 layers 0 to 1
      after(%c0 : !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 2, device>)
      : !kvc.chunk<kv x bf16, tokens 128 to 256, layers 0 to 1, device>
  kvc.scatter %c1 : !kvc.chunk<kv x bf16, tokens 128 to 256, layers 0 to 1, device>
  %h = kvc.fetch #hid2 tokens 128 to 256 layers 1 to 2
      : !kvc.chunk<hidden x bf16, tokens 128 to 256, layers 1 to 2, host>
  %hd = kvc.transfer_to_device %h
      : !kvc.chunk<hidden x bf16, tokens 128 to 256, layers 1 to 2, host>
      -> !kvc.chunk<hidden x bf16, tokens 128 to 256, layers 1 to 2, device>
  %c2 = kvc.chunk_compute tokens 128 to 256 layers 1 to 2
      from %hd : !kvc.chunk<hidden x bf16, tokens 128 to 256, layers 1 to 2, device>
      after(%c0 : !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 2, device>)
      : !kvc.chunk<kv x bf16, tokens 128 to 256, layers 1 to 2, device>
  kvc.scatter %c2 : !kvc.chunk<kv x bf16, tokens 128 to 256, layers 1 to 2, device>
  %f = kvc.fetch #kv4 tokens 256 to 512 layers 0 to 2
      : !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, host,
                   codec <transform = hadamard, quant = int4, group = 64, lossless = zstd>>
  %d = kvc.decompress %f
      : !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, host,
                   codec <transform = hadamard, quant = int4, group = 64, lossless = zstd>>
      -> !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, host,
                    codec <transform = hadamard, quant = int4, group = 64>>
  %q = kvc.dequant %d
      : !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, host,
                   codec <transform = hadamard, quant = int4, group = 64>>
      -> !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, host, codec <transform = hadamard>>
  %g = kvc.transfer_to_device %q
      : !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, host, codec <transform = hadamard>>
      -> !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, device, codec <transform = hadamard>>
  %u = kvc.untransform %g
      : !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, device, codec <transform = hadamard>>
      -> !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, device>
  kvc.scatter %u : !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, device>
}

// CHECK-LABEL: func.func @project
// CHECK-SAME:    (%[[H:.+]]: !kvc.chunk<hidden x f16, tokens 0 to 64, layers 4 to 8, device>)
// CHECK:         %[[KV:.+]] = kvc.project %[[H]] : !kvc.chunk<hidden x f16, tokens 0 to 64, layers 4 to 8, device> -> !kvc.chunk<kv x f16, tokens 0 to 64, layers 4 to 8, device>
// CHECK:         kvc.scatter %[[KV]]
func.func @project(%h: !kvc.chunk<hidden x f16, tokens 0 to 64, layers 4 to 8, device>) {
  %kv = kvc.project %h
      : !kvc.chunk<hidden x f16, tokens 0 to 64, layers 4 to 8, device>
      -> !kvc.chunk<kv x f16, tokens 0 to 64, layers 4 to 8, device>
  kvc.scatter %kv : !kvc.chunk<kv x f16, tokens 0 to 64, layers 4 to 8, device>
  return
}

// Dataflow level: save and transfer sides.

// CHECK-LABEL: func.func @save
// CHECK:         %[[G:.+]] = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, device>
// CHECK:         %[[T:.+]] = kvc.transform %[[G]] : {{.*}} -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, device, codec <transform = hadamard>>
// CHECK:         %[[Q:.+]] = kvc.quant %[[T]] : {{.*}} -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, device, codec <transform = hadamard, quant = int2, group = 16>>
// CHECK:         %[[H:.+]] = kvc.transfer_to_host %[[Q]]
// CHECK:         %[[Z:.+]] = kvc.compress %[[H]] : {{.*}} -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, host, codec <transform = hadamard, quant = int2, group = 16, lossless = lz4>>
// CHECK:         kvc.store %[[Z]] to "ssd" : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, host, codec <transform = hadamard, quant = int2, group = 16, lossless = lz4>>
// CHECK:         kvc.send %[[Z]] to "decode-0" : !kvc.chunk
// CHECK:         %{{.+}} = kvc.recv from "prefill-0" : !kvc.chunk<kv x f32, tokens 0 to 64, layers 0 to 32, host>
func.func @save() {
  %g = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, device>
  %t = kvc.transform %g
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, device, codec <transform = hadamard>>
  %q = kvc.quant %t
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, device, codec <transform = hadamard>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, device,
                    codec <transform = hadamard, quant = int2, group = 16>>
  %h = kvc.transfer_to_host %q
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, device,
                   codec <transform = hadamard, quant = int2, group = 16>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, host,
                    codec <transform = hadamard, quant = int2, group = 16>>
  %z = kvc.compress %h
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, host,
                   codec <transform = hadamard, quant = int2, group = 16>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, host,
                    codec <transform = hadamard, quant = int2, group = 16, lossless = lz4>>
  kvc.store %z to "ssd"
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, host,
                   codec <transform = hadamard, quant = int2, group = 16, lossless = lz4>>
  kvc.send %z to "decode-0"
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, host,
                   codec <transform = hadamard, quant = int2, group = 16, lossless = lz4>>
  %r = kvc.recv from "prefill-0" : !kvc.chunk<kv x f32, tokens 0 to 64, layers 0 to 32, host>
  return
}

// A sender runs beside a prefill of 128 tokens a step.
// CHECK-LABEL: kvc.plan @t_send tokens 0 to 128 layers 0 to 2 strategy "send" prefill_step 128 predicted 9 us {
// CHECK:         kvc.send %{{.+}} to "decode-0"
kvc.plan @t_send tokens 0 to 128 layers 0 to 2 strategy "send" prefill_step 128 predicted 9 us {
  %g = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 2, device>
  %h = kvc.transfer_to_host %g
      : !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 2, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 2, host>
  kvc.send %h to "decode-0" : !kvc.chunk<kv x bf16, tokens 0 to 128, layers 0 to 2, host>
}

// Exec level.

// CHECK-LABEL: func.func @exec
// CHECK:         %[[T0:.+]], %[[F:.+]] = kvc.task on io[1] slot 3 {
// CHECK:           %[[C:.+]] = kvc.fetch #[[KV4]] tokens 0 to 64 layers 0 to 2
// CHECK:           kvc.yield %[[C]] : !kvc.chunk
// CHECK:         } : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host, codec <transform = hadamard, quant = int4, group = 64, lossless = zstd>>
// CHECK:         %[[T1:.+]], %[[D:.+]] = kvc.task on decode[0] after %[[T0]] {
// CHECK:         %[[T2:.+]], %[[G:.+]] = kvc.task on h2d[0] after %[[T1]] {
// CHECK:         %{{.+}} = kvc.task on compute[0] after %[[T2]], %[[T0]] {
// CHECK-NEXT:      kvc.kernel "dequant_untransform_scatter"(%[[G]]) : (!kvc.chunk<{{.*}}>) -> () {
// CHECK-NEXT:      ^bb0(%[[IN:.+]]: !kvc.chunk<{{.*}}>):
// CHECK-NEXT:        %[[DQ:.+]] = kvc.dequant %[[IN]]
// CHECK-NEXT:        %[[UT:.+]] = kvc.untransform %[[DQ]]
// CHECK-NEXT:        kvc.scatter %[[UT]]
// CHECK-NEXT:      }
// CHECK-NEXT:    }
func.func @exec() {
  %t0, %f = kvc.task on io[1] slot 3 {
    %c = kvc.fetch #kv4 tokens 0 to 64 layers 0 to 2
        : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host,
                     codec <transform = hadamard, quant = int4, group = 64, lossless = zstd>>
    kvc.yield %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host,
                              codec <transform = hadamard, quant = int4, group = 64, lossless = zstd>>
  } : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host,
                 codec <transform = hadamard, quant = int4, group = 64, lossless = zstd>>
  %t1, %d = kvc.task on decode[0] after %t0 {
    %x = kvc.decompress %f
        : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host,
                     codec <transform = hadamard, quant = int4, group = 64, lossless = zstd>>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host,
                      codec <transform = hadamard, quant = int4, group = 64>>
    kvc.yield %x : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host,
                              codec <transform = hadamard, quant = int4, group = 64>>
  } : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host,
                 codec <transform = hadamard, quant = int4, group = 64>>
  %t2, %g = kvc.task on h2d[0] after %t1 {
    %y = kvc.transfer_to_device %d
        : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host,
                     codec <transform = hadamard, quant = int4, group = 64>>
        -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device,
                      codec <transform = hadamard, quant = int4, group = 64>>
    kvc.yield %y : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device,
                              codec <transform = hadamard, quant = int4, group = 64>>
  } : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device,
                 codec <transform = hadamard, quant = int4, group = 64>>
  %t3 = kvc.task on compute[0] after %t2, %t0 {
    kvc.kernel "dequant_untransform_scatter" (%g)
        : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device,
                      codec <transform = hadamard, quant = int4, group = 64>>) -> () {
    ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device,
                         codec <transform = hadamard, quant = int4, group = 64>>):
      %dq = kvc.dequant %in
          : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device,
                       codec <transform = hadamard, quant = int4, group = 64>>
          -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard>>
      %ut = kvc.untransform %dq
          : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard>>
          -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
      kvc.scatter %ut : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
    }
  }
  return
}

// CHECK-LABEL: func.func @kernel_with_results
// CHECK:         %{{.+}} = kvc.kernel "project"(%{{.+}}) : (!kvc.chunk<hidden x bf16, tokens 0 to 16, layers 0 to 1, device>) -> !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device> {
// CHECK:           kvc.yield %{{.+}} : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device>
func.func @kernel_with_results(%h: !kvc.chunk<hidden x bf16, tokens 0 to 16, layers 0 to 1, device>) {
  %kv = kvc.kernel "project" (%h)
      : (!kvc.chunk<hidden x bf16, tokens 0 to 16, layers 0 to 1, device>)
      -> !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device> {
  ^bb0(%in: !kvc.chunk<hidden x bf16, tokens 0 to 16, layers 0 to 1, device>):
    %p = kvc.project %in
        : !kvc.chunk<hidden x bf16, tokens 0 to 16, layers 0 to 1, device>
        -> !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device>
    kvc.yield %p : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device>
  }
  return
}

// Tests that a model's RMSNorm epsilon round-trips, and that the default
// (1e-5) is not printed.
// MODEL-DAG: #[[EPS5:.+]] = #kvc.model<name = "m", {{.+}}, dtype = bf16>
// MODEL-DAG: #[[EPS6:.+]] = #kvc.model<name = "m", {{.+}}, dtype = bf16, rms_norm_eps = 1.0e-06>
// MODEL:     func.func @models() attributes {eps5 = #[[EPS5]], eps6 = #[[EPS6]]}
func.func @models() attributes {
    eps6 = #kvc.model<name = "m", layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16, rms_norm_eps = 1.0e-6>,
    eps5 = #kvc.model<name = "m", layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 64, ffn = 512, vocab = 100, max_positions = 4096, rope_theta = 10000.0, dtype = bf16, rms_norm_eps = 1.0e-5>} {
  return
}

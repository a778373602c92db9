// RUN: kvc-opt %s --kvc-fuse | FileCheck %s

// Tests that a chain of elementwise device steps, each feeding only the next,
// becomes one kernel named after its steps, and that host and copy steps
// stay outside.
// CHECK-LABEL: func.func @dequant_chain
// CHECK-SAME:    (%[[IN:.+]]: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host, codec <transform = hadamard, quant = int4, lossless = zstd>>)
// CHECK:         %[[D:.+]] = kvc.decompress %[[IN]]
// CHECK-NEXT:    %[[G:.+]] = kvc.transfer_to_device %[[D]]
// CHECK-NEXT:    kvc.kernel "dequant_untransform_scatter"(%[[G]]) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard, quant = int4>>) -> () {
// CHECK-NEXT:    ^bb0(%[[ARG:.+]]: !kvc.chunk<{{.*}}>):
// CHECK-NEXT:      %[[Q:.+]] = kvc.dequant %[[ARG]]
// CHECK-NEXT:      %[[U:.+]] = kvc.untransform %[[Q]]
// CHECK-NEXT:      kvc.scatter %[[U]]
// CHECK-NEXT:    }
// CHECK-NEXT:    return
func.func @dequant_chain(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host, codec <transform = hadamard, quant = int4, lossless = zstd>>) {
  %d = kvc.decompress %c
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host, codec <transform = hadamard, quant = int4, lossless = zstd>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host, codec <transform = hadamard, quant = int4>>
  %g = kvc.transfer_to_device %d
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host, codec <transform = hadamard, quant = int4>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard, quant = int4>>
  %q = kvc.dequant %g
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard, quant = int4>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard>>
  %u = kvc.untransform %q
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  kvc.scatter %u : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  return
}

// Tests that a value the chain produces for a step outside it becomes the
// kernel's result, and that the chain ends there.
// CHECK-LABEL: func.func @escaping
// CHECK:         %[[KV:.+]] = kvc.kernel "dequant_untransform"(%{{.+}}) : (!kvc.chunk<{{.*}}>) -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device> {
// CHECK:           kvc.yield %{{.+}} : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
// CHECK:         kvc.scatter %[[KV]]
// CHECK:         kvc.transfer_to_host %[[KV]]
func.func @escaping(%g: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard, quant = int8>>) {
  %q = kvc.dequant %g
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard, quant = int8>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard>>
  %u = kvc.untransform %q
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  kvc.scatter %u : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  %h = kvc.transfer_to_host %u
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host>
  kvc.store %h to "ssd" : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host>
  return
}

// Tests that a chunk compute running after a loaded chunk does not end the
// chain: the chain goes on into the scatter, the kernel yields the chunk,
// and the compute runs after the whole kernel.
// CHECK-LABEL: func.func @compute_after
// CHECK:         %[[KV:.+]] = kvc.kernel "dequant_untransform_scatter"(%{{.+}}) : (!kvc.chunk<{{.*}}>) -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device> {
// CHECK:           %[[U:.+]] = kvc.untransform
// CHECK-NEXT:      kvc.scatter %[[U]]
// CHECK-NEXT:      kvc.yield %[[U]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[C:.+]] = kvc.chunk_compute tokens 64 to 128 layers 0 to 2 after(%[[KV]] :
// CHECK-NEXT:    kvc.scatter %[[C]]
func.func @compute_after(%g: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard, quant = int8>>) {
  %q = kvc.dequant %g
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard, quant = int8>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard>>
  %u = kvc.untransform %q
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  kvc.scatter %u : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  %c = kvc.chunk_compute tokens 64 to 128 layers 0 to 2
      after(%u : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>)
      : !kvc.chunk<kv x bf16, tokens 64 to 128, layers 0 to 2, device>
  kvc.scatter %c : !kvc.chunk<kv x bf16, tokens 64 to 128, layers 0 to 2, device>
  return
}

// Tests that projecting hidden states and scattering them fuse, and that a
// lone scatter of a computed chunk is left alone.
// CHECK-LABEL: func.func @project
// CHECK:         kvc.kernel "project_scatter"
// CHECK:         %[[C:.+]] = kvc.chunk_compute
// CHECK-NEXT:    kvc.scatter %[[C]]
func.func @project(%h: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>) {
  %p = kvc.project %h
      : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  kvc.scatter %p : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  %c = kvc.chunk_compute tokens 0 to 64 layers 1 to 4 from %h
      : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 1 to 4, device>
  kvc.scatter %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 1 to 4, device>
  return
}

// Tests that the save side's chain starts at the gather, which has no input:
// the kernel takes none and yields the encoded chunk to the copy to the host.
// CHECK-LABEL: func.func @save_chain
// CHECK:         %[[Q:.+]] = kvc.kernel "gather_transform_quant"() : () -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard, quant = int4>> {
// CHECK-NEXT:      %[[G:.+]] = kvc.gather
// CHECK-NEXT:      %[[T:.+]] = kvc.transform %[[G]]
// CHECK-NEXT:      %[[R:.+]] = kvc.quant %[[T]]
// CHECK-NEXT:      kvc.yield %[[R]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[H:.+]] = kvc.transfer_to_host %[[Q]]
// CHECK-NEXT:    kvc.compress %[[H]]
func.func @save_chain() {
  %g = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  %t = kvc.transform %g
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard>>
  %q = kvc.quant %t
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard, quant = int4>>
  %h = kvc.transfer_to_host %q
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device, codec <transform = hadamard, quant = int4>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host, codec <transform = hadamard, quant = int4>>
  %z = kvc.compress %h
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host, codec <transform = hadamard, quant = int4>>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host, codec <transform = hadamard, quant = int4, lossless = zstd>>
  kvc.store %z to "ssd" : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host, codec <transform = hadamard, quant = int4, lossless = zstd>>
  return
}

// Tests that a raw chunk's lone scatter after its copy to the device, and a
// raw save's lone gather before its copy to the host, are kernels of their
// own.
// CHECK-LABEL: func.func @raw_copies
// CHECK:         %[[D:.+]] = kvc.transfer_to_device
// CHECK-NEXT:    kvc.kernel "scatter"(%[[D]]) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>) -> () {
// CHECK-NEXT:    ^bb0(%[[ARG:.+]]: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>):
// CHECK-NEXT:      kvc.scatter %[[ARG]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[G:.+]] = kvc.kernel "gather"() : () -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device> {
// CHECK-NEXT:      %[[R:.+]] = kvc.gather
// CHECK-NEXT:      kvc.yield %[[R]]
// CHECK-NEXT:    }
// CHECK-NEXT:    kvc.transfer_to_host %[[G]]
func.func @raw_copies(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host>) {
  %d = kvc.transfer_to_device %c
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  kvc.scatter %d : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  %g = kvc.gather : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  %h = kvc.transfer_to_host %g
      : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host>
  kvc.store %h to "ssd" : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, host>
  return
}

// Tests that steps on hidden states stay steps, the runtime's host decode
// and encode doing them, except their projection: a quantized hidden chunk's
// dequant is left out of the projection's kernel, and a save's gather and
// quantization of hidden states fuse neither together nor alone.
// CHECK-LABEL: func.func @hidden_steps
// CHECK:         %[[D:.+]] = kvc.transfer_to_device
// CHECK-NEXT:    %[[H:.+]] = kvc.dequant %[[D]]
// CHECK-NEXT:    kvc.kernel "project_scatter"(%[[H]])
// CHECK:         %[[G:.+]] = kvc.gather : !kvc.chunk<hidden
// CHECK-NEXT:    %[[Q:.+]] = kvc.quant %[[G]]
// CHECK-NEXT:    kvc.transfer_to_host %[[Q]]
// CHECK-NOT:     kvc.kernel
func.func @hidden_steps(%c: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, host, codec <quant = int8>>) {
  %d = kvc.transfer_to_device %c
      : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, host, codec <quant = int8>>
      -> !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device, codec <quant = int8>>
  %h = kvc.dequant %d
      : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device, codec <quant = int8>>
      -> !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>
  %p = kvc.project %h
      : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>
      -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  kvc.scatter %p : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 2, device>
  %g = kvc.gather : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>
  %q = kvc.quant %g
      : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device>
      -> !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device, codec <quant = int8>>
  %t = kvc.transfer_to_host %q
      : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, device, codec <quant = int8>>
      -> !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, host, codec <quant = int8>>
  kvc.store %t to "ssd" : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 2, host, codec <quant = int8>>
  return
}

//===- KVCInterfaces.td - Interfaces of the kvc dialect ----*- tablegen -*-===//

#ifndef KVC_DIALECT_KVC_IR_KVCINTERFACES_TD
#define KVC_DIALECT_KVC_IR_KVCINTERFACES_TD

include "mlir/IR/OpBase.td"

def KVC_DataflowOpInterface : OpInterface<"DataflowOpInterface"> {
  let cppNamespace = "::kvc::compiler";
  let description = [{
    A per-chunk step of a plan. It names the resources that can run it, so
    that `kvc.task` can reject a step placed on the wrong resource and the
    scheduler knows its choices.
  }];
  let methods = [
    InterfaceMethod<"Returns true when `resource` can run this step.",
      "bool", "canRunOn", (ins "::kvc::compiler::Resource":$resource)>,
    InterfaceMethod<[{
        Returns true when the step is elementwise over its chunk and may be
        fused with neighbours into one `kvc.kernel`.
      }],
      "bool", "isFusible">,
  ];
}

#endif // KVC_DIALECT_KVC_IR_KVCINTERFACES_TD

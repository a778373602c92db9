//===- Pipeline.cpp - Where each step of a chunk's journey runs -----------===//

#include "kvc/Planning/Pipeline.h"

namespace kvc::planning {

Resource stepResource(StepKind kind, bool inputOnHost) {
  switch (kind) {
  case StepKind::Fetch:
  case StepKind::Store:
    return Resource::IO;
  case StepKind::TransferToDevice:
    return Resource::H2D;
  case StepKind::TransferToHost:
    return Resource::D2H;
  case StepKind::Send:
  case StepKind::Recv:
    return Resource::Net;
  case StepKind::Decompress:
  case StepKind::Compress:
  case StepKind::Dequant:
  case StepKind::Quant:
  case StepKind::Untransform:
  case StepKind::Transform:
    return inputOnHost ? Resource::Decode : Resource::Compute;
  case StepKind::Project:
  case StepKind::ChunkCompute:
  case StepKind::Scatter:
  case StepKind::Gather:
    return Resource::Compute;
  }
  return Resource::Compute;
}

int stepPriority(StepKind kind) {
  switch (kind) {
  case StepKind::Fetch:
    return 1;
  case StepKind::Decompress:
    return 2;
  case StepKind::TransferToDevice:
    return 3;
  case StepKind::Dequant:
  case StepKind::Untransform:
  case StepKind::Project:
  case StepKind::Scatter:
    return 4;
  default:
    return 0;
  }
}

} // namespace kvc::planning

//===- Pipeline.h - Where each step of a chunk's journey runs ---*- C++ -*-===//
//
// A loaded chunk is fetched on its tier's IO lanes, decoded on the host's
// decode lanes, copied to the device, and finished there (dequantization,
// the inverse transform, projection, scatter); a computed chunk is one
// prefill on the compute device. Which resource a step runs on and which
// ready step a resource prefers are defined here once, for the planner's
// simulator (Planner::buildJobs), kvc-schedule's task placement and
// kvc-estimate's step costs (lib/Transforms), and through the bundle's
// resources for the executor.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_PLANNING_PIPELINE_H
#define KVC_PLANNING_PIPELINE_H

#include "kvc/Support/Vocabulary.h"

namespace kvc::planning {

/// The resource `kind` runs on. Codec stages (decompress, dequant,
/// untransform and their inverses) run on the host's decode lanes when
/// their input is in host memory and on the compute device otherwise.
Resource stepResource(StepKind kind, bool inputOnHost);

/// Which ready step a resource runs first (higher first): the later a
/// load's stage, the higher (fetch 1, decompress 2, the copy 3, device
/// steps 4), so that chunks in flight drain before new ones enter and their
/// staging buffers come back; prefill and the save and transfer sides 0.
int stepPriority(StepKind kind);

} // namespace kvc::planning

#endif // KVC_PLANNING_PIPELINE_H

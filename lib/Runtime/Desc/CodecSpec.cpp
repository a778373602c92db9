//===- CodecSpec.cpp - One point of the codec strategy space --------------===//

#include "kvc/Runtime/Desc/CodecSpec.h"

#include <algorithm>

namespace kvc {

int CodecSpec::bitsOfLayer(int64_t layer, int64_t layers) const {
  if (quant == Quant::None || layerBits.empty() || layers <= 0)
    return bits();
  size_t group = size_t(layer * int64_t(layerBits.size()) / layers);
  return layerBits[std::min(group, layerBits.size() - 1)];
}

int CodecSpec::bits() const {
  if (quant != Quant::None && !layerBits.empty()) {
    int sum = 0;
    for (int b : layerBits)
      sum += b;
    return sum / int(layerBits.size());
  }
  switch (quant) {
  case Quant::None:
    return 16;
  case Quant::Int8:
    return 8;
  case Quant::Int4:
    return 4;
  case Quant::Int2:
    return 2;
  }
  return 16;
}

std::string CodecSpec::str() const {
  if (isRaw())
    return "raw";
  std::string text;
  auto append = [&](const std::string &part) {
    text += text.empty() ? part : "+" + part;
  };
  if (transform != Transform::None)
    append(transformName(transform));
  if (quant != Quant::None) {
    std::string q = std::string(quantName(quant)) + "/g" + std::to_string(group);
    if (!layerBits.empty()) {
      q += "/bins";
      for (size_t i = 0; i < layerBits.size(); ++i)
        q += (i ? "-" : "") + std::to_string(layerBits[i]);
    }
    append(q);
  }
  if (lossless != Lossless::None)
    append(losslessName(lossless));
  return text;
}

bool CodecSpec::operator==(const CodecSpec &o) const {
  return transform == o.transform && quant == o.quant &&
         keyAxis == o.keyAxis && valueAxis == o.valueAxis &&
         group == o.group && lossless == o.lossless &&
         layerBits == o.layerBits;
}

const char *transformName(CodecSpec::Transform transform) {
  return transform == CodecSpec::Transform::Hadamard ? "hadamard" : "none";
}

const char *quantName(CodecSpec::Quant quant) {
  switch (quant) {
  case CodecSpec::Quant::None:
    return "none";
  case CodecSpec::Quant::Int8:
    return "int8";
  case CodecSpec::Quant::Int4:
    return "int4";
  case CodecSpec::Quant::Int2:
    return "int2";
  }
  return "none";
}

const char *axisName(CodecSpec::Axis axis) {
  return axis == CodecSpec::Axis::Token ? "token" : "channel";
}

const char *losslessName(CodecSpec::Lossless lossless) {
  switch (lossless) {
  case CodecSpec::Lossless::None:
    return "none";
  case CodecSpec::Lossless::Deflate:
    return "deflate";
  case CodecSpec::Lossless::Zstd:
    return "zstd";
  case CodecSpec::Lossless::Lz4:
    return "lz4";
  }
  return "none";
}

} // namespace kvc

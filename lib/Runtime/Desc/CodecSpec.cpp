//===- CodecSpec.cpp - One point of the codec strategy space --------------===//

#include "kvc/Runtime/Desc/CodecSpec.h"

#include <algorithm>
#include <cstdlib>

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
    // KIVI's axes (keys per channel, values per token) go unsaid.
    if (keyAxis != Axis::Channel)
      q += "/k=token";
    if (valueAxis != Axis::Token)
      q += "/v=channel";
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

StatusOr<CodecSpec> parseCodecSpec(const std::string &text) {
  using Transform = CodecSpec::Transform;
  using Quant = CodecSpec::Quant;
  using Axis = CodecSpec::Axis;
  using Lossless = CodecSpec::Lossless;
  CodecSpec codec;
  if (text == "raw" || text.empty())
    return codec;
  auto bad = [&](const std::string &why) {
    return invalidArgument("codec \"" + text + "\": " + why +
                           " (codec strings: docs/data-plane.md)");
  };
  // Each kind of stage at most once.
  bool transformSeen = false, quantSeen = false, losslessSeen = false;
  auto once = [&](bool &seen, const char *kind) {
    bool twice = seen;
    seen = true;
    return twice ? bad(std::string("two ") + kind + " stages") : Status::ok();
  };
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find('+', at);
    std::string part = text.substr(at, end - at);
    if (part == "hadamard")
      KVC_RETURN_IF_ERROR(once(transformSeen, "transform"));
    else if (part == "deflate" || part == "zstd" || part == "lz4")
      KVC_RETURN_IF_ERROR(once(losslessSeen, "lossless"));
    else if (part.rfind("int", 0) == 0)
      KVC_RETURN_IF_ERROR(once(quantSeen, "quantization"));
    if (part == "hadamard") {
      codec.transform = Transform::Hadamard;
    } else if (part == "deflate") {
      codec.lossless = Lossless::Deflate;
    } else if (part == "zstd") {
      codec.lossless = Lossless::Zstd;
    } else if (part == "lz4") {
      codec.lossless = Lossless::Lz4;
    } else if (part.rfind("int", 0) == 0) {
      size_t slash = part.find('/');
      std::string width = part.substr(0, slash);
      if (width == "int8")
        codec.quant = Quant::Int8;
      else if (width == "int4")
        codec.quant = Quant::Int4;
      else if (width == "int2")
        codec.quant = Quant::Int2;
      else
        return bad("unknown quantization " + width);
      while (slash != std::string::npos) {
        size_t next = part.find('/', slash + 1);
        std::string option = part.substr(slash + 1, next - slash - 1);
        if (option.size() > 1 && option[0] == 'g') {
          codec.group = std::atoll(option.c_str() + 1);
          if (codec.group <= 0)
            return bad("bad group " + option);
        } else if (option.rfind("bins", 0) == 0) {
          std::string bins = option.substr(4);
          size_t b = 0;
          while (b < bins.size()) {
            size_t dash = bins.find('-', b);
            int bitsValue = std::atoi(bins.substr(b, dash - b).c_str());
            if (bitsValue != 2 && bitsValue != 4 && bitsValue != 8)
              return bad("bins must be 2, 4 or 8 bits");
            codec.layerBits.push_back(bitsValue);
            if (dash == std::string::npos)
              break;
            b = dash + 1;
          }
        } else if (option == "k=token" || option == "k=channel") {
          codec.keyAxis = option[2] == 't' ? Axis::Token : Axis::Channel;
        } else if (option == "v=token" || option == "v=channel") {
          codec.valueAxis = option[2] == 't' ? Axis::Token : Axis::Channel;
        } else {
          return bad("unknown option " + option);
        }
        slash = next;
      }
    } else {
      return bad("unknown stage \"" + part + "\"");
    }
    if (end == std::string::npos)
      break;
    at = end + 1;
  }
  return codec;
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

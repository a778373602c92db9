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

const CodecStageInfo *CodecSpec::transformStage() const {
  return findCodecStage(StageKind::Transform, int(transform));
}
const CodecStageInfo *CodecSpec::quantStage() const {
  return findCodecStage(StageKind::Quant, int(quant));
}
const CodecStageInfo *CodecSpec::losslessStage() const {
  return findCodecStage(StageKind::Lossless, int(lossless));
}

int CodecSpec::bits() const {
  if (quant != Quant::None && !layerBits.empty()) {
    int sum = 0;
    for (int b : layerBits)
      sum += b;
    return sum / int(layerBits.size());
  }
  const CodecStageInfo *stage = quantStage();
  return stage ? stage->bits : 16;
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
    // A stage is a registry row's name; a quantization's options follow
    // it after slashes.
    const size_t slash = part.find('/');
    const std::string_view word = std::string_view(part).substr(0, slash);
    if (const CodecStageInfo *stage =
            findCodecStage(StageKind::Transform, word);
        stage && slash == std::string::npos) {
      KVC_RETURN_IF_ERROR(once(transformSeen, "transform"));
      codec.transform = Transform(stage->enumerator);
    } else if (const CodecStageInfo *stage =
                   findCodecStage(StageKind::Lossless, word);
               stage && slash == std::string::npos) {
      KVC_RETURN_IF_ERROR(once(losslessSeen, "lossless"));
      codec.lossless = Lossless(stage->enumerator);
    } else if (const CodecStageInfo *stage =
                   findCodecStage(StageKind::Quant, word)) {
      KVC_RETURN_IF_ERROR(once(quantSeen, "quantization"));
      codec.quant = Quant(stage->enumerator);
      for (size_t from = slash; from != std::string::npos;) {
        size_t next = part.find('/', from + 1);
        std::string option = part.substr(from + 1, next - from - 1);
        if (option.size() > 1 && option[0] == 'g') {
          codec.group = std::atoll(option.c_str() + 1);
          if (codec.group <= 0)
            return bad("bad group " + option);
        } else if (option.rfind("bins", 0) == 0) {
          if (stage->codes != CodeKind::Levels)
            return bad(std::string(stage->name) +
                       " has no layer bins (they are integer widths)");
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
        from = next;
      }
    } else if (part.rfind("int", 0) == 0) {
      return bad("unknown quantization " + std::string(word));
    } else {
      return bad("unknown stage \"" + part + "\"");
    }
    if (end == std::string::npos)
      break;
    at = end + 1;
  }
  return codec;
}

namespace {

/// The registry's name of enumerator `value` of `kind`; "none" for 0.
const char *stageName(StageKind kind, int value) {
  const CodecStageInfo *stage = findCodecStage(kind, value);
  return stage ? stage->name.data() : "none";
}

/// The enumerator `name` names: "none", or a registry row of `kind`.
template <typename E>
std::optional<E> stageEnum(StageKind kind, std::string_view name) {
  if (name == "none")
    return E(0);
  const CodecStageInfo *stage = findCodecStage(kind, name);
  if (!stage)
    return std::nullopt;
  return E(stage->enumerator);
}

} // namespace

const char *transformName(CodecSpec::Transform transform) {
  return stageName(StageKind::Transform, int(transform));
}

const char *quantName(CodecSpec::Quant quant) {
  return stageName(StageKind::Quant, int(quant));
}

const char *axisName(CodecSpec::Axis axis) {
  return axis == CodecSpec::Axis::Token ? "token" : "channel";
}

const char *losslessName(CodecSpec::Lossless lossless) {
  return stageName(StageKind::Lossless, int(lossless));
}

std::optional<CodecSpec::Transform> parseTransform(std::string_view name) {
  return stageEnum<CodecSpec::Transform>(StageKind::Transform, name);
}
std::optional<CodecSpec::Quant> parseQuant(std::string_view name) {
  return stageEnum<CodecSpec::Quant>(StageKind::Quant, name);
}
std::optional<CodecSpec::Lossless> parseLossless(std::string_view name) {
  return stageEnum<CodecSpec::Lossless>(StageKind::Lossless, name);
}

} // namespace kvc

//===- CodecProfile.cpp - What each codec costs and loses -----------------===//

#include "kvc/Planning/CodecProfile.h"

#include "kvc/Support/EnumNames.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

namespace kvc::planning {

namespace {

using Json = nlohmann::json;

/// Output bytes per input byte of `codec`'s lossless coder, on its
/// elements (the registry's column for their width).
double losslessFactor(const CodecSpec &codec) {
  const CodecStageInfo *coder = codec.losslessStage();
  return coder ? coder->ratioOn[ratioColumn(codec.bits())] : 1.0;
}

/// Relative L2 error of `codec`'s quantization: the registry's estimate for
/// groups of 32, grown for wider groups where a range split into levels
/// widens with ln(group) (the range of near-Gaussian values). A Hadamard
/// rotation helps only where channels have outliers, so the estimate
/// assumes no gain; a measured profile shows it.
double quantError(const CodecSpec &codec) {
  const CodecStageInfo *quant = codec.quantStage();
  if (!quant)
    return 0;
  if (!quant->errorGrowsWithGroup)
    return quant->error32;
  double group = double(std::max<int64_t>(codec.group, 2));
  return quant->error32 * std::pow(std::log(group) / std::log(32.0), 0.75);
}

/// Whether `parse` knows `name`, the enumerator then in `out`.
template <typename E>
bool lookupStage(std::optional<E> (*parse)(std::string_view),
                 const std::string &name, E &out) {
  std::optional<E> value = parse(name);
  if (value)
    out = *value;
  return value.has_value();
}

} // namespace

CodecProfileEntry estimateCodec(const CodecSpec &codec) {
  CodecProfileEntry entry;
  entry.codec = codec;
  double quantized = codec.quant == CodecSpec::Quant::None
                         ? 1.0
                         : codec.bits() / 16.0 + 2.0 / codec.group;
  entry.ratio = quantized * losslessFactor(codec);
  entry.quality = quantError(codec);
  return entry;
}

CodecProfile CodecProfile::defaults() {
  // Every composition of the registry's stages, but rotations without
  // quantization (a rotation only helps quantization) and groups of
  // unquantized data (which has none).
  std::vector<CodecSpec::Transform> transforms = {CodecSpec::Transform::None};
  std::vector<CodecSpec::Quant> quants = {CodecSpec::Quant::None};
  std::vector<CodecSpec::Lossless> coders = {CodecSpec::Lossless::None};
  for (const CodecStageInfo &stage : codecStages()) {
    if (stage.kind == StageKind::Transform)
      transforms.push_back(CodecSpec::Transform(stage.enumerator));
    else if (stage.kind == StageKind::Quant)
      quants.push_back(CodecSpec::Quant(stage.enumerator));
    else
      coders.push_back(CodecSpec::Lossless(stage.enumerator));
  }
  std::vector<CodecProfileEntry> entries;
  for (CodecSpec::Transform transform : transforms)
    for (CodecSpec::Quant quant : quants)
      for (int64_t group : {32, 64, 128})
        for (CodecSpec::Lossless lossless : coders) {
          if (quant == CodecSpec::Quant::None &&
              (transform != CodecSpec::Transform::None || group != 32))
            continue;
          CodecSpec codec;
          codec.transform = transform;
          codec.quant = quant;
          codec.group = group;
          codec.lossless = lossless;
          if (!codec.isRaw())
            entries.push_back(estimateCodec(codec));
        }
  return CodecProfile(std::move(entries));
}

const CodecProfileEntry *CodecProfile::find(const CodecSpec &codec) const {
  for (const CodecProfileEntry &entry : entries_)
    if (entry.codec == codec)
      return &entry;
  return nullptr;
}

double CodecProfile::ratio(const CodecSpec &codec) const {
  if (codec.isRaw())
    return 1.0;
  const CodecProfileEntry *entry = find(codec);
  return entry ? entry->ratio : estimateCodec(codec).ratio;
}

double CodecProfile::quality(const CodecSpec &codec) const {
  if (codec.isRaw())
    return 0.0;
  const CodecProfileEntry *entry = find(codec);
  return entry ? entry->quality : estimateCodec(codec).quality;
}

double CodecProfile::restoreErrorBound(
    const std::vector<CodecSpec> &codecs) const {
  double worst = 0;
  for (const CodecSpec &codec : codecs)
    worst = std::max(worst, quality(codec));
  return worst + 1.0 / 256; // bf16 rounds to within 2^-8 of each value.
}

double CodecProfile::kl(const CodecSpec &codec) const {
  if (codec.quant == CodecSpec::Quant::None)
    return 0.0;
  const CodecProfileEntry *entry = find(codec);
  return entry && entry->kl ? *entry->kl
                            : std::numeric_limits<double>::infinity();
}

bool CodecProfile::allows(const CodecSpec &codec, double maxError,
                          double maxKl) const {
  return quality(codec) <= maxError &&
         (std::isinf(maxKl) || kl(codec) <= maxKl);
}

StatusOr<CodecProfile> CodecProfile::parse(std::string_view text) {
  Json doc;
  try {
    doc = Json::parse(text.begin(), text.end());
  } catch (const Json::exception &e) {
    return invalidArgument(std::string("invalid JSON: ") + e.what());
  }
  if (!doc.is_object() || doc.value("schema", "") != kCodecProfileSchema)
    return invalidArgument(std::string("schema: expected \"") +
                           kCodecProfileSchema + "\"");
  if (!doc.contains("entries") || !doc["entries"].is_array())
    return invalidArgument("entries: missing required array");
  std::vector<CodecProfileEntry> entries;
  for (size_t i = 0; i < doc["entries"].size(); ++i) {
    const Json &e = doc["entries"][i];
    std::string path = "entries[" + std::to_string(i) + "]";
    CodecProfileEntry entry;
    try {
      auto axis = [](std::string_view name) {
        return enumFromName(axisName, 2, name);
      };
      bool ok =
          lookupStage(parseTransform, e.value("transform", "none"),
                      entry.codec.transform) &&
          lookupStage(parseQuant, e.value("quant", "none"),
                      entry.codec.quant) &&
          lookupStage(+axis, e.value("key_axis", "channel"),
                      entry.codec.keyAxis) &&
          lookupStage(+axis, e.value("value_axis", "token"),
                      entry.codec.valueAxis) &&
          lookupStage(parseLossless, e.value("lossless", "none"),
                      entry.codec.lossless);
      if (!ok)
        return invalidArgument(path + ": unknown codec stage name");
      entry.codec.group = e.value("group", int64_t(32));
      entry.ratio = e.at("ratio").get<double>();
      entry.quality = e.at("quality").get<double>();
      entry.encodeGBs = e.value("encode_gbs", 0.0);
      entry.decodeGBs = e.value("decode_gbs", 0.0);
      if (e.contains("kl"))
        entry.kl = e.at("kl").get<double>();
      if (e.contains("agreement"))
        entry.agreement = e.at("agreement").get<double>();
      if (e.contains("codec_encode_gbs"))
        entry.codecEncodeGBs = e.at("codec_encode_gbs").get<double>();
      if (e.contains("codec_decode_gbs"))
        entry.codecDecodeGBs = e.at("codec_decode_gbs").get<double>();
    } catch (const Json::exception &ex) {
      return invalidArgument(path + ": " + ex.what());
    }
    if (!(entry.ratio > 0) || entry.quality < 0 || entry.encodeGBs < 0 ||
        entry.decodeGBs < 0 || (entry.kl && !(*entry.kl >= 0)))
      return invalidArgument(path + ": ratio must be positive and quality, "
                                    "kl and rates non-negative");
    if (entry.agreement && !(*entry.agreement >= 0 && *entry.agreement <= 1))
      return invalidArgument(path + ": agreement must be within [0, 1]");
    entries.push_back(entry);
  }
  return CodecProfile(std::move(entries));
}

StatusOr<CodecProfile> CodecProfile::load(const std::string &path) {
  std::ifstream in(path);
  if (!in)
    return notFound(path + ": cannot open file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  StatusOr<CodecProfile> profile = parse(buffer.str());
  if (!profile.isOk())
    return profile.status().withContext(path);
  return profile;
}

std::string CodecProfile::print() const {
  Json entries = Json::array();
  for (const CodecProfileEntry &e : entries_) {
    Json j = {{"transform", transformName(e.codec.transform)},
              {"quant", quantName(e.codec.quant)},
              {"key_axis", axisName(e.codec.keyAxis)},
              {"value_axis", axisName(e.codec.valueAxis)},
              {"group", e.codec.group},
              {"lossless", losslessName(e.codec.lossless)},
              {"ratio", e.ratio},
              {"quality", e.quality}};
    if (e.encodeGBs > 0)
      j["encode_gbs"] = e.encodeGBs;
    if (e.decodeGBs > 0)
      j["decode_gbs"] = e.decodeGBs;
    if (e.kl)
      j["kl"] = *e.kl;
    if (e.agreement)
      j["agreement"] = *e.agreement;
    if (e.codecEncodeGBs)
      j["codec_encode_gbs"] = *e.codecEncodeGBs;
    if (e.codecDecodeGBs)
      j["codec_decode_gbs"] = *e.codecDecodeGBs;
    entries.push_back(std::move(j));
  }
  return Json{{"schema", kCodecProfileSchema}, {"entries", entries}}.dump(2) +
         "\n";
}

} // namespace kvc::planning

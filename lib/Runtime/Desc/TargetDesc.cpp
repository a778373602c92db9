//===- TargetDesc.cpp - Hardware descriptions -----------------------------===//

#include "kvc/Runtime/Desc/TargetDesc.h"

#include "Json.h"

#include "kvc/Support/Format.h"
#include "kvc/Support/KernelChips.h"

#include <functional>
#include <iterator>
#include <set>

namespace kvc {

using namespace json_detail;

namespace {

/// The names of the schema's string enums, indexed by enumerator.
constexpr const char *kComputeKinds[] = {"gpu", "cpu"};
constexpr const char *kTierKinds[] = {"dram", "disk", "remote"};

/// Reads a required object-valued field.
StatusOr<const Json *> readObject(const Json &obj, const std::string &path,
                                  const char *key) {
  auto it = obj.find(key);
  if (it == obj.end())
    return invalidArgument(fieldPath(path, key) + ": missing required field");
  KVC_RETURN_IF_ERROR(expectObject(*it, fieldPath(path, key)));
  return &*it;
}

/// Reads a required array-valued field of objects, calling `parse` on each.
template <typename T, typename Fn>
Status readArray(const Json &obj, const char *key, std::vector<T> &out,
                 Fn parse) {
  auto it = obj.find(key);
  if (it == obj.end())
    return invalidArgument(std::string(key) + ": missing required field");
  if (!it->is_array())
    return invalidArgument(std::string(key) + ": expected an array");
  for (std::size_t i = 0; i < it->size(); ++i) {
    std::string path = std::string(key) + "[" + std::to_string(i) + "]";
    KVC_RETURN_IF_ERROR(expectObject((*it)[i], path));
    T item;
    KVC_RETURN_IF_ERROR(parse((*it)[i], path, item));
    out.push_back(std::move(item));
  }
  return Status::ok();
}

Status parseCompute(const Json &obj, const std::string &path, ComputeDesc &c) {
  KVC_RETURN_IF_ERROR(
      readName<ComputeDesc::Kind>(obj, path, "kind", computeKindName,
                                  int(std::size(kComputeKinds)), c.kind));
  KVC_RETURN_IF_ERROR(readString(obj, path, "name", c.name, Presence::Required));
  KVC_RETURN_IF_ERROR(
      readNumber(obj, path, "dense_tflops", c.denseTflops, Presence::Required));
  KVC_RETURN_IF_ERROR(
      readNumber(obj, path, "mem_gbs", c.memGBs, Presence::Required));
  KVC_RETURN_IF_ERROR(
      readNumber(obj, path, "mem_gib", c.memGiB, Presence::Required));
  KVC_RETURN_IF_ERROR(readNumber(obj, path, "gemm_peak_fraction",
                                 c.gemmPeakFraction, Presence::Optional));
  KVC_RETURN_IF_ERROR(readNumber(obj, path, "gemm_half_tokens",
                                 c.gemmHalfTokens, Presence::Optional));
  KVC_RETURN_IF_ERROR(readNumber(obj, path, "attention_tflops",
                                 c.attentionTflops, Presence::Optional));
  KVC_RETURN_IF_ERROR(readString(obj, path, "chip", c.chip, Presence::Optional));
  return readNumber(obj, path, "restore_share", c.restoreShare,
                    Presence::Optional);
}

Status parseHost(const Json &obj, const std::string &path, HostDesc &h) {
  KVC_RETURN_IF_ERROR(readInt(obj, path, "cores", h.cores, Presence::Required));
  KVC_RETURN_IF_ERROR(
      readNumber(obj, path, "dram_gib", h.dramGiB, Presence::Required));
  KVC_RETURN_IF_ERROR(
      readNumber(obj, path, "nic_gbs", h.nicGBs, Presence::Optional));
  KVC_RETURN_IF_ERROR(
      readNumber(obj, path, "handoff_us", h.handoffUs, Presence::Optional));
  KVC_RETURN_IF_ERROR(
      readNumber(obj, path, "check_gbs", h.checkGBs, Presence::Optional));
  return readNumber(obj, path, "read_check_gbs", h.readCheckGBs,
                    Presence::Optional);
}

Status parseLink(const Json &obj, const std::string &path, LinkDesc &l) {
  KVC_RETURN_IF_ERROR(
      readNumber(obj, path, "h2d_gbs", l.h2dGBs, Presence::Required));
  KVC_RETURN_IF_ERROR(
      readNumber(obj, path, "d2h_gbs", l.d2hGBs, Presence::Required));
  return readNumber(obj, path, "latency_us", l.latencyUs, Presence::Required);
}

Status parseTier(const Json &obj, const std::string &path, TierDesc &t) {
  KVC_RETURN_IF_ERROR(readString(obj, path, "name", t.name, Presence::Required));
  KVC_RETURN_IF_ERROR(readName<TierDesc::Kind>(
      obj, path, "kind", tierKindName, int(std::size(kTierKinds)), t.kind));
  KVC_RETURN_IF_ERROR(
      readNumber(obj, path, "read_gbs", t.readGBs, Presence::Required));
  KVC_RETURN_IF_ERROR(
      readNumber(obj, path, "write_gbs", t.writeGBs, Presence::Required));
  KVC_RETURN_IF_ERROR(
      readNumber(obj, path, "latency_us", t.latencyUs, Presence::Required));
  KVC_RETURN_IF_ERROR(
      readNumber(obj, path, "throttle_gbs", t.throttleGBs, Presence::Optional));
  return readInt(obj, path, "lanes", t.lanes, Presence::Optional);
}

Status parseCodecRate(const Json &obj, const std::string &path,
                      CodecRateDesc &c) {
  KVC_RETURN_IF_ERROR(
      readName<CodecStage>(obj, path, "stage", name, kNumCodecStages, c.stage));
  if (obj.contains("on")) {
    CodecSpec::Quant on;
    KVC_RETURN_IF_ERROR(readName<CodecSpec::Quant>(
        obj, path, "on", codecDataName, 1 + countStages(StageKind::Quant),
        on));
    c.on = on;
  }
  KVC_RETURN_IF_ERROR(
      readNumber(obj, path, "encode_gbs", c.encodeGBs, Presence::Required));
  return readNumber(obj, path, "decode_gbs", c.decodeGBs, Presence::Required);
}

} // namespace

const char *computeKindName(ComputeDesc::Kind kind) {
  return kComputeKinds[int(kind)];
}
const char *tierKindName(TierDesc::Kind kind) { return kTierKinds[int(kind)]; }
const char *codecDataName(CodecSpec::Quant quant) {
  return quant == CodecSpec::Quant::None ? "raw" : quantName(quant);
}

Status TargetDesc::validate() const {
  if (name.empty())
    return invalidArgument("name: must not be empty");
  KVC_RETURN_IF_ERROR(checkPositive(compute.denseTflops, "compute.dense_tflops"));
  KVC_RETURN_IF_ERROR(checkPositive(compute.memGBs, "compute.mem_gbs"));
  KVC_RETURN_IF_ERROR(checkPositive(compute.memGiB, "compute.mem_gib"));
  if (!(compute.restoreShare > 0 && compute.restoreShare <= 1))
    return invalidArgument("compute.restore_share: expected a share in (0, 1], "
                           "got " + formatNumber(compute.restoreShare));
  if (!(compute.gemmPeakFraction > 0 && compute.gemmPeakFraction <= 1))
    return invalidArgument("compute.gemm_peak_fraction: expected a share in "
                           "(0, 1], got " +
                           formatNumber(compute.gemmPeakFraction));
  KVC_RETURN_IF_ERROR(
      checkPositive(compute.gemmHalfTokens, "compute.gemm_half_tokens", true));
  KVC_RETURN_IF_ERROR(checkPositive(compute.attentionTflops,
                                    "compute.attention_tflops", true));
  if (!compute.chip.empty() && compute.kind != ComputeDesc::Kind::GPU)
    return invalidArgument("compute.chip: a " +
                           std::string(computeKindName(compute.kind)) +
                           " has no GPU architecture, got " + compute.chip);
  if (!compute.chip.empty() && !isKernelChip(compute.chip))
    return invalidArgument("compute.chip: unknown architecture \"" +
                           compute.chip + "\" (expected " + kKernelChips +
                           ")");
  if (host.cores <= 0)
    return invalidArgument("host.cores: expected a positive integer, got " +
                           std::to_string(host.cores));
  KVC_RETURN_IF_ERROR(checkPositive(host.dramGiB, "host.dram_gib"));
  KVC_RETURN_IF_ERROR(checkPositive(host.nicGBs, "host.nic_gbs", true));
  KVC_RETURN_IF_ERROR(checkPositive(host.handoffUs, "host.handoff_us", true));
  KVC_RETURN_IF_ERROR(checkPositive(host.checkGBs, "host.check_gbs", true));
  KVC_RETURN_IF_ERROR(
      checkPositive(host.readCheckGBs, "host.read_check_gbs", true));
  KVC_RETURN_IF_ERROR(checkPositive(link.h2dGBs, "link.h2d_gbs"));
  KVC_RETURN_IF_ERROR(checkPositive(link.d2hGBs, "link.d2h_gbs"));
  KVC_RETURN_IF_ERROR(checkPositive(link.latencyUs, "link.latency_us", true));
  if (tiers.empty())
    return invalidArgument("tiers: a target needs at least one storage tier");
  std::set<std::string> names;
  for (std::size_t i = 0; i < tiers.size(); ++i) {
    const TierDesc &tier = tiers[i];
    std::string path = "tiers[" + std::to_string(i) + "]";
    if (tier.name.empty())
      return invalidArgument(path + ".name: must not be empty");
    if (!names.insert(tier.name).second)
      return invalidArgument(path + ".name: duplicate tier \"" + tier.name +
                             "\"");
    KVC_RETURN_IF_ERROR(checkPositive(tier.readGBs, path + ".read_gbs"));
    KVC_RETURN_IF_ERROR(checkPositive(tier.writeGBs, path + ".write_gbs"));
    KVC_RETURN_IF_ERROR(
        checkPositive(tier.latencyUs, path + ".latency_us", true));
    KVC_RETURN_IF_ERROR(
        checkPositive(tier.throttleGBs, path + ".throttle_gbs", true));
    if (tier.lanes <= 0)
      return invalidArgument(path + ".lanes: expected a positive integer");
  }
  std::set<std::pair<CodecStage, std::optional<CodecSpec::Quant>>> stages;
  for (std::size_t i = 0; i < codecs.size(); ++i) {
    const CodecRateDesc &rate = codecs[i];
    std::string path = "codecs[" + std::to_string(i) + "]";
    if (!stages.insert({rate.stage, rate.on}).second)
      return invalidArgument(
          path + ".stage: duplicate stage \"" + kvc::name(rate.stage) + "\"" +
          (rate.on ? " on " + std::string(codecDataName(*rate.on)) : ""));
    KVC_RETURN_IF_ERROR(checkPositive(codecs[i].encodeGBs, path + ".encode_gbs"));
    KVC_RETURN_IF_ERROR(checkPositive(codecs[i].decodeGBs, path + ".decode_gbs"));
  }
  return Status::ok();
}

const TierDesc *TargetDesc::findTier(std::string_view tierName) const {
  for (const TierDesc &tier : tiers)
    if (tier.name == tierName)
      return &tier;
  return nullptr;
}

StatusOr<TargetDesc> parseTargetDesc(std::string_view text) {
  StatusOr<Json> parsed = parseJson(text);
  if (!parsed.isOk())
    return parsed.status();
  const Json &obj = *parsed;
  KVC_RETURN_IF_ERROR(expectObject(obj, ""));

  std::string schema;
  KVC_RETURN_IF_ERROR(readString(obj, "", "schema", schema, Presence::Required));
  if (schema != kTargetSchema)
    return invalidArgument("schema: unknown schema \"" + schema +
                           "\" (expected \"" + kTargetSchema + "\")");
  TargetDesc target;
  KVC_RETURN_IF_ERROR(readString(obj, "", "name", target.name,
                                 Presence::Required));
  KVC_RETURN_IF_ERROR(readString(obj, "", "description", target.description,
                                 Presence::Optional));
  KVC_RETURN_IF_ERROR(
      readBool(obj, "", "calibrated", target.calibrated, Presence::Optional));

  struct Section {
    const char *key;
    std::function<Status(const Json &, const std::string &)> parse;
  } sections[] = {
      {"compute",
       [&](const Json &j, const std::string &p) {
         return parseCompute(j, p, target.compute);
       }},
      {"host",
       [&](const Json &j, const std::string &p) {
         return parseHost(j, p, target.host);
       }},
      {"link", [&](const Json &j, const std::string &p) {
         return parseLink(j, p, target.link);
       }}};
  for (const Section &section : sections) {
    StatusOr<const Json *> sub = readObject(obj, "", section.key);
    if (!sub.isOk())
      return sub.status();
    KVC_RETURN_IF_ERROR(section.parse(**sub, section.key));
  }
  KVC_RETURN_IF_ERROR(readArray(obj, "tiers", target.tiers, parseTier));
  if (obj.contains("codecs"))
    KVC_RETURN_IF_ERROR(
        readArray(obj, "codecs", target.codecs, parseCodecRate));
  KVC_RETURN_IF_ERROR(target.validate());
  return target;
}

StatusOr<TargetDesc> loadTargetDesc(const std::string &path) {
  std::string text;
  KVC_RETURN_IF_ERROR(readFile(path, text));
  StatusOr<TargetDesc> target = parseTargetDesc(text);
  if (!target.isOk())
    return target.status().withContext(path);
  return target;
}

std::string printTargetDesc(const TargetDesc &target) {
  Json obj = Json::object();
  obj["schema"] = kTargetSchema;
  obj["name"] = target.name;
  if (!target.description.empty())
    obj["description"] = target.description;
  if (target.calibrated)
    obj["calibrated"] = true;
  const ComputeDesc &c = target.compute;
  obj["compute"] = {{"kind", computeKindName(c.kind)},
                    {"name", c.name},
                    {"dense_tflops", c.denseTflops},
                    {"mem_gbs", c.memGBs},
                    {"mem_gib", c.memGiB},
                    {"restore_share", c.restoreShare},
                    {"gemm_peak_fraction", c.gemmPeakFraction},
                    {"gemm_half_tokens", c.gemmHalfTokens}};
  if (c.attentionTflops > 0)
    obj["compute"]["attention_tflops"] = c.attentionTflops;
  if (!c.chip.empty())
    obj["compute"]["chip"] = c.chip;
  obj["host"] = {{"cores", target.host.cores},
                 {"dram_gib", target.host.dramGiB},
                 {"nic_gbs", target.host.nicGBs}};
  if (target.host.handoffUs > 0)
    obj["host"]["handoff_us"] = target.host.handoffUs;
  if (target.host.checkGBs > 0)
    obj["host"]["check_gbs"] = target.host.checkGBs;
  if (target.host.readCheckGBs > 0)
    obj["host"]["read_check_gbs"] = target.host.readCheckGBs;
  obj["link"] = {{"h2d_gbs", target.link.h2dGBs},
                 {"d2h_gbs", target.link.d2hGBs},
                 {"latency_us", target.link.latencyUs}};
  Json tiers = Json::array();
  for (const TierDesc &t : target.tiers) {
    tiers.push_back({{"name", t.name},
                     {"kind", tierKindName(t.kind)},
                     {"read_gbs", t.readGBs},
                     {"write_gbs", t.writeGBs},
                     {"latency_us", t.latencyUs},
                     {"lanes", t.lanes}});
    if (t.throttleGBs > 0)
      tiers.back()["throttle_gbs"] = t.throttleGBs;
  }
  obj["tiers"] = std::move(tiers);
  Json codecs = Json::array();
  for (const CodecRateDesc &r : target.codecs) {
    Json rate = {{"stage", name(r.stage)},
                 {"encode_gbs", r.encodeGBs},
                 {"decode_gbs", r.decodeGBs}};
    if (r.on)
      rate["on"] = codecDataName(*r.on);
    codecs.push_back(std::move(rate));
  }
  obj["codecs"] = std::move(codecs);
  return obj.dump(2) + "\n";
}

} // namespace kvc

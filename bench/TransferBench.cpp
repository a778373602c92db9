//===- TransferBench.cpp - Transfer completion time across link speeds ----===//
//
// KVServe's experiment on this machine: the KV of one request, prefilled
// once, goes from a sender to a receiver over UCX on loopback, throttled to
// each emulated link bandwidth (ThrottledLink), once per static codec and
// once with the adaptive controller (CodecController). The job completion
// time is the prefill's (measured once: the same whatever the codec) plus
// the transfer's, from the receiver's hello to its exact cache. Prints the
// transfer's seconds, one row per bandwidth (median of --repeat runs), the
// adaptive run against the best static codec, and the sums over the range
// with and without the prefill.
//
//   kvc-transfer-bench [--model DIR] [--tokens N] [--repeat R]
//                      [--gbs 0.005,0.01,...] [--codecs raw,lz4,...]
//                      [--chunk-tokens T] [--layer-group L]
//
//===----------------------------------------------------------------------===//

#include "kvc/Host/Session.h"
#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Model/GenModel.h"
#include "kvc/Runtime/Net/CodecController.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

using namespace kvc;

namespace {

std::vector<std::string> split(const std::string &list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');)
    out.push_back(item);
  return out;
}

struct Setup {
  std::unique_ptr<LlamaModel> model;
  std::vector<int32_t> tokens;
  ModelCompute::Cache computed;
  // Objects of 256 KB (256 tokens x 2 layers of this model): at 1 GB/s
  // one takes 256 us on the link, more than a 2-core machine's scheduling
  // noise per message.
  StoreLayout layout{256, 2};
};

/// One transfer at `gbs` GB/s: static `codec`, or adaptive (`controller`).
/// Returns the transfer's seconds and, for the adaptive one, its choices.
StatusOr<double> transfer(const Setup &setup, double gbs,
                          const CodecSpec *codec, CodecController &controller,
                          std::string *choices) {
  KVC_ASSIGN_OR_RETURN(listener, listenUcx("127.0.0.1", 0));
  const int port = listener->port();
  ChunkObjects objects(setup.model->config(), setup.model->fingerprint(), "",
                       setup.layout);
  StatusOr<ReceiveMetrics> received = internalError("unset");
  std::thread receiver([&] {
    StatusOr<std::unique_ptr<Link>> link =
        listener->accept(Milliseconds(10000));
    if (!link.isOk()) {
      received = link.status();
      return;
    }
    StatusOr<std::unique_ptr<host::Destination>> into = host::destinationFor(
        cpuDevice(), *setup.model, setup.tokens, nullptr, {});
    if (!into.isOk()) {
      received = into.status();
      return;
    }
    received = receiveContext(**link, objects, (*into)->target);
  });
  StatusOr<std::unique_ptr<Link>> connected =
      connectUcx("127.0.0.1", port, Milliseconds(10000));
  Status sentStatus = connected.status();
  if (connected.isOk()) {
    ThrottledLink link(std::move(*connected), gbs);
    SendOptions options;
    options.computed = &setup.computed;
    if (codec)
      options.codec = *codec;
    else
      options.chooser = &controller;
    StatusOr<SendStats> sent =
        sendContext(*setup.model, objects, setup.tokens, link, options);
    sentStatus = sent.status();
    if (sent.isOk() && choices) {
      choices->clear();
      for (const auto &[name, count] : sent->chunksPerCodec)
        *choices +=
            (choices->empty() ? "" : " ") + name + ":" + std::to_string(count);
    }
  }
  receiver.join();
  KVC_RETURN_IF_ERROR(sentStatus);
  KVC_RETURN_IF_ERROR(received.status());
  if (!received->fallbacks.empty())
    return internalError("the transfer recomputed chunks");
  return received->seconds;
}

} // namespace

int main(int argc, char **argv) {
  std::string modelDir, gbsList = "0.005,0.01,0.02,0.05,0.1,0.2,0.5,1,2,5";
  std::string codecList = "raw,lz4,zstd,int8+zstd,int4+zstd";
  int64_t tokens = 4096, repeat = 9;
  Setup setup;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string key = argv[i], value = argv[i + 1];
    if (key == "--model")
      modelDir = value;
    else if (key == "--tokens")
      tokens = std::stoll(value);
    else if (key == "--repeat")
      repeat = std::stoll(value);
    else if (key == "--gbs")
      gbsList = value;
    else if (key == "--codecs")
      codecList = value;
    else if (key == "--chunk-tokens")
      setup.layout.chunkTokens = std::stoll(value);
    else if (key == "--layer-group")
      setup.layout.layerGroup = std::stoll(value);
    else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      return 2;
    }
  }
  if (modelDir.empty()) {
    // A random model with more KV per FLOP than most (every head its own
    // K and V), so that a CPU prefill does not dwarf the transfer.
    modelDir = "/tmp/kvc-transfer-bench-model";
    GenModelOptions o;
    o.layers = 8;
    o.hidden = 128;
    o.heads = 4;
    o.kvHeads = 4;
    o.ffn = 256;
    if (Status s = generateModel(modelDir, o); !s.isOk()) {
      std::fprintf(stderr, "%s\n", s.toString().c_str());
      return 1;
    }
  }
  StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::load(modelDir);
  if (!model.isOk()) {
    std::fprintf(stderr, "%s\n", model.status().toString().c_str());
    return 1;
  }
  setup.model = std::move(*model);
  std::mt19937 rng(0);
  for (int64_t t = 0; t < tokens; ++t)
    setup.tokens.push_back(
        int32_t(rng() % uint32_t(setup.model->config().vocabSize)));
  setup.computed = setup.model->newCache();
  Clock::time_point start = Clock::now();
  if (Status s =
          setup.model->prefill(setup.computed, setup.tokens.data(), tokens);
      !s.isOk()) {
    std::fprintf(stderr, "%s\n", s.toString().c_str());
    return 1;
  }
  const double prefill = secondsSince(start);
  std::vector<CodecSpec> codecs;
  for (const std::string &name : split(codecList)) {
    StatusOr<CodecSpec> codec = parseCodecSpec(name);
    if (!codec.isOk()) {
      std::fprintf(stderr, "%s\n", codec.status().toString().c_str());
      return 2;
    }
    codecs.push_back(*codec);
  }
  const double rawMB = double(tokens) *
                       double(setup.model->config().numLayers) * 2.0 *
                       double(setup.model->kvDim()) *
                       double(dtypeBytes(setup.model->config().dtype)) * 1e-6;
  std::printf("%lld tokens, %.2f MB of raw KV in chunks of %lld tokens x %lld "
              "layers; prefill %.1f ms; transfer ms, median of %lld\n",
              (long long)tokens, rawMB, (long long)setup.layout.chunkTokens,
              (long long)setup.layout.layerGroup, prefill * 1e3,
              (long long)repeat);
  std::printf("%8s", "GB/s");
  for (const CodecSpec &c : codecs)
    std::printf(" %12s", c.str().c_str());
  std::printf(" %12s %9s  %s\n", "adaptive", "vs best", "adaptive's chunks");
  std::vector<double> sums(codecs.size() + 1, 0);
  for (const std::string &g : split(gbsList)) {
    const double gbs = std::stod(g);
    std::vector<std::vector<double>> runs(codecs.size() + 1);
    std::string choices;
    // One controller per emulated link, kept across its transfers as a
    // server keeps one per peer.
    CodecControllerOptions adaptive;
    adaptive.candidates = codecs;
    CodecController controller(adaptive);
    for (int64_t r = 0; r < repeat; ++r)
      for (size_t c = 0; c <= codecs.size(); ++c) {
        StatusOr<double> seconds =
            transfer(setup, gbs, c < codecs.size() ? &codecs[c] : nullptr,
                     controller, c == codecs.size() ? &choices : nullptr);
        if (!seconds.isOk()) {
          std::fprintf(stderr, "%s\n", seconds.status().toString().c_str());
          return 1;
        }
        runs[c].push_back(*seconds);
      }
    std::printf("%8g", gbs);
    double best = 1e30;
    for (size_t c = 0; c <= codecs.size(); ++c) {
      const double jct = median(runs[c]);
      sums[c] += jct;
      if (c < codecs.size())
        best = std::min(best, jct);
      std::printf(" %12.1f", jct * 1e3);
    }
    std::printf(" %8.1f%%  %s\n", (median(runs.back()) / best - 1) * 100,
                choices.c_str());
    std::fflush(stdout);
  }
  std::printf("%8s", "sum");
  for (double s : sums)
    std::printf(" %12.1f", s * 1e3);
  std::printf("\n%8s", "JCT sum");
  const double rows = double(split(gbsList).size());
  for (double s : sums)
    std::printf(" %12.1f", (s + rows * prefill) * 1e3);
  std::printf("   (prefill + transfer)\n");
  return 0;
}

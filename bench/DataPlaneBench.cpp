//===- DataPlaneBench.cpp - Codecs, tiers and the save path ---------------===//
//
// Each target is measured beside its reference in the same run:
//
//   build/bench/kvc-dataplane-bench --benchmark_repetitions=5 \
//       --benchmark_report_aggregates_only=true
//
// Inflate/*        deflate decode of int4 KV, libdeflate vs zlib (one core)
// Dequant/*        int4 and int8 to bf16, output bytes per second (one core)
// ColdRead/*       4 MiB objects of the file tier vs plain 1 MiB read()s
//                  (dd's loop) of the same files, page cache dropped first
// RedisGetMany     pipelined GETs of 1 MiB objects from a loopback server
// Prefill/*        prefill alone, and with KV + hidden saved to a store
//
// The KV is a generated model's for 2048 random tokens, or, with
// KVC_DATAPLANE_MODEL=DIR, that model's for the story it tells greedily from
// BOS (up to 2048 tokens and its context): a trained model's real KV, e.g.
// stories260K imported by `kvc-run import-llama2c`.
//
//===----------------------------------------------------------------------===//

#include "kvc/Host/Tools/Generate.h"
#include "kvc/Runtime/Base/Half.h"
#include "kvc/Runtime/Codec/ChunkCodec.h"
#include "kvc/Runtime/Model/GenModel.h"
#include "kvc/Runtime/Save/Saver.h"
#include "kvc/Runtime/Store/Tier.h"

#include <benchmark/benchmark.h>
#include <zlib.h>

#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <isa-l.h>
#include <libdeflate.h>
#include <random>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace kvc;

namespace {

namespace fs = std::filesystem;

/// A generated model and its KV for 2048 random tokens, or the model in
/// $KVC_DATAPLANE_MODEL and its KV for its own story.
struct Data {
  std::string modelDir;
  std::unique_ptr<LlamaModel> model;
  std::vector<int32_t> tokens;
  std::vector<float> kv;
  ChunkShape shape;
};

Data &data() {
  static Data d = [] {
    Data out;
    const char *real = std::getenv("KVC_DATAPLANE_MODEL");
    if (real) {
      out.modelDir = real;
    } else {
      out.modelDir = fs::temp_directory_path() / "kvc-dataplane-bench-model";
      GenModelOptions o;
      o.layers = 4;
      o.hidden = 512;
      o.heads = 8;
      o.kvHeads = 4;
      o.ffn = 1024;
      o.vocab = 1024;
      o.seed = 1;
      (void)generateModel(out.modelDir, o);
    }
    StatusOr<std::unique_ptr<LlamaModel>> model =
        LlamaModel::load(out.modelDir);
    if (!model.isOk()) {
      std::fprintf(stderr, "%s\n", model.status().toString().c_str());
      std::exit(1);
    }
    out.model = std::move(*model);
    const ModelConfig &config = out.model->config();
    const int64_t n = std::min<int64_t>(2048, config.maxPositions);
    if (real) {
      host::GenerateOptions story;
      story.steps = n - 1;
      out.tokens = {1}; // BOS
      StatusOr<std::vector<int32_t>> told =
          host::generateAfterPrefill(*out.model, out.tokens, story);
      if (told.isOk())
        out.tokens.insert(out.tokens.end(), told->begin(), told->end());
    } else {
      std::mt19937_64 rng(2);
      out.tokens.resize(n);
      for (int32_t &t : out.tokens)
        t = int32_t(rng() % uint64_t(config.vocabSize));
    }
    const int64_t tokens = int64_t(out.tokens.size());
    LlamaModel::Cache cache = out.model->newCache();
    (void)out.model->prefill(cache, out.tokens.data(), tokens);
    for (int64_t l = 0; l < config.numLayers; ++l) {
      out.kv.insert(out.kv.end(), cache.k[l].begin(), cache.k[l].end());
      out.kv.insert(out.kv.end(), cache.v[l].begin(), cache.v[l].end());
    }
    out.shape = chunkShape(config, Form::KV, tokens, 0, config.numLayers);
    std::fprintf(stderr, "KV of %s: %lld tokens x %lld layers\n",
                 real ? real : "a generated model", (long long)tokens,
                 (long long)config.numLayers);
    return out;
  }();
  return d;
}

/// The int4 KV bytes a deflate stage sees.
const std::string &int4Bytes() {
  static std::string bytes = *encodeChunk(
      data().kv.data(), data().shape, *parseCodecSpec("int4"), DType::BF16);
  return bytes;
}

/// A Huffman-coded deflate stream of int4 KV (libdeflate level 1), as every
/// library is measured on. kvc itself stores stored blocks when coding saves
/// under 15% (Inflate/kvc-stored below).
const std::string &deflated() {
  static std::string packed = [] {
    const std::string &plain = int4Bytes();
    libdeflate_compressor *c = libdeflate_alloc_compressor(1);
    std::string out(libdeflate_deflate_compress_bound(c, plain.size()), '\0');
    out.resize(libdeflate_deflate_compress(c, plain.data(), plain.size(),
                                           out.data(), out.size()));
    libdeflate_free_compressor(c);
    return out;
  }();
  return packed;
}

void InflateKvcStored(benchmark::State &state) {
  const std::string &plain = int4Bytes();
  std::string packed = *compressBytes(plain, CodecSpec::Lossless::Deflate);
  std::string out;
  for (auto _ : state)
    (void)decompressBytes(packed, CodecSpec::Lossless::Deflate, out,
                          plain.size());
  state.SetBytesProcessed(int64_t(state.iterations()) * plain.size());
  state.counters["ratio"] = double(packed.size()) / plain.size();
}
BENCHMARK(InflateKvcStored)->Name("Inflate/kvc-stored");

/// zlib's inflate of a raw deflate stream into `out` (sized to fit).
void zlibInflate(const std::string &packed, std::string &out) {
  z_stream z{};
  inflateInit2(&z, -15); // Raw deflate.
  z.next_in = reinterpret_cast<Bytef *>(const_cast<char *>(packed.data()));
  z.avail_in = uInt(packed.size());
  z.next_out = reinterpret_cast<Bytef *>(out.data());
  z.avail_out = uInt(out.size());
  inflate(&z, Z_FINISH);
  inflateEnd(&z);
}

/// zlib on the very stream kvc stores (stored blocks).
void InflateZlibStored(benchmark::State &state) {
  const std::string &plain = int4Bytes();
  std::string packed = *compressBytes(plain, CodecSpec::Lossless::Deflate);
  std::string out(plain.size(), '\0');
  for (auto _ : state)
    zlibInflate(packed, out);
  state.SetBytesProcessed(int64_t(state.iterations()) * plain.size());
}
BENCHMARK(InflateZlibStored)->Name("Inflate/zlib-stored");

void InflateLibdeflate(benchmark::State &state) {
  const std::string &plain = int4Bytes(), &packed = deflated();
  libdeflate_decompressor *d = libdeflate_alloc_decompressor();
  std::string out(plain.size(), '\0');
  for (auto _ : state)
    libdeflate_deflate_decompress(d, packed.data(), packed.size(), out.data(),
                                  out.size(), nullptr);
  libdeflate_free_decompressor(d);
  state.SetBytesProcessed(int64_t(state.iterations()) * plain.size());
  state.counters["ratio"] = double(packed.size()) / plain.size();
}
BENCHMARK(InflateLibdeflate)->Name("Inflate/libdeflate");

void InflateIsal(benchmark::State &state) {
  const std::string &plain = int4Bytes(), &packed = deflated();
  std::string out(plain.size(), '\0');
  for (auto _ : state) {
    inflate_state st;
    isal_inflate_init(&st);
    st.next_in = reinterpret_cast<uint8_t *>(const_cast<char *>(packed.data()));
    st.avail_in = uint32_t(packed.size());
    st.next_out = reinterpret_cast<uint8_t *>(out.data());
    st.avail_out = uint32_t(out.size());
    st.crc_flag = ISAL_DEFLATE;
    isal_inflate_stateless(&st);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * plain.size());
}
BENCHMARK(InflateIsal)->Name("Inflate/isa-l");

void InflateZlib(benchmark::State &state) {
  const std::string &plain = int4Bytes(), &packed = deflated();
  std::string out(plain.size(), '\0');
  for (auto _ : state)
    zlibInflate(packed, out);
  state.SetBytesProcessed(int64_t(state.iterations()) * plain.size());
}
BENCHMARK(InflateZlib)->Name("Inflate/zlib");

/// Dequantizes chunks of `state.range(0)` tokens (every layer, K and V).
void Dequant(benchmark::State &state, const char *spec) {
  CodecSpec codec = *parseCodecSpec(spec);
  const Data &d = data();
  int64_t tokens = state.range(0), rows = d.shape.tokens;
  if (tokens > rows) {
    state.SkipWithError("the model's KV holds fewer tokens");
    return;
  }
  ChunkShape shape = d.shape;
  shape.tokens = tokens;
  // The first `tokens` rows of every matrix.
  std::vector<float> values;
  for (int64_t m = 0; m < shape.matrices(); ++m)
    values.insert(values.end(), d.kv.begin() + m * rows * shape.width,
                  d.kv.begin() + (m * rows + tokens) * shape.width);
  std::string bytes = *encodeChunk(values.data(), shape, codec, DType::BF16);
  std::vector<uint16_t> out(shape.numel());
  for (auto _ : state)
    (void)decodeChunkToBf16(bytes, shape, codec, DType::BF16, out.data());
  state.SetBytesProcessed(int64_t(state.iterations()) * out.size() * 2);
}
// 256 tokens: one restore chunk (1 MiB of bf16, cache resident); 2048: the
// whole context (16 MiB, DRAM bound).
BENCHMARK_CAPTURE(Dequant, int4, "int4")->Name("Dequant/int4")->Arg(256)->Arg(2048);
BENCHMARK_CAPTURE(Dequant, int8, "int8")->Name("Dequant/int8")->Arg(256)->Arg(2048);

/// 64 files of 4 MiB on the file tier.
const fs::path &coldDir() {
  static fs::path dir = [] {
    fs::path root = fs::temp_directory_path() / "kvc-dataplane-bench-cold";
    fs::remove_all(root);
    auto tier = std::move(*openTier("file://" + root.string()));
    std::string payload(4 << 20, 'k');
    for (int i = 0; i < 64; ++i)
      (void)tier->put("obj/" + std::to_string(i), payload);
    return root;
  }();
  return dir;
}

void dropCache(const fs::path &dir) {
  for (const auto &entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file()) {
      int fd = ::open(entry.path().c_str(), O_RDONLY);
      fdatasync(fd);
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
}

void ColdReadTier(benchmark::State &state) {
  auto tier = std::move(*openTier("file://" + coldDir().string()));
  std::string buffer;
  for (auto _ : state) {
    state.PauseTiming();
    dropCache(coldDir());
    state.ResumeTiming();
    for (int i = 0; i < 64; ++i)
      (void)tier->get("obj/" + std::to_string(i), buffer);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * 64 * (4 << 20));
}
BENCHMARK(ColdReadTier)->Name("ColdRead/file-tier")->UseRealTime()->Unit(benchmark::kMillisecond);

void ColdReadPlain(benchmark::State &state) {
  std::vector<char> block(1 << 20);
  for (auto _ : state) {
    state.PauseTiming();
    dropCache(coldDir());
    state.ResumeTiming();
    for (int i = 0; i < 64; ++i) {
      int fd = ::open((coldDir() / "obj" / std::to_string(i)).c_str(), O_RDONLY);
      while (::read(fd, block.data(), block.size()) > 0) {
      }
      ::close(fd);
    }
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * 64 * (4 << 20));
}
BENCHMARK(ColdReadPlain)->Name("ColdRead/dd-loop")->UseRealTime()->Unit(benchmark::kMillisecond);

/// Pipelined GETs of 64 x 1 MiB from a redis-server on loopback with two I/O
/// threads. `mallocConf` tunes the server's jemalloc: redis 7.0 copies each
/// value into fresh reply blocks, and with jemalloc's default decay most of
/// the server's time goes to faulting those pages in again.
void RedisGetMany(benchmark::State &state, const char *mallocConf) {
  int port = 21000 + int(getpid() % 10000);
  pid_t pid = fork();
  if (pid == 0) {
    if (*mallocConf)
      setenv("MALLOC_CONF", mallocConf, 1);
    std::string p = std::to_string(port);
    execlp("redis-server", "redis-server", "--port", p.c_str(), "--bind",
           "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel",
           "warning", "--io-threads", "2", nullptr);
    _exit(127);
  }
  std::string url = "redis://127.0.0.1:" + std::to_string(port);
  std::unique_ptr<Tier> tier;
  for (int i = 0; i < 100 && !tier; ++i) {
    auto opened = openTier(url);
    if (opened.isOk())
      tier = std::move(*opened);
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!tier) {
    state.SkipWithError("redis-server did not start");
  } else {
    std::string payload(1 << 20, 'r');
    std::vector<std::string> names;
    for (int i = 0; i < 64; ++i) {
      names.push_back("obj/" + std::to_string(i));
      (void)tier->put(names.back(), payload);
    }
    // `lanes` callers at once, each pipelining its share (an executor's IO
    // lanes; the tier gives each a connection).
    const int lanes = int(state.range(0));
    std::vector<std::vector<std::string>> shares(lanes), buffers(lanes);
    for (int i = 0; i < 64; ++i)
      shares[i % lanes].push_back(names[i]);
    for (auto _ : state) {
      std::vector<std::thread> callers;
      for (int l = 1; l < lanes; ++l)
        callers.emplace_back(
            [&, l] { tier->getMany(shares[l], buffers[l]); });
      tier->getMany(shares[0], buffers[0]);
      for (std::thread &caller : callers)
        caller.join();
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * 64 * (1 << 20));
  }
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
}
BENCHMARK_CAPTURE(RedisGetMany, default_server, "")
    ->ArgName("lanes")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(RedisGetMany, no_page_decay,
                  "dirty_decay_ms:-1,muzzy_decay_ms:-1")
    ->ArgName("lanes")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void Prefill(benchmark::State &state, bool saving) {
  Data &d = data();
  std::shared_ptr<Tier> tier = std::move(*openTier("mem://?capacity_mb=4096"));
  SaveOptions options;
  options.dryRun = !saving;
  options.writers = 1;
  double stall = 0;
  size_t peak = 0;
  for (auto _ : state) {
    state.PauseTiming();
    ChunkStore store(tier, d.model->config(), d.model->fingerprint(),
                     "bench-" + std::to_string(state.iterations()), {});
    state.ResumeTiming();
    SaveStats stats = *saveContext(*d.model, store, d.tokens, options);
    state.SetIterationTime(stats.prefillSeconds);
    stall += stats.stallSeconds;
    peak = std::max(peak, stats.peakBufferedBytes);
  }
  state.counters["stall_s"] = stall / double(state.iterations());
  state.counters["peak_buffer_MiB"] = double(peak) / (1 << 20);
}
BENCHMARK_CAPTURE(Prefill, off, false)
    ->Name("Prefill/saving-off")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Prefill, on, true)
    ->Name("Prefill/saving-on")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

} // namespace

BENCHMARK_MAIN();

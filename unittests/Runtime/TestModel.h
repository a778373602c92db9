//===- TestModel.h - Small random models for runtime tests ------*- C++ -*-===//

#ifndef KVC_UNITTESTS_RUNTIME_TESTMODEL_H
#define KVC_UNITTESTS_RUNTIME_TESTMODEL_H

#include "kvc/Runtime/Model/GenModel.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <unistd.h>
#include <vector>

namespace kvc::test {

/// The paths tempPath handed out, removed when the process that asked for
/// them exits (not when a child it forked does).
class TempPaths {
public:
  static TempPaths &get() {
    static TempPaths paths;
    return paths;
  }
  void add(const std::string &path) {
    std::lock_guard<std::mutex> lock(mutex_);
    paths_.push_back(path);
  }
  ~TempPaths() {
    if (::getpid() != owner_)
      return;
    for (const std::string &path : paths_) {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  }

private:
  TempPaths() : owner_(::getpid()) {}
  pid_t owner_;
  std::mutex mutex_;
  std::vector<std::string> paths_;
};

/// A temporary path of this test process (tests run in parallel processes
/// and must not share files), removed when the process exits.
inline std::string tempPath(const std::string &name) {
  std::string path = ::testing::TempDir() + "/kvc-" + name + "-" +
                     std::to_string(::getpid());
  TempPaths::get().add(path);
  return path;
}

/// Writes a random Llama model with `layers` layers, `hidden` hidden size
/// (4 heads of which 2 KV heads when hidden <= 128, else 8 and 2), seeded
/// with `seed`, in `dtype`, to a per-process directory named `name`;
/// returns it.
inline std::string generateTestModel(const std::string &name, uint64_t seed,
                                     int64_t layers = 4, int64_t hidden = 128,
                                     DType dtype = DType::BF16) {
  GenModelOptions o;
  o.dtype = dtype;
  o.layers = layers;
  o.hidden = hidden;
  o.heads = hidden <= 128 ? 4 : 8;
  o.kvHeads = 2;
  o.ffn = 2 * hidden;
  o.vocab = 512;
  o.seed = seed;
  std::string dir = tempPath(name);
  Status status = generateModel(dir, o);
  EXPECT_TRUE(status.isOk()) << status.toString();
  return dir;
}

} // namespace kvc::test

#endif // KVC_UNITTESTS_RUNTIME_TESTMODEL_H

//===- Safetensors.cpp - Hugging Face safetensors files -------------------===//

#include "kvc/Runtime/Model/Safetensors.h"

#include "kvc/Runtime/Base/Half.h"
#include "kvc/Runtime/Base/Sha256.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string_view>
#include <utility>

namespace kvc {

namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

struct DTypeInfo {
  const char *name;
  DType dtype;
  int64_t bytes;
};
constexpr DTypeInfo kDTypes[] = {
    {"BF16", DType::BF16, 2}, {"F16", DType::F16, 2}, {"F32", DType::F32, 4}};

StatusOr<std::string> readAll(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return notFound(path + ": cannot open file");
  // One read of the whole file: checkpoints are gigabytes.
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size < 0)
    return dataLoss(path + ": cannot size the file");
  std::string bytes(size_t(size), '\0');
  if (!in.read(bytes.data(), size))
    return dataLoss(path + ": short read");
  return bytes;
}

/// A file mapped read-only: checkpoints are gigabytes, which the page
/// cache holds already once read; a copy would double them.
class MappedFile {
public:
  static StatusOr<MappedFile> open(const std::string &path) {
    MappedFile file;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return notFound(path + ": cannot open file");
    struct stat info;
    if (::fstat(fd, &info) != 0) {
      ::close(fd);
      return dataLoss(path + ": cannot size the file");
    }
    file.size_ = size_t(info.st_size);
    if (file.size_ > 0) {
      void *data = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (data == MAP_FAILED) {
        ::close(fd);
        return dataLoss(path + ": cannot map the file");
      }
      ::madvise(data, file.size_, MADV_SEQUENTIAL);
      file.data_ = static_cast<const char *>(data);
    }
    ::close(fd);
    return file;
  }
  MappedFile(MappedFile &&other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  MappedFile &operator=(MappedFile &&) = delete;
  ~MappedFile() {
    if (data_)
      ::munmap(const_cast<char *>(data_), size_);
  }
  std::string_view bytes() const { return {data_ ? data_ : "", size_}; }

private:
  MappedFile() = default;
  const char *data_ = nullptr;
  size_t size_ = 0;
};

/// The files of the checkpoint in `dir`, in order: model.safetensors, or
/// the shards model.safetensors.index.json lists, sorted.
StatusOr<std::vector<std::string>> checkpointFiles(const std::string &dir) {
  fs::path single = fs::path(dir) / "model.safetensors";
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(single))
    return std::vector<std::string>{single.string()};
  if (!fs::exists(index))
    return notFound(dir + ": no model.safetensors or "
                          "model.safetensors.index.json");
  KVC_ASSIGN_OR_RETURN(text, readAll(index.string()));
  std::set<std::string> shards;
  try {
    Json map = Json::parse(text).at("weight_map");
    for (auto it = map.begin(); it != map.end(); ++it)
      shards.insert(it.value().get<std::string>());
  } catch (const Json::exception &e) {
    return dataLoss(index.string() + ": " + e.what());
  }
  std::vector<std::string> files;
  for (const std::string &shard : shards) {
    if (shard.find('/') != std::string::npos)
      return dataLoss(index.string() + ": shard " + shard +
                      " is not in the checkpoint directory");
    files.push_back((fs::path(dir) / shard).string());
  }
  return files;
}

const DTypeInfo &infoOf(DType dtype) {
  for (const DTypeInfo &d : kDTypes)
    if (d.dtype == dtype)
      return d;
  return kDTypes[2];
}

uint16_t wordAt(const char *data, int64_t i) {
  uint16_t bits;
  std::memcpy(&bits, data + 2 * i, 2);
  return bits;
}

} // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

void TensorView::toFloats(int64_t first, int64_t n, float *out) const {
  if (dtype == DType::F32) {
    std::memcpy(out, data + 4 * first, size_t(n) * 4);
    return;
  }
  const bool bf16 = dtype == DType::BF16;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t bits = wordAt(data, first + i);
    out[i] = bf16 ? bf16ToFloat(bits) : f16ToFloat(bits);
  }
}

void TensorView::toBf16(int64_t first, int64_t n, uint16_t *out) const {
  if (dtype == DType::BF16) {
    std::memcpy(out, data + 2 * first, size_t(n) * 2);
    return;
  }
  // One pass, converting as toFloats does.
  for (int64_t i = 0; i < n; ++i) {
    float value;
    if (dtype == DType::F32)
      std::memcpy(&value, data + 4 * (first + i), 4);
    else
      value = f16ToFloat(wordAt(data, first + i));
    out[i] = floatToBf16(value);
  }
}

struct Checkpoint::File {
  explicit File(MappedFile mapped) : mapped(std::move(mapped)) {}
  MappedFile mapped;
};

Checkpoint::Checkpoint() = default;
Checkpoint::~Checkpoint() = default;

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string &dir) {
  KVC_ASSIGN_OR_RETURN(paths, checkpointFiles(dir));
  std::unique_ptr<Checkpoint> checkpoint(new Checkpoint());
  for (const std::string &path : paths) {
    KVC_ASSIGN_OR_RETURN(mapped, MappedFile::open(path));
    checkpoint->files_.push_back(std::make_unique<File>(std::move(mapped)));
    const std::string_view bytes = checkpoint->files_.back()->mapped.bytes();
    if (bytes.size() < 8)
      return dataLoss(path + ": shorter than a safetensors header");
    uint64_t headerSize = 0;
    for (int i = 0; i < 8; ++i)
      headerSize |= uint64_t(uint8_t(bytes[i])) << (8 * i);
    if (headerSize > bytes.size() - 8)
      return dataLoss(path + ": header length " + std::to_string(headerSize) +
                      " exceeds the file");
    Json header;
    try {
      header = Json::parse(bytes.begin() + 8, bytes.begin() + 8 + headerSize);
    } catch (const Json::exception &e) {
      return dataLoss(path + ": bad header: " + e.what());
    }
    if (!header.is_object())
      return dataLoss(path + ": header is not a JSON object");
    const uint64_t dataStart = 8 + headerSize;
    const uint64_t dataSize = bytes.size() - dataStart;
    std::vector<std::string> &order = checkpoint->order_.emplace_back();
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string &name = it.key();
      if (name == "__metadata__")
        continue;
      const Json &entry = it.value();
      try {
        std::string dtypeName = entry.at("dtype").get<std::string>();
        const DTypeInfo *info = nullptr;
        for (const DTypeInfo &d : kDTypes)
          if (dtypeName == d.name)
            info = &d;
        if (!info)
          return unimplemented(path + ": tensor " + name + " has dtype " +
                               dtypeName + " (kvc reads BF16, F16, F32)");
        TensorView view;
        view.dtype = info->dtype;
        view.shape = entry.at("shape").get<std::vector<int64_t>>();
        auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
        if (offsets.size() != 2 || offsets[0] > offsets[1] ||
            offsets[1] > dataSize)
          return dataLoss(path + ": tensor " + name +
                          " has offsets outside the file");
        int64_t numel = view.numel();
        if (numel < 0 ||
            uint64_t(numel * info->bytes) != offsets[1] - offsets[0])
          return dataLoss(path + ": tensor " + name +
                          " size does not match its shape and dtype");
        view.data = bytes.data() + dataStart + offsets[0];
        if (!checkpoint->tensors_.emplace(name, std::move(view)).second)
          return dataLoss(path + ": tensor " + name +
                          " is in another file of the checkpoint too");
        order.push_back(name);
      } catch (const Json::exception &e) {
        return dataLoss(path + ": tensor " + name + ": " + e.what());
      }
    }
  }
  return checkpoint;
}

StatusOr<TensorView> Checkpoint::tensor(const std::string &name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    return invalidArgument("checkpoint has no tensor " + name);
  return it->second;
}

std::string Checkpoint::digest() const {
  Sha256 hash;
  for (const std::vector<std::string> &names : order_)
    for (const std::string &name : names) {
      const TensorView &view = tensors_.at(name);
      hash.update(name).update(std::string(infoOf(view.dtype).name));
      for (int64_t d : view.shape)
        hash.update(uint64_t(d));
      hash.update(view.data, size_t(view.numel() * infoOf(view.dtype).bytes));
    }
  return toHex(hash.finish());
}

StatusOr<TensorMap> loadSafetensors(const std::string &dir,
                                    std::string *digest) {
  KVC_ASSIGN_OR_RETURN(checkpoint, Checkpoint::open(dir));
  TensorMap tensors;
  for (const auto &[name, view] : checkpoint->tensors()) {
    Tensor &tensor = tensors[name];
    tensor.shape = view.shape;
    tensor.data.resize(size_t(view.numel()));
    view.toFloats(0, view.numel(), tensor.data.data());
  }
  if (digest)
    *digest = checkpoint->digest();
  return tensors;
}

StatusOr<std::string> safetensorsDigest(const std::string &dir) {
  KVC_ASSIGN_OR_RETURN(checkpoint, Checkpoint::open(dir));
  return checkpoint->digest();
}

Status writeSafetensors(const std::string &path, const TensorMap &tensors,
                        DType dtype) {
  const char *dtypeName = dtype == DType::BF16  ? "BF16"
                          : dtype == DType::F16 ? "F16"
                                                : "F32";
  int64_t elementBytes = dtypeBytes(dtype);
  Json header = Json::object();
  uint64_t offset = 0;
  for (const auto &[name, tensor] : tensors) {
    uint64_t size = uint64_t(tensor.numel() * elementBytes);
    header[name] = {{"dtype", dtypeName},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string headerText = header.dump();
  while ((8 + headerText.size()) % 8)
    headerText += ' '; // Align the data, as the reference writer does.
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out)
      return unavailable(tmp + ": cannot create file");
    uint64_t size = headerText.size();
    for (int i = 0; i < 8; ++i)
      out.put(char(size >> (8 * i)));
    out << headerText;
    for (const auto &[name, tensor] : tensors)
      for (float value : tensor.data) {
        if (dtype == DType::F32) {
          out.write(reinterpret_cast<const char *>(&value), 4);
        } else {
          uint16_t bits =
              dtype == DType::BF16 ? floatToBf16(value) : floatToF16(value);
          out.write(reinterpret_cast<const char *>(&bits), 2);
        }
      }
    if (!out)
      return unavailable(tmp + ": write failed");
  }
  std::error_code error;
  fs::rename(tmp, path, error);
  if (error)
    return unavailable(path + ": " + error.message());
  return Status::ok();
}

} // namespace kvc

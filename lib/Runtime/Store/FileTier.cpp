//===- FileTier.cpp - The file:// tier ------------------------------------===//
//
// Local disk: one file per object under a root directory, written through a
// temporary file renamed into place, read in place with preadv
// (Tier::getInto), optionally bounded and evicted least recently used first.
//
//===----------------------------------------------------------------------===//

#include "LocalTiers.h"

#include "kvc/Runtime/Store/ChunkFormat.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

namespace kvc {

namespace {

namespace fs = std::filesystem;

/// Local disk: one file per object under a root directory. Writes go to a
/// temporary file that is renamed into place, so a crash never leaves half
/// an object visible; reads need no locks and run in parallel.
class FileTier final : public Tier {
public:
  /// `capacityBytes` > 0 bounds the objects' total size: past it, the
  /// objects used least recently (written or read: a read touches the
  /// file's mtime) are removed, down to 90% of it.
  FileTier(std::string url, fs::path root, int64_t capacityBytes = 0)
      : url_(std::move(url)), root_(std::move(root)),
        capacityBytes_(capacityBytes) {
    if (capacityBytes_ > 0)
      bytes_ = int64_t(totalBytes());
  }

  const std::string &url() const override { return url_; }

  Status put(const std::string &name, std::string_view bytes) override {
    fs::path path = root_ / name;
    std::error_code error;
    fs::create_directories(path.parent_path(), error);
    if (error)
      return unavailable(path.parent_path().string() + ": " + error.message());
    // Written under .tmp/PID.N, then renamed into place: an object is never
    // visible half-written, and what a killed writer leaves there is removed
    // by the next process that opens the store (removeStaleTemporaries).
    const fs::path temporaries = root_ / kTemporaries;
    fs::create_directories(temporaries, error);
    if (error)
      return unavailable(temporaries.string() + ": " + error.message());
    fs::path tmp = temporaries / (std::to_string(::getpid()) + "." +
                                  std::to_string(counter_++));
    {
      errno = 0;
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), std::streamsize(bytes.size()));
      out.flush();
      if (!out) {
        const int why = errno;
        fs::remove(tmp, error);
        return unavailable(tmp.string() + ": cannot write: " +
                           (why ? std::strerror(why) : "unknown error"));
      }
    }
    const auto replaced =
        capacityBytes_ > 0 ? fs::file_size(path, error) : std::uintmax_t(0);
    const int64_t before = error ? 0 : int64_t(replaced);
    fs::rename(tmp, path, error);
    if (error) {
      fs::remove(tmp, error);
      return unavailable(path.string() + ": " + error.message());
    }
    if (capacityBytes_ > 0 &&
        (bytes_ += int64_t(bytes.size()) - before) > capacityBytes_)
      evict(name);
    return Status::ok();
  }

  Status get(const std::string &name, std::string &buffer) override {
    size_t size = 0;
    KVC_ASSIGN_OR_RETURN(fd, openObject(name, size));
    buffer.resize(size);
    const size_t done = readFully(fd, {{buffer.data(), size}});
    ::close(fd);
    if (done != size)
      return chunkError(ChunkFault::Truncated,
                        (root_ / name).string() + ": short read");
    return Status::ok();
  }

  StatusOr<size_t> getInto(const std::string &name,
                           const std::vector<ByteSpan> &parts) override {
    size_t size = 0;
    KVC_ASSIGN_OR_RETURN(fd, openObject(name, size));
    if (size != totalSize(parts)) {
      ::close(fd);
      return size;
    }
    const size_t done = readFully(fd, parts);
    ::close(fd);
    if (done != size)
      return chunkError(ChunkFault::Truncated,
                        (root_ / name).string() + ": short read");
    return size;
  }
  bool readsInPlace() const override { return true; }

  StatusOr<bool> exists(const std::string &name) override {
    std::error_code error;
    return fs::exists(root_ / name, error);
  }

  /// Also removes the directories the object leaves empty, up to the root.
  Status remove(const std::string &name) override {
    std::error_code error;
    fs::path path = root_ / name;
    fs::remove(path, error);
    if (error)
      return unavailable(path.string() + ": " + error.message());
    for (path = path.parent_path(); path != root_ && fs::is_empty(path, error);
         path = path.parent_path())
      if (error || !fs::remove(path, error))
        break;
    return Status::ok();
  }

  StatusOr<std::vector<std::string>> list(const std::string &prefix) override {
    std::vector<std::string> names;
    std::error_code error;
    // Walk only the directory the prefix's path names ("<key>/kv/0-4/" lists
    // one chunk's encodings, not the store).
    const fs::path dir = root_ / prefix.substr(0, prefix.rfind('/') + 1);
    if (!fs::is_directory(dir, error))
      return names;
    for (auto it = fs::recursive_directory_iterator(dir, error);
         it != fs::recursive_directory_iterator(); it.increment(error)) {
      if (error)
        return unavailable(root_.string() + ": " + error.message());
      if (!it->is_regular_file())
        continue;
      std::string name = fs::relative(it->path(), root_).generic_string();
      if (name.rfind(std::string(kTemporaries) + "/", 0) != 0 &&
          name.find(".tmp.") == std::string::npos &&
          name.compare(0, prefix.size(), prefix) == 0)
        names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  /// Removes the temporaries of writers that no longer run (a save killed
  /// between writing an object and renaming it into place).
  void removeStaleTemporaries() {
    std::error_code error;
    const fs::path temporaries = root_ / kTemporaries;
    if (!fs::is_directory(temporaries, error))
      return;
    for (const fs::directory_entry &entry :
         fs::directory_iterator(temporaries, error)) {
      const std::string name = entry.path().filename().string();
      char *end = nullptr;
      const long pid = std::strtol(name.c_str(), &end, 10);
      if (end == name.c_str() || *end != '.' || pid <= 0)
        continue;
      if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH)
        fs::remove(entry.path(), error);
    }
  }

private:
  /// The directory, under the root, of objects being written.
  static constexpr const char *kTemporaries = ".tmp";
  /// Records of the layouts a store holds (ChunkStore::recordLayout):
  /// kept, whatever their age.
  static constexpr const char *kLayouts = "layouts/";

  /// Every object's size.
  std::uintmax_t totalBytes() const {
    std::uintmax_t total = 0;
    std::error_code error;
    for (auto it = fs::recursive_directory_iterator(root_, error);
         !error && it != fs::recursive_directory_iterator();
         it.increment(error))
      if (it->is_regular_file(error))
        total += it->file_size(error);
    return total;
  }

  /// Removes the objects used least recently until the store holds at
  /// most 90% of its capacity, never `keep` (just written) nor a layout
  /// record. Rescans the store, so that what other processes wrote counts.
  void evict(const std::string &keep) {
    std::lock_guard<std::mutex> lock(evicting_);
    struct Entry {
      fs::file_time_type used;
      std::uintmax_t size;
      std::string name;
    };
    std::vector<Entry> entries;
    std::uintmax_t total = 0;
    std::error_code error;
    for (auto it = fs::recursive_directory_iterator(root_, error);
         !error && it != fs::recursive_directory_iterator();
         it.increment(error)) {
      if (!it->is_regular_file(error))
        continue;
      const std::uintmax_t size = it->file_size(error);
      total += size;
      std::string name = fs::relative(it->path(), root_).generic_string();
      if (name == keep || name.rfind(kLayouts, 0) == 0 ||
          name.rfind(std::string(kTemporaries) + "/", 0) == 0)
        continue;
      entries.push_back({it->last_write_time(error), size, std::move(name)});
    }
    std::sort(entries.begin(), entries.end(),
              [](const Entry &a, const Entry &b) { return a.used < b.used; });
    const std::uintmax_t target = std::uintmax_t(capacityBytes_) / 10 * 9;
    for (const Entry &entry : entries) {
      if (total <= target)
        break;
      if (remove(entry.name).isOk())
        total -= entry.size;
    }
    bytes_ = int64_t(total);
  }

  Status unavailable(std::string message) {
    return chunkError(ChunkFault::Unavailable, url_ + ": " + message);
  }

  /// Opens object `name` for reading, a regular file of `size` bytes.
  StatusOr<int> openObject(const std::string &name, size_t &size) {
    fs::path path = root_ / name;
    // Non-blocking: opening a FIFO for reading would wait for a writer.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
      return errno == ENOENT
                 ? missingObject(url_, name)
                 : unavailable(path.string() + ": " + std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      Status failed = unavailable(path.string() + ": " + std::strerror(errno));
      ::close(fd);
      return failed;
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return chunkError(ChunkFault::Corrupt,
                        path.string() + ": not a regular file");
    }
    // One object is read whole and once: tell the kernel to read ahead.
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    if (capacityBytes_ > 0) { // A use: the last to be evicted.
      const timespec times[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
      ::futimens(fd, times);
    }
    size = size_t(st.st_size);
    return fd;
  }

  /// Reads `fd` from its start into `parts` with preadv (straight into
  /// them, each byte once); the bytes read, short at the file's end.
  static size_t readFully(int fd, std::vector<ByteSpan> parts) {
    size_t done = 0;
    std::size_t first = 0;
    while (first < parts.size()) {
      std::vector<iovec> vectors;
      for (std::size_t i = first; i < parts.size() && vectors.size() < IOV_MAX;
           ++i)
        if (parts[i].size)
          vectors.push_back({parts[i].data, parts[i].size});
      if (vectors.empty())
        break;
      ssize_t n =
          ::preadv(fd, vectors.data(), int(vectors.size()), off_t(done));
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        break;
      done += size_t(n);
      // Past the parts read whole; into the one read in part.
      for (size_t left = size_t(n); first < parts.size() && left > 0;) {
        const size_t taken = std::min(left, parts[first].size);
        parts[first].data += taken;
        parts[first].size -= taken;
        left -= taken;
        if (parts[first].size == 0)
          ++first;
      }
      while (first < parts.size() && parts[first].size == 0)
        ++first;
    }
    return done;
  }

  std::string url_;
  fs::path root_;
  std::atomic<uint64_t> counter_{0};
  const int64_t capacityBytes_;
  std::atomic<int64_t> bytes_{0};
  std::mutex evicting_;
};

} // namespace

StatusOr<std::unique_ptr<Tier>> openFileTier(TierUrl &url) {
  KVC_ASSIGN_OR_RETURN(capacityMb, url.number("capacity_mb", 0));
  const std::string &dir = url.location;
  if (dir.empty() || dir[0] != '/')
    return invalidArgument(url.url + ": file URLs need an absolute path, as "
                                     "file:///tmp/kv");
  std::error_code error;
  if (url.access == TierAccess::Existing) {
    if (!fs::is_directory(dir, error))
      return notFound(url.url + ": no store at " + dir +
                      " (a file:// store is a directory a save created)");
  } else {
    // The directory is made by the first write, so a save refused before
    // it writes leaves nothing behind; what must exist is a writable place
    // to make it.
    fs::path existing = fs::path(dir);
    while (!fs::exists(existing, error) && existing.has_parent_path() &&
           existing != existing.parent_path())
      existing = existing.parent_path();
    if (!fs::is_directory(existing, error) ||
        ::access(existing.c_str(), W_OK | X_OK) != 0)
      return chunkError(ChunkFault::Unavailable,
                        existing == fs::path(dir)
                            ? url.url + ": " + dir + " is not writable"
                            : url.url + ": cannot create " + dir + ": " +
                                  existing.string() +
                                  " is no writable directory");
  }
  auto file = std::make_unique<FileTier>(url.url, fs::path(dir),
                                         int64_t(capacityMb * (1 << 20)));
  file->removeStaleTemporaries();
  return std::unique_ptr<Tier>(std::move(file));
}

} // namespace kvc

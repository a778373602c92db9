//===- Tier.h - Storage tiers behind one interface --------------*- C++ -*-===//
//
// A tier stores opaque objects by name: host DRAM (`mem://`, capacity-bounded
// LRU), local disk (`file:///DIR`, atomic writes through a temporary file and
// rename), or a Redis server (`redis://HOST:PORT[/DB]`, binary-safe,
// pipelined reads, timeouts). Any URL may end in `?gbps=N` to throttle the
// tier to N gigabits per second (shared by all its users), as the Cake paper
// emulated 7-100 Gbps links; `mem://` also takes `capacity_mb=N` and
// `from=DIR` (filled at open with the objects of the file store at DIR, as a
// server warms its DRAM tier from disk). A URL's scheme picks what opens it
// (TierScheme: the built-in ones above and redis-cluster://; a new tier
// registers its own with registerTierScheme). Tiers are safe to use from
// many threads. Errors are values: an unreachable server is Unavailable
// (ChunkFault::Unavailable), a missing object NotFound.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_STORE_TIER_H
#define KVC_RUNTIME_STORE_TIER_H

#include "kvc/Runtime/Base/ByteSpan.h"
#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Desc/TargetDesc.h"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvc {

class Tier {
public:
  virtual ~Tier();

  /// "file:///tmp/kv", for messages.
  virtual const std::string &url() const = 0;

  /// Stores `bytes` under `name`, replacing what was there; readers never
  /// see a partial object.
  virtual Status put(const std::string &name, std::string_view bytes) = 0;
  /// Reads `name` into `buffer` (reusing its capacity).
  virtual Status get(const std::string &name, std::string &buffer) = 0;
  /// Reads `name` into `parts`, one after another, when the object's size
  /// is their total, and returns its size; when that differs, what `parts`
  /// hold is unspecified (the caller reads the object with get() to say
  /// why). Lets a reader put a stored object's payload where it is used,
  /// its header elsewhere. Tiers that readInPlace() copy each byte once,
  /// into `parts`; the others read with get() and copy from there.
  virtual StatusOr<size_t> getInto(const std::string &name,
                                   const std::vector<ByteSpan> &parts);
  /// Whether getInto() copies each byte once (a file's preadv, a memory
  /// tier's memcpy) rather than through get()'s buffer.
  virtual bool readsInPlace() const { return false; }
  /// Reads several objects, pipelined where the tier can; one Status each.
  virtual std::vector<Status> getMany(const std::vector<std::string> &names,
                                      std::vector<std::string> &buffers);
  virtual StatusOr<bool> exists(const std::string &name) = 0;
  /// Removes `name`; removing an object that is not there is no error.
  virtual Status remove(const std::string &name) = 0;
  /// Names starting with `prefix`, sorted.
  virtual StatusOr<std::vector<std::string>> list(const std::string &prefix) = 0;
  /// The bandwidth a `?gbps=N` throttle holds transfers to, in GB/s; 0 when
  /// the tier is not throttled.
  virtual double throttleGBs() const { return 0; }
  /// Whether a part of the tier is known not to answer now (a cluster's
  /// node that failed its last command, held down for a second); the tier
  /// is not asked.
  virtual bool partlyDown() { return false; }
  /// While partlyDown(): whether the part that holds `name` answers, as far
  /// as the tier knows without asking (what a decision may price as
  /// loadable).
  virtual bool answers(const std::string &name) {
    (void)name;
    return true;
  }
};

/// A tier that passes every call to another: the base of tiers that change
/// one behaviour of a store (a throttle; tests' delays and gates). getInto()
/// is not passed on: it reads through get(), so that a tier that changes
/// get() (checks a seal, delays, fails) changes it too, unless it says how
/// its getInto() keeps its behaviour.
class ForwardingTier : public Tier {
public:
  explicit ForwardingTier(std::shared_ptr<Tier> inner)
      : inner_(std::move(inner)) {}

  const std::string &url() const override { return inner_->url(); }
  Status put(const std::string &name, std::string_view bytes) override {
    return inner_->put(name, bytes);
  }
  Status get(const std::string &name, std::string &buffer) override {
    return inner_->get(name, buffer);
  }
  std::vector<Status> getMany(const std::vector<std::string> &names,
                              std::vector<std::string> &buffers) override {
    return inner_->getMany(names, buffers);
  }
  StatusOr<bool> exists(const std::string &name) override {
    return inner_->exists(name);
  }
  Status remove(const std::string &name) override {
    return inner_->remove(name);
  }
  StatusOr<std::vector<std::string>> list(const std::string &prefix) override {
    return inner_->list(prefix);
  }
  double throttleGBs() const override { return inner_->throttleGBs(); }
  bool partlyDown() override { return inner_->partlyDown(); }
  bool answers(const std::string &name) override {
    return inner_->answers(name);
  }

protected:
  Tier &inner() { return *inner_; }
  const Tier &inner() const { return *inner_; }

private:
  std::shared_ptr<Tier> inner_;
};

/// Whether opening a tier may create it: a save's first write creates a
/// file:// store's directory (opening checks that it can); reading from one
/// that does not exist is an error (a mistyped path would otherwise read as
/// a store that holds nothing).
enum class TierAccess { Create, Existing };

/// A store URL taken apart for the scheme that opens it: "SCHEME://
/// [USER[:PASSWORD]@]LOCATION[?OPTIONS]".
struct TierUrl {
  std::string url;            ///< The URL without credentials, for messages.
  std::string location;       ///< "/tmp/kv", "127.0.0.1:6379/0".
  std::string user, password; ///< For a scheme that takes credentials.
  TierAccess access = TierAccess::Create;
  /// The query's options the scheme has not taken yet.
  std::map<std::string, std::string> options;

  /// Takes option `key`: its value, or none.
  std::optional<std::string> take(const std::string &key);
  /// Takes option `key`, a positive number; `fallback` when absent.
  StatusOr<double> number(const std::string &key, double fallback);
};

/// What opens the URLs of one scheme. The built-in ones: mem, file, redis,
/// redis-cluster; a new tier registers its own (registerTierScheme).
struct TierScheme {
  std::string scheme;  ///< "file", as in file:///tmp/kv.
  TierDesc::Kind kind; ///< The kind of target tier it is priced as.
  std::string form;    ///< "file:///DIR", for messages.
  /// The options it takes (besides every scheme's gbps and key_file); any
  /// other is refused before it opens.
  std::vector<std::string> options;
  /// Whether "USER[:PASSWORD]@" before the location are credentials
  /// (kept out of every message and tier name).
  bool credentials = false;
  /// Opens `url`, taking its options from it.
  std::function<StatusOr<std::unique_ptr<Tier>>(TierUrl &url)> open;
};

/// Adds `scheme` to those openTier knows (replacing one of its name).
void registerTierScheme(TierScheme scheme);
/// The scheme that opens `url`; InvalidArgument, naming those known, for
/// none.
StatusOr<TierScheme> tierSchemeOf(const std::string &url);

/// Opens the tier a URL names, by its scheme (tierSchemeOf); a `?gbps=N`
/// throttle and a `key_file` seal hold for every scheme.
StatusOr<std::unique_ptr<Tier>>
openTier(const std::string &url, TierAccess access = TierAccess::Create);

/// `inner` behind a link of `gbps` gigabits per second (what a URL's
/// `?gbps=` query opens), reporting `url`: transfers share the link's
/// timeline, and each takes the longer of its time on the link and the
/// inner tier's own work.
std::unique_ptr<Tier> throttleTier(std::unique_ptr<Tier> inner, double gbps,
                                   std::string url);

} // namespace kvc

#endif // KVC_RUNTIME_STORE_TIER_H

// HMAC-SHA256 leases (Nettle); see lease.hpp.
#include <machina/errors.hpp>
#include <machina/lease.hpp>

#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <sys/random.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <vector>

namespace machina {
namespace {

constexpr std::string_view kPrefix = "mlt1";

std::string to_hex(const unsigned char* p, std::size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(n * 2, '0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[p[i] >> 4];
    out[2 * i + 1] = kHex[p[i] & 15];
  }
  return out;
}

bool from_hex(std::string_view hex, std::string& out) {
  if (hex.size() % 2 != 0) return false;
  out.clear();
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

bool is_hex(std::string_view s, std::size_t len) {
  if (s.size() != len) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

/// Creates the ledger folder (and missing parents) private to this user, and refuses
/// one that another user owns or others may write to: they could pre-empt or erase
/// the record of a used lease.
void prepare_ledger(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::string path;
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    path = dir.substr(0, pos);
    if (path.empty()) continue;
    if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
      throw ConfigError("cannot create lease ledger " + dir + ": " + std::strerror(errno));
  }
  struct stat st{};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw ConfigError("lease ledger " + dir + " is not a directory");
  if (st.st_uid != geteuid() || (st.st_mode & 022) != 0)
    throw ConfigError("lease ledger " + dir + " must be owned by this user and not writable by group or others");
  // Whoever controls the parent can rename the ledger away and so reset it: the parent
  // must be this user's or root's, and shared only with the sticky bit (as /tmp is).
  const std::string parent = dir.substr(0, dir.find_last_of('/') == 0 ? 1 : dir.find_last_of('/'));
  struct stat up{};
  if (!parent.empty() && stat(parent.c_str(), &up) == 0) {
    const bool owner_ok = up.st_uid == geteuid() || up.st_uid == 0;
    const bool shared_ok = (up.st_mode & 022) == 0 || (up.st_mode & S_ISVTX) != 0;
    if (!owner_ok || !shared_ok)
      throw ConfigError("lease ledger " + dir +
                        ": its parent folder must belong to this user or root and not be "
                        "writable by group or others (unless sticky)");
  }
}

}  // namespace

std::int64_t lease_ttl_ms(double seconds, std::int64_t max_ttl_ms) {
  const double ms = seconds * 1000.0;
  if (!std::isfinite(ms) || ms < 1.0 || ms > static_cast<double>(max_ttl_ms))
    throw ConfigError("lease ttl must be between 0.001 s and " + std::to_string(max_ttl_ms / 1000) + " s");
  return static_cast<std::int64_t>(ms);
}

namespace {

std::mutex g_secret_mu;
std::optional<std::string> g_secret;  // taken out of the environment by protect_lease_secret(true)

std::string read_secret() {
  std::string secret;
  if (const char* env = std::getenv("MACHINA_LEASE_SECRET"); env != nullptr && *env != '\0') {
    secret = env;
  } else if (g_secret) {
    secret = *g_secret;
  } else if (const char* file = std::getenv("MACHINA_LEASE_KEY_FILE"); file != nullptr && *file != '\0') {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw ConfigError(std::string("cannot read lease key file ") + file + ": " + std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    secret = ss.str();
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  } else {
    throw ConfigError("no lease secret: set MACHINA_LEASE_SECRET or MACHINA_LEASE_KEY_FILE");
  }
  if (secret.size() < 16) throw ConfigError("the lease secret must be at least 16 bytes long");
  return secret;
}

/// Overwrites the value of every `name=` string in the environment block this process
/// started with: its bounds are fields 50 and 51 of /proc/self/stat.
void wipe_from_initial_environment(std::string_view name) {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  std::uintptr_t start = 0, end = 0;
  for (int i = 3; fields >> field; ++i) {  // field 3 is the first after the command name
    if (i == 50) start = std::stoull(field);
    if (i == 51) end = std::stoull(field);
  }
  if (start == 0 || end <= start) return;
  char* p = reinterpret_cast<char*>(start);
  char* const stop = reinterpret_cast<char*>(end);
  while (p < stop) {
    const std::size_t len = strnlen(p, static_cast<std::size_t>(stop - p));
    if (len > name.size() && std::string_view(p, name.size()) == name && p[name.size()] == '=') {
      std::memset(p + name.size() + 1, 0, len - name.size() - 1);
    }
    p += len + 1;
  }
}

void protect_locked(bool unset) {
  const char* env = std::getenv("MACHINA_LEASE_SECRET");
  if (env == nullptr) return;
  if (unset) {
    g_secret = std::string(env);
    ::unsetenv("MACHINA_LEASE_SECRET");
  } else {
    // The variable stays, as a copy of the C library's own, for the program's children.
    const std::string value(env);
    ::setenv("MACHINA_LEASE_SECRET", value.c_str(), 1);
  }
  wipe_from_initial_environment("MACHINA_LEASE_SECRET");
}

}  // namespace

std::string load_lease_secret() {
  std::lock_guard lock(g_secret_mu);
  protect_locked(/*unset=*/false);
  return read_secret();
}

void protect_lease_secret(bool unset) {
  std::lock_guard lock(g_secret_mu);
  protect_locked(unset);
}

LeaseAuthority::LeaseAuthority(std::string secret, Options options)
    : secret_(std::move(secret)), options_(std::move(options)) {
  if (secret_.size() < 16) throw ConfigError("the lease secret must be at least 16 bytes long");
  if (options_.ledger_bucket_ms < 1) throw ConfigError("the lease ledger's window must be at least 1 ms");
  if (!options_.ledger_dir.empty()) prepare_ledger(options_.ledger_dir);
}

std::string LeaseAuthority::mac_hex(std::string_view payload) const {
  hmac_sha256_ctx ctx;
  hmac_sha256_set_key(&ctx, secret_.size(), reinterpret_cast<const std::uint8_t*>(secret_.data()));
  hmac_sha256_update(&ctx, payload.size(), reinterpret_cast<const std::uint8_t*>(payload.data()));
  unsigned char mac[SHA256_DIGEST_SIZE];
  hmac_sha256_digest(&ctx, sizeof mac, mac);
  return to_hex(mac, sizeof mac);
}

std::string LeaseAuthority::issue(std::string_view aid, std::int64_t ttl_ms, std::int64_t now_ms) const {
  if (aid.empty()) throw ConfigError("a lease needs an aid");
  if (ttl_ms <= 0 || ttl_ms > options_.max_ttl_ms)
    throw ConfigError("lease ttl must be between 1 ms and " + std::to_string(options_.max_ttl_ms / 1000) + " s");
  unsigned char nonce[16];
  if (getrandom(nonce, sizeof nonce, 0) != static_cast<ssize_t>(sizeof nonce))
    throw ConfigError("no randomness for a lease nonce");
  std::string payload(kPrefix);
  payload += '.';
  payload += to_hex(reinterpret_cast<const unsigned char*>(aid.data()), aid.size());
  payload += '.';
  payload += std::to_string(now_ms + ttl_ms);
  payload += '.';
  payload += to_hex(nonce, sizeof nonce);
  return payload + "." + mac_hex(payload);
}

std::optional<std::string> LeaseAuthority::redeem(std::string_view token, std::string_view aid, std::int64_t now_ms) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (parts.size() < 6) {
    const std::size_t dot = token.find('.', start);
    parts.push_back(token.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  std::string lease_aid;
  std::int64_t expires_at = 0;
  if (parts.size() != 5 || parts[0] != kPrefix || parts[1].empty() || !from_hex(parts[1], lease_aid) ||
      !is_hex(parts[3], 32) || !is_hex(parts[4], 64)) {
    return "malformed";
  }
  const auto [end, ec] = std::from_chars(parts[2].data(), parts[2].data() + parts[2].size(), expires_at);
  if (ec != std::errc() || end != parts[2].data() + parts[2].size()) return "malformed";

  const std::string_view payload = token.substr(0, token.size() - 65);
  const std::string expected = mac_hex(payload);
  if (!memeql_sec(expected.data(), parts[4].data(), expected.size())) return "bad_signature";  // constant time
  if (lease_aid != aid) return "wrong_tool";
  // No issuer mints leases longer than max_ttl; a longer one would also pin its ledger
  // entry for that long.
  if (expires_at > now_ms + options_.max_ttl_ms) return "malformed";
  if (expires_at <= now_ms) return "expired";
  const std::string nonce(parts[3]);
  std::lock_guard lock(mu_);
  if (consumed_.count(nonce) != 0) return "consumed";
  if (!consume(nonce, expires_at, now_ms)) return "replay_cache_full";
  if (!options_.ledger_dir.empty()) {
    if (auto why = consume_in_ledger(nonce, expires_at, now_ms)) return why;
  }
  return std::nullopt;
}

bool LeaseAuthority::consume(const std::string& nonce, std::int64_t expires_at, std::int64_t now_ms) {
  // Forget leases that have expired: they are refused as expired from now on anyway.
  while (!by_expiry_.empty() && by_expiry_.begin()->first <= now_ms) {
    consumed_.erase(by_expiry_.begin()->second);
    by_expiry_.erase(by_expiry_.begin());
  }
  if (consumed_.size() >= options_.max_consumed) return false;
  consumed_.insert(nonce);
  by_expiry_.emplace(expires_at, nonce);
  return true;
}

void LeaseAuthority::sweep_ledger(std::int64_t now_ms) {
  // A window is swept a whole window after it ended: a process that checked a lease's
  // expiry just before it passed still finds the window there when it writes the file.
  const std::int64_t window = options_.ledger_bucket_ms;
  const std::int64_t current = now_ms / window;
  if (current <= swept_bucket_) return;
  swept_bucket_ = current;
  DIR* dir = opendir(options_.ledger_dir.c_str());
  if (dir == nullptr) return;
  std::vector<std::string> gone;
  while (dirent* ent = readdir(dir)) {
    const char* name = ent->d_name;
    std::int64_t n = 0;
    if (name[0] == 'b') {
      const auto [end, ec] = std::from_chars(name + 1, name + std::strlen(name), n);
      if (ec == std::errc() && *end == '\0' && (n + 2) * window <= now_ms) gone.emplace_back(name);
    } else {
      // A file from before windows ("<expiry>-<nonce>"): removed once expired.
      const auto [end, ec] = std::from_chars(name, name + std::strlen(name), n);
      if (ec == std::errc() && *end == '-' && n <= now_ms) unlinkat(dirfd(dir), name, 0);
    }
  }
  for (const auto& name : gone) {
    const int fd = openat(dirfd(dir), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    if (DIR* bucket = fdopendir(fd)) {
      while (dirent* ent = readdir(bucket)) {
        if (std::strcmp(ent->d_name, ".") != 0 && std::strcmp(ent->d_name, "..") != 0) unlinkat(fd, ent->d_name, 0);
      }
      closedir(bucket);
    } else {
      close(fd);
    }
    unlinkat(dirfd(dir), name.c_str(), AT_REMOVEDIR);
  }
  closedir(dir);
}

std::optional<std::string> LeaseAuthority::consume_in_ledger(const std::string& nonce, std::int64_t expires_at,
                                                             std::int64_t now_ms) {
  // One file per used lease, in the folder of its expiry window; O_EXCL makes use-once
  // atomic across every process sharing the ledger.
  sweep_ledger(now_ms);
  const std::string bucket = options_.ledger_dir + "/b" + std::to_string(expires_at / options_.ledger_bucket_ms);
  const std::string path = bucket + "/" + nonce;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (mkdir(bucket.c_str(), 0700) != 0 && errno != EEXIST) return "ledger_unavailable";  // fail closed
    const int fd = open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      close(fd);
      return std::nullopt;
    }
    if (errno == EEXIST) return "consumed";
    if (errno != ENOENT) break;  // (ENOENT: the window was swept meanwhile; made again once)
  }
  return "ledger_unavailable";
}

}  // namespace machina

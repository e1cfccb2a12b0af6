// The audit log's writer (its thread's side): the SQLite database, the JSON lines file and
// the names and digests it has seen. audit_writer.cpp holds a pass over the records,
// audit_db_writer.cpp the database, audit_jsonl.cpp the JSON lines file and
// audit_pending.cpp the pending file.
#pragma once

#include "audit_record.hpp"

#include <machina/audit.hpp>
#include <machina/errors.hpp>
#include <machina/sqlite_db.hpp>

#include <fcntl.h>
#include <sys/stat.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace machina {
namespace audit_detail {

/// The error type of a kind (error_kinds.def); "" for success.
inline std::string_view error_type(ErrorKind kind) {
  return error_info(kind).error_type;
}

/// Opens (making it if need be) a file of the store readable and writable by its owner
/// only, whatever the umask and whatever mode an existing one had.
inline int open_owner_only(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) (void)::fchmod(fd, 0600);
  return fd;
}

}  // namespace audit_detail

/// The writer thread's side: the database, the JSON lines file, the names it has seen.
class AuditLog::Writer {
 public:
  explicit Writer(const AuditOptions& options);
  ~Writer();
  /// Writes the records in `chunks` (each a run of RecordHead + bytes) in one transaction;
  /// returns how many, and in `ok` whether all of them were written.
  /// `ticks` turns the ticks the records were stamped with into the steady clock.
  std::size_t write(const std::vector<const AuditBytes*>& chunks, const TickLine& ticks, bool& ok);
  /// A write of its own (nothing was waiting): whether the store can record again. The
  /// database gets a row of `meta` rewritten; the JSON lines file gets room for a pass's
  /// lines, taken and given back.
  bool probe();
  static std::size_t count_records(const AuditBytes& chunk);
  /// Takes the records of the pending file into the database (in one transaction), then
  /// empties the file. Writers of the file hold a shared lock on it for each append.
  void take_in_pending();

 private:
  /// One record, read in place from a thread's buffer.
  struct Call {
    audit_detail::RecordHead head{};
    std::string_view front, aid, user, input;
    std::int64_t ts_ms = 0, duration_us = 0;

    bool same_but_input(const Call& o) const {
      return head.kind == o.head.kind && head.flags == o.head.flags && aid == o.aid && front == o.front &&
             user == o.user;
    }
    bool same_call(const Call& o) const { return same_but_input(o) && input == o.input; }
  };

  /// The calls of one shape in this pass, as the JSON text of a `batches` row.
  struct Batch {
    std::int64_t shape = 0, base_ms = 0, min_ms = 0, max_ms = 0;
    std::int64_t n = 0;
    std::string calls;  // "[[ts_ms - base_ms, duration_us, input_bytes, output_bytes], ..."
  };

  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  /// Ids of names (tools, users) and digests already in the database, bounded: past the
  /// bound the cache starts again (the tables keep everything).
  using Ids = std::unordered_map<std::string, std::int64_t, Hash, std::equal_to<>>;

  /// The digest of an input into args_/path_, remembered for short inputs seen again (in
  /// a table of fixed slots whose strings keep their memory: nothing is allocated once warm).
  void digest(std::string_view input, bool cut);
  void open_db();
  void open_jsonl();
  void forget_ids();
  std::int64_t name_id(const char* table, Ids& cache, std::string_view name);
  std::int64_t args_id();
  std::int64_t shape_id(const Call& c);
  /// The number the next call written gets (inside the write transaction: hosts sharing
  /// the store number on from each other).
  std::int64_t next_call_id();
  /// The open batch of a shape (a new one if it has none in this pass).
  std::size_t batch_for(std::int64_t shape);
  void add(Batch& b, const Call& c);
  void put_batch(Batch& b);
  /// Writes every open batch, in the order their first calls came.
  void put_batches();
  void prune();
  /// Appends a call's line to jsonl_text_ (the file is rotated before it would grow past
  /// its bound).
  void jsonl_line(const Call& c);
  /// Appends `text` (whole lines) to the JSON lines file. A write that fails leaves the file
  /// as it was (no part of a line), the lines lost and jsonl_failed_ set.
  void put_jsonl(std::string& text);
  void rotate_jsonl();
  /// This process's OS user's name ("uid:N" when /etc/passwd names none), looked up once.
  /// The passwd file is read directly: a statically linked program cannot load the name
  /// service's other sources (getpwuid would try), and an audit record needs no more.
  std::string_view os_user();
  void complain(const std::string& what);

  const AuditOptions& options_;
  sql::Db db_;
  sql::Stmt probe_, insert_batch_, last_batch_, expire_, drop_old_, trim_, orphan_shapes_, orphan_args_, add_args_,
      find_args_, add_shape_, find_shape_;
  struct Shape {
    std::int64_t tool, front, user, code, args, hit;
    bool operator==(const Shape&) const = default;
  };
  struct ShapeHash {
    std::size_t operator()(const Shape& k) const noexcept {
      std::uint64_t h = 0x9e3779b97f4a7c15ULL;
      for (std::int64_t v : {k.tool, k.front, k.user, k.code, k.args, k.hit}) {
        h = (h ^ static_cast<std::uint64_t>(v)) * 0x100000001b3ULL;
      }
      return static_cast<std::size_t>(h ^ (h >> 29));
    }
  };
  std::unordered_map<Shape, std::int64_t, ShapeHash> shape_ids_;
  std::unordered_map<std::string, sql::Stmt> add_name_, find_name_;
  Ids tool_ids_, user_ids_, front_ids_, args_ids_;
  static constexpr std::size_t kMaxCachedInput = 256;
  struct DigestSlot {
    bool used = false;
    std::string input, args, path;
  };
  std::vector<DigestSlot> digests_ = std::vector<DigestSlot>(4096);
  std::string args_, path_;                 // the digest of the current call's input, and its path
  std::string shape_args_;                  // the digest batch_'s shape was found for
  std::vector<std::int64_t> code_by_kind_;  // codes.id by ErrorKind
  std::vector<Batch> batches_;              // [0, open_batches_) are open (the rest keep their memory)
  std::size_t open_batches_ = 0, batch_ = 0;
  std::unordered_map<std::int64_t, std::size_t> batch_of_shape_;
  std::int64_t next_call_ = 1;
  std::string jsonl_text_, jsonl_line_;
  std::size_t since_prune_ = 0;
  std::chrono::steady_clock::time_point last_prune_{}, last_complaint_{};
  int jsonl_ = -1;             // the JSON lines file
  bool jsonl_failed_ = false;  // a write to it failed in this pass
  std::uint64_t jsonl_bytes_ = 0;
  std::string os_user_;
};

}  // namespace machina

// code.search's index of one root (docs/tool-packs.md, "code.search"): a SQLite database
// in the policy's index_dir with an FTS5 table of the root's files cut into chunks of
// lines, brought up to date before every search (new and changed files read, removed
// ones dropped, the rest not read), then searched by BM25.
#pragma once

#include "packs.hpp"

#include <machina/sqlite_db.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace machina::packs {

/// What one refresh did (summed over the roots of a search).
struct IndexCounts {
  std::uint64_t files = 0;       // text files in the index after the refresh
  std::uint64_t indexed = 0;     // read and (re)indexed by this refresh
  std::uint64_t unchanged = 0;   // as they were (size, mtime and inode): not read again
  std::uint64_t removed = 0;     // dropped: gone, ignored, denied or no longer readable
  std::uint64_t skipped = 0;     // not indexed: binary, a link, a FIFO, more than one hard link ...
  std::uint64_t pending = 0;     // new or changed, left for a later refresh (max_refresh_bytes)
  std::uint64_t over_cap = 0;    // not indexed: past max_index_bytes
  bool more_files = false;       // the root holds more than max_index_files files
  std::uint64_t bytes_read = 0;  // of files read by this refresh
  bool truncated() const { return pending > 0 || over_cap > 0 || more_files; }
};

/// One chunk found: where, how well, and (once described) its best line.
struct Hit {
  double bm25 = 0;        // FTS5's bm25() (negative; lower is better)
  std::size_t index = 0;  // which of the searched indexes
  std::int64_t rowid = 0;
  std::string path;  // beneath its root
  std::int64_t first_line = 0, last_line = 0;
  std::int64_t line = 0;
  std::string snippet;
};

class CodeIndex {
 public:
  CodeIndex();
  ~CodeIndex();
  CodeIndex(CodeIndex&&) noexcept;
  CodeIndex& operator=(CodeIndex&&) noexcept;

  /// Opens the index of `root` (made on first use) and brings it up to date with the
  /// files, one refresh at a time per index (across processes). A refusal, a timeout or a
  /// cancellation comes back as a Result that is not ok; `counts` says what was done.
  Result open_fresh(const Call& c, const std::string& root, const std::string& rg, IndexCounts& counts);

  /// The best `limit` chunks for an FTS5 MATCH expression, best first (`index` set to `which`).
  std::vector<Hit> search(const std::string& match, std::size_t limit, std::size_t which);
  /// A hit's path, line range, best line and snippet; false when its chunk is gone.
  bool describe(Hit& hit, const std::string& match);

  /// Whether the call's deadline or its cancellation interrupted SQLite.
  bool stopped() const;

 private:
  struct Stop;
  std::unique_ptr<Stop> stop_;
  sql::Db db_;
};

/// Whether a handler's Result is a success.
inline bool ok(const Result& r) {
  return r.kind == ErrorKind::none && r.ending == RunOutcome::Ending::ran;
}

}  // namespace machina::packs

// code.search: ranked search over an index of the caller's roots, or of a codebase the
// policy grants the caller (docs/tool-packs.md, "code.search"). Every search first brings
// the index up to date (code_index.hpp), then asks FTS5 for the best chunks by BM25, and
// answers each with its best line. The caller's words never reach FTS5 as syntax
// (code_search_text.hpp).
#include "code_index.hpp"

#include <machina/code_search_text.hpp>
#include <machina/workspace.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>

namespace machina::packs {
namespace {

using json = nlohmann::json;

constexpr std::int64_t kDefaultLimit = 10;
constexpr std::int64_t kMaxLimit = 100;
constexpr std::size_t kMaxCodebaseId = 256;

}  // namespace

Result code_search(const Call& c) {
  // The request.
  const json& q = c.input.at("query");
  if (!q.is_string()) return invalid("query must be a string");
  const std::string& query = q.get_ref<const std::string&>();
  if (query.size() > code_search::kMaxQueryBytes) {
    return invalid("query is " + std::to_string(query.size()) + " bytes, over the limit of " +
                   std::to_string(code_search::kMaxQueryBytes));
  }
  if (query.find('\0') != std::string::npos) return invalid("query must not contain a NUL character");
  const auto words = code_search::query_words(query);
  if (words.empty()) return invalid("query must hold at least one word");
  if (words.size() > code_search::kMaxQueryWords) {
    return invalid("query has more than " + std::to_string(code_search::kMaxQueryWords) + " words");
  }
  std::int64_t limit = kDefaultLimit;
  if (auto it = c.input.find("limit"); it != c.input.end() && !it->is_null()) {
    const double d = it->is_number() ? it->get<double>() : 0;
    if (!(d >= 1 && d <= kMaxLimit) || std::trunc(d) != d) {
      return invalid("limit must be a whole number from 1 to " + std::to_string(kMaxLimit));
    }
    limit = static_cast<std::int64_t>(d);
  }
  std::string codebase;
  bool by_codebase = false;
  if (auto it = c.input.find("codebase_id"); it != c.input.end() && !it->is_null()) {
    if (!it->is_string() || it->get_ref<const std::string&>().empty() ||
        it->get_ref<const std::string&>().size() > kMaxCodebaseId) {
      return invalid("codebase_id must be a string of 1 to " + std::to_string(kMaxCodebaseId) + " bytes");
    }
    codebase = it->get<std::string>();
    by_codebase = true;
  }

  // Where: a codebase the caller is granted (an unknown one and one not granted are refused
  // alike, so a caller cannot learn which ids exist), or the caller's roots.
  std::string why;
  std::vector<std::string> roots;
  if (by_codebase) {
    const std::vector<std::string>* granted = c.policy.codebases_for(c.user, why);
    if (granted == nullptr) return denied(why);
    auto known = c.policy.codebases.find(codebase);
    if (known == c.policy.codebases.end() || std::find(granted->begin(), granted->end(), codebase) == granted->end()) {
      return denied("codebase '" + excerpt(codebase) + "' is not available to this caller");
    }
    struct stat st{};
    if (::stat(known->second.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return missing("codebase '" + excerpt(codebase) + "': its directory is missing");
    }
    roots.push_back(known->second);
  } else {
    const std::vector<std::string>* mine = c.policy.roots_for(c.user, why);
    if (mine == nullptr) return denied(why);
    roots = *mine;
  }
  if (!c.policy.code.index_dir_conflict.empty()) return system_error(c.policy.code.index_dir_conflict);
  const std::string rg = find_rg(c.policy, c.executable);
  if (rg.empty()) return ripgrep_missing();

  // Each index brought up to date, then searched; the best chunks of all, best first.
  IndexCounts counts;
  std::vector<CodeIndex> indexes(roots.size());
  for (std::size_t i = 0; i < roots.size(); ++i) {
    Result r = indexes[i].open_fresh(c, roots[i], rg, counts);
    if (!ok(r)) return r;
  }
  const std::string match = code_search::fts_query(query);
  std::vector<Hit> hits;
  std::size_t at = 0;
  try {
    for (std::size_t i = 0; i < indexes.size(); ++i) {
      at = i;
      auto found = indexes[i].search(match, static_cast<std::size_t>(limit), i);
      hits.insert(hits.end(), std::make_move_iterator(found.begin()), std::make_move_iterator(found.end()));
    }
    std::stable_sort(hits.begin(), hits.end(), [](const Hit& a, const Hit& b) { return a.bm25 < b.bm25; });
    if (hits.size() > static_cast<std::size_t>(limit)) hits.resize(static_cast<std::size_t>(limit));
    std::vector<Hit> described;
    for (auto& h : hits) {
      at = h.index;
      if (indexes[h.index].describe(h, match)) described.push_back(std::move(h));
    }
    hits = std::move(described);
  } catch (const sql::Error& e) {
    if (indexes[at].stopped()) {
      if (c.spec.cancel != nullptr && c.spec.cancel->cancelled()) return Result::stopped(RunOutcome::Ending::cancelled);
      return Result::stopped(RunOutcome::Ending::timed_out, "the search ran past its deadline (searching the index)");
    }
    return system_error(std::string("the search index: ") + e.what());
  }

  // The answer: paths beneath a codebase's root, or as the file tools take them (beneath
  // the first root, else absolute).
  json results = json::array();
  for (const auto& h : hits) {
    std::vector<std::string> parts;
    if (!workspace::split(h.path, parts, why) || denied_by_name(c.policy, parts)) continue;  // (never indexed)
    std::string path = by_codebase || h.index == 0 ? h.path : roots[h.index] + "/" + h.path;
    json one = {{"path", std::move(path)},
                {"line", h.line},
                {"snippet", h.snippet},
                {"similarity", code_search::similarity(h.bm25)}};
    if (c.shape == Shape::detailed) {
      one["score"] = -h.bm25;
      one["first_line"] = h.first_line;
      one["last_line"] = h.last_line;
    }
    results.push_back(std::move(one));
  }
  if (c.shape == Shape::service) return Result::ok(std::move(results));
  return Result::ok({{"results", std::move(results)},
                     {"truncated", counts.truncated()},
                     {"codebase_id", by_codebase ? json(codebase) : json(nullptr)},
                     {"index",
                      {{"files", counts.files},
                       {"indexed", counts.indexed},
                       {"unchanged", counts.unchanged},
                       {"removed", counts.removed},
                       {"skipped", counts.skipped},
                       {"pending", counts.pending},
                       {"over_cap", counts.over_cap},
                       {"more_files", counts.more_files},
                       {"bytes_read", counts.bytes_read}}}});
}

}  // namespace machina::packs

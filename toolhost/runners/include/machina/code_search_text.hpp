// The text side of code.search (docs/tool-packs.md, "code.search"): how a file is cut into
// chunks of lines for its SQLite FTS5 index, the identifier parts indexed beside each
// line, a caller's words turned into an FTS5 query that holds no operator of theirs, the
// best line of a hit chunk, and the similarity a BM25 score is shown as. Pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace machina::code_search {

inline constexpr std::size_t kChunkLines = 30;        // lines in a chunk (the last one of a file may hold fewer)
inline constexpr std::size_t kMaxIndexedLine = 2000;  // bytes of a line that are indexed (the rest is not)
inline constexpr std::size_t kMaxSnippet = 500;       // bytes of a snippet
inline constexpr std::size_t kMaxQueryBytes = 1000;
inline constexpr std::size_t kMaxQueryWords = 32;
inline constexpr double kHalfScore = 10;  // the BM25 score shown as similarity 0.5
inline constexpr char kHitOpen = '\x01';  // around hits in FTS5's highlight() of a chunk
inline constexpr char kHitClose = '\x02';

struct Chunk {
  std::size_t first_line = 1;  // 1-based
  std::size_t lines = 0;
  std::string text;    // its lines, '\n' between them (each cut to kMaxIndexedLine bytes)
  std::string idents;  // a line for each of its lines: the parts of that line's camelCase identifiers
};

/// The parts of an identifier, lowercase, cut at underscores, digits-to-letters and case
/// changes: "parseHTTPRequest" -> parse, http, request; "get_user_name" -> get, user,
/// name; "utf8Decode" -> utf8, decode. Only ASCII letters, digits and '_' are looked at
/// (anything else cuts too).
std::vector<std::string> identifier_parts(std::string_view word);

/// The parts of the identifiers in `line` that have a case change inside them (camelCase,
/// PascalCase), space-separated ("" when none has): what the index's second column holds
/// for that line. Words split by '_' need nothing here (the tokenizer cuts at '_' already).
std::string line_idents(std::string_view line);

/// A file's text cut into chunks of kChunkLines lines ('\n' ends a line, a '\r' before it
/// is dropped); chunks with nothing but white space are left out. The bytes that mark hits
/// (kHitOpen, kHitClose) are indexed as spaces.
std::vector<Chunk> chunk_text(std::string_view text);

/// A caller's words (split at white space).
std::vector<std::string> query_words(std::string_view query);

/// The FTS5 MATCH expression for a caller's query: each word a quoted string (its '"'
/// doubled), so that nothing in it is read as FTS5 syntax (no operator, column filter,
/// prefix or NEAR group), or'd with the phrase of its identifier parts when it has a case
/// change in it. Words are or'd: BM25 ranks chunks holding more (and rarer) of them first.
/// At most the first kMaxQueryWords words; "" for a query without words.
std::string fts_query(std::string_view query);

/// A BM25 score as FTS5's bm25() gives it (negative; lower is better) shown as a
/// similarity in (0, 1], higher better: s / (s + kHalfScore) with s = -bm25 (s at least
/// 1e-9). Monotone: a better score never shows a lower similarity.
double similarity(double bm25);

/// The best line (0-based) of a hit chunk, from FTS5's highlight() of its text and of its
/// identifier column (hits between kHitOpen and kHitClose): the line with the most
/// different words hit, the first of them on a tie; 0 when no line has a hit.
std::size_t best_line(std::string_view marked_text, std::string_view marked_idents);

/// The `n`-th line (0-based) of a chunk's text, trimmed of white space at both ends and
/// cut to at most kMaxSnippet bytes (between characters).
std::string snippet(std::string_view text, std::size_t n);

/// UTF-8 text cut to at most `n` bytes, never inside a character.
std::string_view cut_utf8(std::string_view text, std::size_t n);

}  // namespace machina::code_search

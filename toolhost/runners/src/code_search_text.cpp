// See code_search_text.hpp.
#include <machina/code_search_text.hpp>

#include <algorithm>
#include <set>

namespace machina::code_search {
namespace {

bool is_lower(char ch) {
  return ch >= 'a' && ch <= 'z';
}
bool is_upper(char ch) {
  return ch >= 'A' && ch <= 'Z';
}
bool is_digit(char ch) {
  return ch >= '0' && ch <= '9';
}
bool is_alnum(char ch) {
  return is_lower(ch) || is_upper(ch) || is_digit(ch);
}
bool is_word(char ch) {
  return is_alnum(ch) || ch == '_';
}
bool is_space(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

char lower(char ch) {
  return is_upper(ch) ? static_cast<char>(ch - 'A' + 'a') : ch;
}

/// Whether an identifier is cut before position i (within a run of letters and digits).
bool cut_before(std::string_view w, std::size_t i) {
  const char prev = w[i - 1], ch = w[i];
  if ((is_lower(prev) || is_digit(prev)) && is_upper(ch)) return true;              // fooBar, utf8Decode
  return is_upper(prev) && is_upper(ch) && i + 1 < w.size() && is_lower(w[i + 1]);  // HTTPRequest
}

/// Whether a run of letters and digits has a case change inside it.
bool has_case_change(std::string_view w) {
  for (std::size_t i = 1; i < w.size(); ++i) {
    if (is_alnum(w[i - 1]) && is_alnum(w[i]) && cut_before(w, i)) return true;
  }
  return false;
}

/// The identifiers of a text: its runs of ASCII letters, digits and '_'.
template <class Fn>
void for_each_identifier(std::string_view text, Fn&& fn) {
  for (std::size_t at = 0; at < text.size();) {
    if (!is_word(text[at])) {
      ++at;
      continue;
    }
    std::size_t end = at;
    while (end < text.size() && is_word(text[end])) ++end;
    fn(text.substr(at, end - at));
    at = end;
  }
}

std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"')
      out += "\"\"";
    else
      out += ch;
  }
  out += '"';
  return out;
}

}  // namespace

std::string_view cut_utf8(std::string_view text, std::size_t n) {
  if (text.size() <= n) return text;
  std::size_t end = n;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

std::vector<std::string> identifier_parts(std::string_view word) {
  std::vector<std::string> parts;
  std::string part;
  for (std::size_t i = 0; i < word.size(); ++i) {
    const char ch = word[i];
    if (!is_alnum(ch)) {
      if (!part.empty()) parts.push_back(std::move(part));
      part.clear();
      continue;
    }
    if (!part.empty() && cut_before(word, i)) {
      parts.push_back(std::move(part));
      part.clear();
    }
    part += lower(ch);
  }
  if (!part.empty()) parts.push_back(std::move(part));
  return parts;
}

std::string line_idents(std::string_view line) {
  std::string out;
  for_each_identifier(line, [&](std::string_view id) {
    if (!has_case_change(id)) return;
    for (const auto& p : identifier_parts(id)) {
      if (!out.empty()) out += ' ';
      out += p;
    }
  });
  return out;
}

std::vector<Chunk> chunk_text(std::string_view text) {
  std::vector<Chunk> chunks;
  Chunk chunk;
  bool blank = true;
  std::size_t line_no = 0;
  auto flush = [&] {
    if (chunk.lines > 0 && !blank) chunks.push_back(std::move(chunk));
    chunk = Chunk{};
    chunk.first_line = line_no + 1;
    blank = true;
  };
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    const std::size_t next = end == std::string_view::npos ? text.size() : end + 1;
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    line = cut_utf8(line, kMaxIndexedLine);
    if (chunk.lines > 0) {
      chunk.text += '\n';
      chunk.idents += '\n';
    }
    for (char ch : line) {
      chunk.text += ch == kHitOpen || ch == kHitClose ? ' ' : ch;
      if (!is_space(ch)) blank = false;
    }
    chunk.idents += line_idents(line);
    ++chunk.lines;
    ++line_no;
    if (chunk.lines == kChunkLines) flush();
    at = next;
  }
  flush();
  return chunks;
}

std::vector<std::string> query_words(std::string_view query) {
  std::vector<std::string> words;
  for (std::size_t at = 0; at < query.size();) {
    if (is_space(query[at])) {
      ++at;
      continue;
    }
    std::size_t end = at;
    while (end < query.size() && !is_space(query[end])) ++end;
    words.emplace_back(query.substr(at, end - at));
    at = end;
  }
  return words;
}

std::string fts_query(std::string_view query) {
  std::string out;
  auto words = query_words(query);
  if (words.size() > kMaxQueryWords) words.resize(kMaxQueryWords);
  for (const auto& w : words) {
    if (!out.empty()) out += " OR ";
    out += quoted(w);
    bool split = false;
    for_each_identifier(w, [&](std::string_view id) { split = split || has_case_change(id); });
    if (!split) continue;
    std::string parts;
    for_each_identifier(w, [&](std::string_view id) {
      for (const auto& p : identifier_parts(id)) {
        if (!parts.empty()) parts += ' ';
        parts += p;
      }
    });
    out += " OR " + quoted(parts);
  }
  return out;
}

double similarity(double bm25) {
  const double s = std::max(-bm25, 1e-9);
  return s / (s + kHalfScore);
}

std::size_t best_line(std::string_view marked_text, std::string_view marked_idents) {
  // The hits of each line, by the lowercase text of each (a word hit twice counts once).
  auto hits_by_line = [](std::string_view marked) {
    std::vector<std::set<std::string>> lines(1);
    std::string hit;
    bool in_hit = false;
    for (char ch : marked) {
      if (ch == '\n') {
        if (in_hit) lines.back().insert(hit);
        hit.clear();
        lines.emplace_back();
        continue;  // (a hit across lines goes on in the next line)
      }
      if (ch == kHitOpen) {
        in_hit = true;
        hit.clear();
      } else if (ch == kHitClose) {
        if (in_hit && !hit.empty()) lines.back().insert(hit);
        in_hit = false;
      } else if (in_hit) {
        hit += lower(ch);
      }
    }
    return lines;
  };
  const auto text = hits_by_line(marked_text);
  const auto idents = hits_by_line(marked_idents);
  std::size_t best = 0, best_score = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    std::set<std::string> words = text[i];
    if (i < idents.size()) words.insert(idents[i].begin(), idents[i].end());
    if (words.size() > best_score) {
      best = i;
      best_score = words.size();
    }
  }
  return best;
}

std::string snippet(std::string_view text, std::size_t n) {
  std::size_t at = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos) return {};
    at = nl + 1;
  }
  std::string_view line = text.substr(
      at, text.find('\n', at) == std::string_view::npos ? std::string_view::npos : text.find('\n', at) - at);
  while (!line.empty() && is_space(line.front())) line.remove_prefix(1);
  while (!line.empty() && is_space(line.back())) line.remove_suffix(1);
  return std::string(cut_utf8(line, kMaxSnippet));
}

}  // namespace machina::code_search

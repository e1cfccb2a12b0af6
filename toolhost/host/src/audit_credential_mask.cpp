// Masks credentials in the values the audit store keeps of a call (see audit.hpp).
#include <machina/audit.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace machina {
namespace {

constexpr std::string_view kMask = "***";

char lower(char c) {
  return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

std::string lowered(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), lower);
  return out;
}

/// The words of a flag, parameter or variable name: `--api-key`, `apiKey`, `API_KEY` are
/// {"api", "key"}.
std::vector<std::string> name_words(std::string_view name) {
  std::vector<std::string> words;
  std::string word;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool upper = std::isupper(static_cast<unsigned char>(c)) != 0;
    if (!std::isalnum(static_cast<unsigned char>(c)) ||
        (upper && i > 0 && std::islower(static_cast<unsigned char>(name[i - 1])) != 0)) {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
      if (!std::isalnum(static_cast<unsigned char>(c))) continue;
    }
    word += lower(c);
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

/// Whether a name says its value is a credential. `key` alone counts only as a query
/// parameter or assignment (`key=...`): a `--key` flag usually names a file or a field.
bool names_credential(std::string_view name, bool assignment) {
  static constexpr std::array<std::string_view, 15> kWords = {
      "password",   "passwd",      "pass",      "pwd", "passphrase",    "secret", "token",     "apikey",
      "credential", "credentials", "signature", "sig", "authorization", "auth",   "privatekey"};
  static constexpr std::array<std::string_view, 9> kKeyOf = {"api",     "access",  "private", "secret",    "client",
                                                             "signing", "account", "master",  "encryption"};
  const auto words = name_words(name);
  if (assignment && words.size() == 1 && words[0] == "key") return true;
  for (std::size_t i = 0; i < words.size(); ++i) {
    if (std::find(kWords.begin(), kWords.end(), words[i]) != kWords.end()) return true;
    if (words[i] == "key" && i > 0 && std::find(kKeyOf.begin(), kKeyOf.end(), words[i - 1]) != kKeyOf.end()) {
      return true;
    }
  }
  return false;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_quote(char c) {
  return c == '"' || c == '\'' || c == '`';
}

/// `scheme://user:password@host` → `scheme://user:***@host`, wherever a URL is in `s`.
void mask_userinfo(std::string& s) {
  for (std::size_t at = s.find("://"); at != std::string::npos; at = s.find("://", at + 1)) {
    const std::size_t from = at + 3;
    std::size_t end = from;
    while (end < s.size() && s[end] != '/' && s[end] != '?' && s[end] != '#' && !is_space(s[end]) &&
           !is_quote(s[end])) {
      ++end;
    }
    const std::size_t sign = s.rfind('@', end == 0 ? 0 : end - 1);
    if (sign == std::string::npos || sign < from) continue;
    const std::size_t colon = s.find(':', from);
    if (colon == std::string::npos || colon >= sign || colon + 1 == sign) continue;
    s.replace(colon + 1, sign - colon - 1, kMask);
  }
}

/// `name=value` pairs in a word (`--password=x`, `?token=x&page=2`, `PASSWORD=x`): the
/// values of credential names masked, up to the next `&`, `;`, `#` or `,`.
std::string mask_assignments(std::string_view word) {
  std::string out;
  std::size_t done = 0;
  for (std::size_t eq = word.find('='); eq != std::string_view::npos; eq = word.find('=', eq + 1)) {
    if (eq < done) continue;
    std::size_t name_from = eq;
    while (name_from > 0) {
      const char c = word[name_from - 1];
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') break;
      --name_from;
    }
    if (name_from == eq || !names_credential(word.substr(name_from, eq - name_from), true)) continue;
    std::size_t value_end = eq + 1;
    while (value_end < word.size() && word[value_end] != '&' && word[value_end] != ';' && word[value_end] != '#' &&
           word[value_end] != ',') {
      ++value_end;
    }
    if (value_end == eq + 1) continue;
    out.append(word.substr(done, eq + 1 - done)).append(kMask);
    done = value_end;
    eq = value_end - 1;
  }
  out.append(word.substr(done));
  return out;
}

bool auth_scheme(std::string_view lowered_word) {
  return lowered_word == "bearer" || lowered_word == "basic" || lowered_word == "token" || lowered_word == "digest" ||
         lowered_word == "negotiate";
}

bool mysql_client(std::string_view program) {
  const std::size_t slash = program.rfind('/');
  const std::string_view base = slash == std::string_view::npos ? program : program.substr(slash + 1);
  static constexpr std::array<std::string_view, 8> kClients = {"mysql",     "mysqldump",  "mysqladmin", "mysqlimport",
                                                               "mysqlshow", "mysqlcheck", "mariadb",    "mariadb-dump"};
  return std::find(kClients.begin(), kClients.end(), base) != kClients.end();
}

}  // namespace

void AuditCredentialMask::reset() {
  next_ = Next::none;
  program_seen_ = false;
  mysql_ = false;
}

std::string AuditCredentialMask::masked(std::string_view text) {
  std::string s(text);
  mask_userinfo(s);
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    if (is_space(s[i])) {
      out += s[i++];
      continue;
    }
    std::size_t end = i;
    while (end < s.size() && !is_space(s[end])) ++end;
    // The word without the quotes and brackets around it (kept as they are).
    std::size_t from = i, to = end;
    while (from < to && (is_quote(s[from]) || s[from] == '(')) ++from;
    while (to > from && (is_quote(s[to - 1]) || s[to - 1] == ')' || s[to - 1] == ';' || s[to - 1] == ',')) --to;
    out.append(s, i, from - i);
    out.append(word(std::string_view(s).substr(from, to - from)));
    out.append(s, to, end - to);
    i = end;
  }
  return out;
}

std::string AuditCredentialMask::word(std::string_view w) {
  if (w.empty()) return {};
  const std::string lw = lowered(w);
  const Next next = std::exchange(next_, Next::none);
  if (next == Next::auth_value && auth_scheme(lw)) {
    next_ = Next::value;
    return std::string(w);
  }
  if (next == Next::user && w.front() != '-') {
    const std::size_t colon = w.find(':');
    if (colon == std::string_view::npos || colon + 1 == w.size()) return std::string(w);
    return std::string(w.substr(0, colon + 1)).append(kMask);
  }
  if ((next == Next::value || next == Next::auth_value) && !(w.front() == '-' && w.size() > 1)) {
    return std::string(kMask);
  }
  const bool program = !program_seen_;
  program_seen_ = true;
  if (program) mysql_ = mysql_client(w);
  if (lw == "bearer") {
    next_ = Next::value;
    return std::string(w);
  }
  if (mysql_ && w.size() > 2 && w[0] == '-' && w[1] == 'p' && w[2] != '-') return "-p" + std::string(kMask);
  if (w.back() == ':' && w.size() > 1 &&
      (lw == "authorization:" || lw == "proxy-authorization:" || names_credential(w.substr(0, w.size() - 1), false))) {
    next_ = Next::auth_value;
    return std::string(w);
  }
  if (w.find('=') != std::string_view::npos) return mask_assignments(w);
  if (lw == "-u" || lw == "--user" || lw == "--proxy-user") {
    next_ = Next::user;
    return std::string(w);
  }
  if (w.front() == '-' && names_credential(w, false)) next_ = Next::value;
  return std::string(w);
}

}  // namespace machina

// The digest of a call's arguments (audit_digest in audit.hpp): built from SAX events of
// the input straight into one bounded string.
#include <machina/audit.hpp>
#include <machina/json_text.hpp>
#include <machina/rapid_sax.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace machina {

namespace {

/// Members whose values are kept (cut at kAuditMaxValue): where a call reaches, what it runs.
bool kept_member(std::string_view key) {
  static constexpr std::array<std::string_view, 18> kKept = {
      "path", "paths",   "cwd",   "file", "filename",    "dir",     "directory", "target",           "command",
      "args", "pattern", "query", "url",  "codebase_id", "package", "packages",  "install_packages", "session_id"};
  return std::find(kKept.begin(), kKept.end(), key) != kKept.end();
}
bool path_member(std::string_view key) {
  return key == "path" || key == "file" || key == "filename" || key == "dir" || key == "directory" || key == "cwd";
}

std::string cut_utf8(std::string_view s, std::size_t n) {
  if (s.size() <= n) return std::string(s);
  std::size_t end = n;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return std::string(s.substr(0, end)) + "…";
}

/// Builds the digest from SAX events of the input (RapidJSON's fast path), straight into
/// one string.
class DigestSax {
 public:
  DigestSax(std::string& out, std::string* path) : out_(out), path_(path) { out_.assign(1, '{'); }

  bool null() { return literal("null"); }
  bool boolean(bool b) { return literal(b ? "true" : "false"); }
  bool number_integer(std::int64_t) { return number(); }
  bool number_unsigned(std::uint64_t) { return number(); }
  bool number_float(double, const std::string&) { return number(); }
  bool string_view_value(std::string_view v) {
    if (depth_ == 0) {
      top_ = "string";
      return true;
    }
    if (depth_ == 1) {
      if (keep_) {
        const std::string kept = mask_.masked(v);
        if (path_ != nullptr && path_->empty() && path_member(key_)) *path_ = cut_utf8(kept, kAuditMaxValue);
        value_cut(kept);
      } else {
        described("<string, ", v.size(), " bytes>");
      }
    } else if (depth_ == 2 && in_kept_array_) {
      element_cut(mask_.masked(v));
    }
    return true;
  }
  bool key_view(std::string_view k) {
    if (depth_ == 1) {
      key_.assign(k);
      keep_ = kept_member(k);
      mask_.reset();
    }
    return true;
  }
  bool start_object(std::size_t) { return open(false); }
  bool start_array(std::size_t) { return open(true); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  /// Closes the digest (call once, after the parse).
  void finish(std::size_t input_bytes) {
    if (top_ != nullptr) {
      out_.assign("{\"<input>\":\"<");
      out_.append(top_).append(", ").append(std::to_string(input_bytes)).append(" bytes>\"}");
      return;
    }
    if (dropped_ > 0) {
      if (members_ > 0) out_ += ',';
      out_.append("\"<more>\":\"").append(std::to_string(dropped_)).append(" more members\"");
    }
    out_ += '}';
  }

 private:
  // A member is written as `"key":` then its value; past the bound it is taken back.
  bool begin_member() {
    mark_ = out_.size();
    if (out_.size() + key_.size() + 80 > kAuditMaxDigest) {
      ++dropped_;
      return false;
    }
    if (members_ > 0) out_ += ',';
    append_json_string(out_, std::string_view(key_).substr(0, 128));
    out_ += ':';
    return true;
  }
  void end_member() {
    if (out_.size() + 64 > kAuditMaxDigest) {  // the value was too long for what is left
      out_.resize(mark_);
      ++dropped_;
      return;
    }
    ++members_;
  }
  bool literal(const char* text) {
    if (depth_ == 0)
      top_ = "scalar";
    else if (depth_ == 1 && begin_member()) {
      out_ += text;
      end_member();
    } else if (depth_ == 2 && in_kept_array_) {
      element(text);
    }
    return true;
  }
  bool number() {
    if (depth_ == 0)
      top_ = "number";
    else if (depth_ == 1 && begin_member()) {
      out_ += "\"<number>\"";
      end_member();
    } else if (depth_ == 2 && in_kept_array_) {
      element("\"<number>\"");
    }
    return true;
  }
  void described(const char* before, std::size_t n, const char* after) {
    if (!begin_member()) return;
    out_.append(1, '"').append(before).append(std::to_string(n)).append(after).append(1, '"');
    end_member();
  }
  void value_cut(std::string_view v) {
    if (!begin_member()) return;
    append_json_string(out_, cut_utf8(v, kAuditMaxValue));
    end_member();
  }
  // Elements of a kept array (a command's args), kept while the member's share lasts.
  void element(std::string_view json) {
    if (array_bytes_ + json.size() + 1 > kAuditMaxValue) {
      array_cut_ = true;
      return;
    }
    if (elements_ > 0) out_ += ',';
    out_.append(json);
    array_bytes_ += json.size() + 1;
    ++elements_;
  }
  void element_cut(std::string_view v) {
    std::string text;
    append_json_string(text, cut_utf8(v, kAuditMaxValue));
    element(text);
  }
  bool open(bool array) {
    ++depth_;
    if (depth_ == 1) {
      if (array) top_ = "array";
    } else if (depth_ == 2) {
      in_kept_array_ = keep_ && array;
      if (in_kept_array_) {
        if (begin_member()) {
          out_ += '[';
          elements_ = 0;
          array_bytes_ = 0;
          array_cut_ = false;
        } else {
          in_kept_array_ = false;
        }
      } else if (begin_member()) {
        out_ += array ? "\"<array>\"" : "\"<object>\"";  // (its size is not known yet: the kind says enough)
        end_member();
      }
    }
    return true;
  }
  bool close() {
    if (depth_ == 2 && in_kept_array_) {
      if (array_cut_) out_ += elements_ > 0 ? ",\"…\"" : "\"…\"";
      out_ += ']';
      end_member();
      in_kept_array_ = false;
    }
    --depth_;
    return true;
  }

  std::string& out_;
  std::string* path_;
  AuditCredentialMask mask_;  // over the values of one kept member
  int depth_ = 0;
  std::string key_;
  bool keep_ = false;
  bool in_kept_array_ = false, array_cut_ = false;
  std::size_t elements_ = 0, array_bytes_ = 0;
  std::size_t members_ = 0, dropped_ = 0, mark_ = 0;
  const char* top_ = nullptr;
};

}  // namespace

void audit_digest_into(std::string& out, std::string_view input_json, bool input_cut, std::string* path) {
  if (path != nullptr) path->clear();
  if (!input_cut) {
    DigestSax sax(out, path);
    if (detail::rapid_parse(input_json, sax) == detail::RapidOutcome::accepted) {
      sax.finish(input_json.size());
      return;
    }
  }
  // Not JSON RapidJSON takes whole (cut at kAuditMaxInput, not JSON at all, or one of the
  // rare texts only the reference parser judges): described, not digested.
  if (path != nullptr) path->clear();
  out.assign("{\"<input>\":\"<");
  out.append(input_cut ? "input cut at " : "input, ").append(std::to_string(input_json.size()));
  out.append(input_cut ? " bytes>\"}" : " bytes, not digested>\"}");
}

std::string audit_digest(std::string_view input_json, bool input_cut, std::string* path) {
  std::string out;
  audit_digest_into(out, input_json, input_cut, path);
  return out;
}

}  // namespace machina

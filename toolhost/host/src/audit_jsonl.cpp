// The audit store's JSON lines file: one line per call, appended whole lines at a time,
// rotated to FILE.1 before it would grow past its bound.

#include "audit_writer.hpp"

#include <machina/fd_io.hpp>
#include <machina/json_text.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace machina {

using namespace audit_detail;

void AuditLog::Writer::open_jsonl() {
  jsonl_ = open_owner_only(options_.jsonl_path, O_WRONLY | O_APPEND);
  if (jsonl_ < 0) {
    throw ConfigError("audit JSON lines file " + options_.jsonl_path + ": cannot be opened: " + std::strerror(errno));
  }
  struct stat st{};
  jsonl_bytes_ = ::fstat(jsonl_, &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

void AuditLog::Writer::jsonl_line(const Call& c) {
  std::string& line = jsonl_line_;
  line = "{\"time\":\"" + audit_iso_time(c.ts_ms) + "\",\"ts_ms\":" + std::to_string(c.ts_ms) + ",\"tool\":";
  append_json_string(line, c.aid);
  line += ",\"front\":";
  append_json_string(line, c.front);
  line += ",\"user\":";
  if (c.user.empty())
    line += "null";
  else
    append_json_string(line, c.user);
  const auto kind = static_cast<ErrorKind>(c.head.kind);
  const ErrorKindInfo& info = error_info(kind);
  line += ",\"status\":\"" + std::string(status_name(info.status)) + "\",\"code\":\"" +
          (kind == ErrorKind::none ? std::string("ok") : std::string(info.code)) + "\",\"error_type\":";
  if (kind == ErrorKind::none)
    line += "null";
  else
    append_json_string(line, error_type(kind));
  line += ",\"duration_us\":" + std::to_string(c.duration_us) +
          ",\"duration_ms\":" + std::to_string(c.duration_us / 1000) + "." +
          std::to_string(1000 + c.duration_us % 1000).substr(1) +
          ",\"input_bytes\":" + std::to_string(c.head.input_bytes) +
          ",\"output_bytes\":" + std::to_string(c.head.output_bytes) +
          ",\"idempotent_hit\":" + ((c.head.flags & kHit) != 0 ? "true" : "false") + ",\"path\":";
  if (path_.empty())
    line += "null";
  else
    append_json_string(line, path_);
  line += ",\"args\":" + args_ + "}\n";
  std::string& out = jsonl_text_;
  if (jsonl_bytes_ + out.size() + line.size() > options_.jsonl_max_bytes && jsonl_bytes_ + out.size() > 0) {
    put_jsonl(out);
    rotate_jsonl();
  }
  if (jsonl_ >= 0) out += line;
}

void AuditLog::Writer::put_jsonl(std::string& text) {
  if (text.empty() || jsonl_ < 0) {
    text.clear();
    return;
  }
  if (const std::size_t done = write_fully(jsonl_, text.data(), text.size()); done < text.size()) {
    const int err = errno;
    if (done > 0) (void)::ftruncate(jsonl_, static_cast<off_t>(jsonl_bytes_));
    complain("audit JSON lines file " + options_.jsonl_path + ": " + std::strerror(err) + " (lines not recorded)");
    jsonl_failed_ = true;
    text.clear();
    return;
  }
  jsonl_bytes_ += text.size();
  text.clear();
}

void AuditLog::Writer::rotate_jsonl() {
  ::close(jsonl_);
  std::rename(options_.jsonl_path.c_str(), (options_.jsonl_path + ".1").c_str());
  jsonl_ = open_owner_only(options_.jsonl_path, O_WRONLY | O_APPEND);
  jsonl_bytes_ = 0;
  if (jsonl_ < 0) {
    jsonl_failed_ = true;
    complain("audit JSON lines file " + options_.jsonl_path + ": cannot be opened again: " + std::strerror(errno));
  }
}

}  // namespace machina

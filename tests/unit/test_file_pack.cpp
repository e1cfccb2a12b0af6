// file_pack (files.read/write/delete/list through PackRunner): each tool's answer in its
// own shape and in the NATS subject's shape, the refusals (outside the roots, '..', deny
// globs, links, missing files, non-UTF-8 text) with their kinds, and the read, write and
// listing caps.

#include <doctest/doctest.h>

#include "pack_call.hpp"

#include <filesystem>
#include <fstream>
#include <string>

using namespace machina;
using machina::test::call_pack;
using json = nlohmann::json;
namespace fs = std::filesystem;

using Files = machina::test::PackWorkspace;

TEST_CASE("write, read, append, list and delete a file beneath the root") {
  Files f;
  PackRunner runner(f.policy, "");
  auto a = call_pack(runner, "AID.FILE.WRITE.v1", {{"path", "notes/a.txt"}, {"content", "hello"}});
  REQUIRE(a.ok());
  CHECK(a.output == json{{"path", "notes/a.txt"}, {"bytes_written", 5}, {"append", false}});
  a = call_pack(runner, "AID.FILE.WRITE.v1", {{"path", "notes/a.txt"}, {"content", " world"}, {"append", true}});
  REQUIRE(a.ok());
  a = call_pack(runner, "AID.FILE.READ.v1", {{"path", "notes/a.txt"}});
  REQUIRE(a.ok());
  CHECK(a.output == json{{"path", "notes/a.txt"}, {"content", "hello world"}, {"truncated", false}, {"size", 11}});
  a = call_pack(runner, "AID.FILE.READ.v1", {{"path", (f.ws / "notes/a.txt").string()}, {"max_bytes", 5}});
  REQUIRE(a.ok());
  CHECK(a.output["content"] == "hello");
  CHECK(a.output["truncated"] == true);

  a = call_pack(runner, "AID.FILE.LIST.v1", {{"recursive", true}});
  REQUIRE(a.ok());
  CHECK(a.output["truncated"] == false);
  REQUIRE(a.output["entries"].size() == 2);
  CHECK(a.output["entries"][0]["type"] == "directory");
  CHECK(a.output["entries"][1]["path"].get<std::string>().find("a.txt") != std::string::npos);
  CHECK(a.output["entries"][1]["size"] == 11);
  CHECK(a.output["entries"][1]["type"] == "file");

  a = call_pack(runner, "AID.FILE.DELETE.v1", {{"path", "notes/a.txt"}});
  REQUIRE(a.ok());
  CHECK(a.output == json{{"path", "notes/a.txt"}, {"deleted", true}});
  CHECK_FALSE(fs::exists(f.ws / "notes/a.txt"));
  check_refused(call_pack(runner, "AID.FILE.DELETE.v1", {{"path", "notes/a.txt"}}), ErrorKind::target_not_found,
                "NotFound: notes/a.txt");
}

TEST_CASE("the NATS subjects' and function names' shapes") {
  Files f;
  f.put("a.txt", "text");
  PackRunner runner(f.policy, "");
  auto a = call_pack(runner, "tools.file.read", {{"path", "a.txt"}});
  REQUIRE(a.ok());
  CHECK(a.output == "text");
  a = call_pack(runner, "readFile", {{"path", "a.txt"}});
  REQUIRE(a.ok());
  CHECK(a.output == "text");
  a = call_pack(runner, "tools.file.write", {{"path", "b.txt"}, {"content", "xy"}});
  REQUIRE(a.ok());
  CHECK(a.output == json{{"bytes_written", 2}});
  a = call_pack(runner, "tools.file.list", json::object());
  REQUIRE(a.ok());
  CHECK(a.output.is_array());
  CHECK(a.output.size() == 2);
  a = call_pack(runner, "tools.file.delete", {{"path", "b.txt"}});
  REQUIRE(a.ok());
  CHECK(a.output == json{{"deleted", true}});
}

TEST_CASE("paths outside the roots, with '..', denied names and links are refused") {
  Files f;
  f.put(".env", "SECRET=1");
  f.put("keys/server.pem", "k");
  f.put("real.txt", "r");
  fs::create_symlink(f.ws / "real.txt", f.ws / "link.txt");
  std::ofstream(f.tmp.path / "outside.txt") << "o";
  PackRunner runner(f.policy, "");
  check_refused(call_pack(runner, "AID.FILE.READ.v1", {{"path", (f.tmp.path / "outside.txt").string()}}),
                ErrorKind::access_denied, "is outside the allowed directories");
  check_refused(call_pack(runner, "AID.FILE.READ.v1", {{"path", "../outside.txt"}}), ErrorKind::access_denied,
                "'..' is not allowed in a path");
  check_refused(call_pack(runner, "AID.FILE.READ.v1", {{"path", ".env"}}), ErrorKind::access_denied,
                "matches the deny pattern");
  check_refused(call_pack(runner, "AID.FILE.READ.v1", {{"path", "keys/server.pem"}}), ErrorKind::access_denied,
                "matches the deny pattern");
  check_refused(call_pack(runner, "AID.FILE.WRITE.v1", {{"path", ".env"}, {"content", "x"}}), ErrorKind::access_denied,
                "matches the deny pattern");
  check_refused(call_pack(runner, "AID.FILE.READ.v1", {{"path", "link.txt"}}), ErrorKind::access_denied,
                "AccessDenied: link.txt");
  check_refused(call_pack(runner, "AID.FILE.WRITE.v1", {{"path", "link.txt"}, {"content", "x"}}),
                ErrorKind::access_denied, "AccessDenied: link.txt");
  CHECK(std::ifstream(f.ws / "real.txt").get() == 'r');
  check_refused(call_pack(runner, "AID.FILE.READ.v1", {{"path", "nothing.txt"}}), ErrorKind::target_not_found,
                "NotFound: nothing.txt");
  check_refused(call_pack(runner, "AID.FILE.READ.v1", {{"path", ""}}), ErrorKind::invalid_input,
                "path must not be empty");
  check_refused(call_pack(runner, "AID.FILE.READ.v1", {{"path", std::string("a\0b", 3)}}), ErrorKind::invalid_input,
                "must not contain a NUL character");
  check_refused(call_pack(runner, "AID.FILE.READ.v1", {{"path", "."}}), ErrorKind::invalid_input,
                "names a directory the tools work in");
  // A listing leaves denied names and links' targets out; the link itself is listed.
  const auto a = call_pack(runner, "AID.FILE.LIST.v1", {{"recursive", true}});
  REQUIRE(a.ok());
  const std::string listed = a.output["entries"].dump();
  CHECK(listed.find(".env") == std::string::npos);
  CHECK(listed.find("server.pem") == std::string::npos);
  CHECK(listed.find("\"symlink\"") != std::string::npos);
}

TEST_CASE("text that is not UTF-8 is refused") {
  Files f;
  f.put("bin.dat", "\xff\xfe\x00");
  PackRunner runner(f.policy, "");
  check_refused(call_pack(runner, "AID.FILE.READ.v1", {{"path", "bin.dat"}}), ErrorKind::invalid_input,
                "is not UTF-8 text");
}

TEST_CASE("caps: read limit, write limit, listing entries") {
  Files f;
  f.policy.files.max_read_bytes = 10;
  f.policy.files.max_write_bytes = 4;
  f.policy.files.max_list_entries = 3;
  f.put("big.txt", std::string(11, 'b'));
  for (int i = 0; i < 5; ++i) f.put("d/" + std::to_string(i), "");
  PackRunner runner(f.policy, "");
  check_refused(call_pack(runner, "AID.FILE.READ.v1", {{"path", "big.txt"}, {"max_bytes", 11}}),
                ErrorKind::invalid_input, "max_bytes 11 is over the read limit of 10 bytes");
  auto a = call_pack(runner, "AID.FILE.READ.v1", {{"path", "big.txt"}});
  REQUIRE(a.ok());
  CHECK(a.output["content"] == std::string(10, 'b'));
  CHECK(a.output["truncated"] == true);
  check_refused(call_pack(runner, "tools.file.read", {{"path", "big.txt"}}), ErrorKind::invalid_input,
                "is 11 bytes, over the read limit of 10");
  check_refused(call_pack(runner, "AID.FILE.WRITE.v1", {{"path", "w.txt"}, {"content", "12345"}}),
                ErrorKind::invalid_input, "over the write limit of 4");
  CHECK_FALSE(fs::exists(f.ws / "w.txt"));
  REQUIRE(call_pack(runner, "AID.FILE.WRITE.v1", {{"path", "w.txt"}, {"content", "1234"}}).ok());
  a = call_pack(runner, "AID.FILE.LIST.v1", {{"path", "d"}});
  REQUIRE(a.ok());
  CHECK(a.output["entries"].size() == 3);
  CHECK(a.output["truncated"] == true);
  a = call_pack(runner, "AID.FILE.LIST.v1", {{"path", "d"}, {"pattern", "[12]"}});
  REQUIRE(a.ok());
  CHECK(a.output["entries"].size() == 2);
  CHECK(a.output["truncated"] == false);
}

TEST_CASE("the runner refuses an unknown tool, an input that is no object, and calls past a rate limit") {
  Files f;
  f.put("a.txt", "a");
  f.policy.rate_limits["AID.FILE.READ.v1"] = RateLimit{1, 3600};
  PackRunner runner(f.policy, "");
  check_refused(call_pack(runner, "AID.NOPE.v1", json::object()), ErrorKind::internal_error,
                "no pack tool AID.NOPE.v1");
  check_refused(call_pack(runner, "AID.FILE.LIST.v1", json::array()), ErrorKind::invalid_input,
                "the input must be a JSON object");
  check_refused(call_pack(runner, "AID.FILE.READ.v1", {{"path", 5}}), ErrorKind::invalid_input, "InvalidInput: ");
  REQUIRE(call_pack(runner, "AID.FILE.READ.v1", {{"path", "a.txt"}}, "alice").ok());
  check_refused(call_pack(runner, "AID.FILE.READ.v1", {{"path", "a.txt"}}, "alice"), ErrorKind::rate_limited,
                "rate limit of 1 calls per 3600 s for AID.FILE.READ.v1 (user alice) reached");
  // Each user has a bucket of their own; the other names of the tool share the aid's limit.
  REQUIRE(call_pack(runner, "AID.FILE.READ.v1", {{"path", "a.txt"}}, "bob").ok());
  check_refused(call_pack(runner, "readFile", {{"path", "a.txt"}}, "bob"), ErrorKind::rate_limited, "(user bob)");
}

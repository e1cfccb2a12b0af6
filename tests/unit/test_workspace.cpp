// workspace (the built-in file tools): path rules, no symbolic link followed with either
// resolver, only single-link regular files, and nothing left behind by a failed write.
#include <machina/workspace.hpp>

#include <doctest/doctest.h>

#include "temp_dir.hpp"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

using namespace machina::workspace;
namespace fs = std::filesystem;

namespace {
std::vector<std::string> parts_of(std::string_view path) {
  std::vector<std::string> parts;
  std::string why;
  REQUIRE_MESSAGE(split(path, parts, why), why);
  return parts;
}
}  // namespace

TEST_CASE("split refuses what could leave the workspace") {
  std::vector<std::string> parts;
  std::string why;
  CHECK(split("a/./b//c", parts, why));
  CHECK(parts == std::vector<std::string>{"a", "b", "c"});
  CHECK_FALSE(split("", parts, why));
  CHECK_FALSE(split("/etc/passwd", parts, why));
  CHECK(why == "path must be relative to the workspace");
  CHECK_FALSE(split("a/../../b", parts, why));
  CHECK(why == "path must not contain '..'");
  CHECK_FALSE(split(std::string_view("a\0b", 3), parts, why));
  CHECK_FALSE(split(std::string(300, 'n'), parts, why));
  std::string deep;
  for (std::size_t i = 0; i <= kMaxDepth; ++i) deep += "d/";
  CHECK_FALSE(split(deep, parts, why));
  CHECK_FALSE(split(".", parts, why));
}

TEST_CASE("no symbolic link is followed, with either resolver") {
  TempDir outside, root;
  std::ofstream(outside.path / "secret") << "s";
  fs::create_directory_symlink(outside.path, root.path / "link");
  fs::create_symlink(outside.path / "secret", root.path / "file-link");
  for (Resolver resolver : {Resolver::automatic, Resolver::walk}) {
    CAPTURE(static_cast<int>(resolver));
    Workspace ws;
    std::string why;
    REQUIRE(ws.open(root.path.string(), why, resolver));
    CHECK_FALSE(ws.open_for_reading(parts_of("link/secret"), why));
    CHECK(why == "a symbolic link is in the way (links are not followed in the workspace)");
    CHECK_FALSE(ws.open_for_reading(parts_of("file-link"), why));
    CHECK_FALSE(ws.write(parts_of("link/new"), "x", false, why));
    CHECK_FALSE(fs::exists(outside.path / "new"));
  }
}

TEST_CASE("only regular files with a single link are opened") {
  TempDir root;
  std::ofstream(root.path / "one") << "1";
  fs::create_hard_link(root.path / "one", root.path / "two");
  REQUIRE(mkfifo((root.path / "fifo").c_str(), 0600) == 0);
  Workspace ws;
  std::string why;
  REQUIRE(ws.open(root.path.string(), why));
  CHECK_FALSE(ws.open_for_reading(parts_of("one"), why));
  CHECK(why.find("more than one hard link") != std::string::npos);
  CHECK_FALSE(ws.open_for_reading(parts_of("fifo"), why));  // refused at once, never blocks
  CHECK(why == "not a regular file");
}

TEST_CASE("a write makes the folders it needs, and a failed one leaves none behind") {
  TempDir root;
  Workspace ws;
  std::string why;
  REQUIRE(ws.open(root.path.string(), why));
  REQUIRE(ws.write(parts_of("a/b/c.txt"), "hello", false, why));
  CHECK(fs::file_size(root.path / "a/b/c.txt") == 5);
  REQUIRE(ws.write(parts_of("a/b/c.txt"), "!", true, why));
  CHECK(fs::file_size(root.path / "a/b/c.txt") == 6);
  // A write that fails after its folders were made (a 1 KiB file size limit, SIGXFSZ
  // ignored: the write gets EFBIG) takes them away again.
  rlimit old{};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
  rlimit small = old;
  small.rlim_cur = 1024;
  const auto old_handler = signal(SIGXFSZ, SIG_IGN);
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  const bool wrote = ws.write(parts_of("made/for/this/file"), std::string(4096, 'y'), false, why);
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  CHECK_FALSE(wrote);
  CHECK(why.find("write failed") != std::string::npos);
  CHECK_FALSE(fs::exists(root.path / "made"));
}

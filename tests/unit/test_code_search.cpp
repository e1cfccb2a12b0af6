// code_search_text (code.search's pure parts): identifier parts, the chunks a file is cut
// into, the FTS5 query made of a caller's words (run against a real FTS5 table: nothing in
// a query is read as syntax), the similarity of a BM25 score, the best line of a hit and
// its snippet.
#include <machina/code_search_text.hpp>
#include <machina/sqlite_db.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

using namespace machina;
using namespace machina::code_search;

namespace {

using Words = std::vector<std::string>;

/// An in-memory index laid out as code.search's, with one chunk per text given.
struct Fts {
  sql::Db db{":memory:"};
  explicit Fts(const std::vector<std::string>& texts) {
    db.exec(
        "CREATE VIRTUAL TABLE chunks USING fts5(text, idents, first_line UNINDEXED, lines UNINDEXED,"
        " tokenize = 'porter unicode61')");
    std::int64_t rowid = 1;
    for (const auto& t : texts) {
      for (const auto& ch : chunk_text(t)) {
        db.prepare("INSERT INTO chunks(rowid, text, idents, first_line, lines) VALUES(?1, ?2, ?3, ?4, ?5)")
            .bind(1, rowid)
            .bind(2, ch.text)
            .bind(3, ch.idents)
            .bind(4, static_cast<std::int64_t>(ch.first_line))
            .bind(5, static_cast<std::int64_t>(ch.lines))
            .run();
      }
      ++rowid;
    }
  }
  /// The rowids matching a caller's query, best first.
  std::vector<std::int64_t> search(const std::string& query) {
    std::vector<std::int64_t> out;
    auto st = db.prepare("SELECT rowid FROM chunks WHERE chunks MATCH ?1 ORDER BY bm25(chunks, 1.0, 0.5)");
    st.bind(1, fts_query(query));
    while (st.step()) out.push_back(st.integer(0));
    return out;
  }
};

}  // namespace

TEST_CASE("identifiers are cut at underscores, case changes and digits before a capital") {
  CHECK(identifier_parts("getUserName") == Words{"get", "user", "name"});
  CHECK(identifier_parts("get_user_name") == Words{"get", "user", "name"});
  CHECK(identifier_parts("parseHTTPRequest") == Words{"parse", "http", "request"});
  CHECK(identifier_parts("HTTPServer") == Words{"http", "server"});
  CHECK(identifier_parts("utf8Decode") == Words{"utf8", "decode"});
  CHECK(identifier_parts("base64") == Words{"base64"});
  CHECK(identifier_parts("__init__") == Words{"init"});
  CHECK(identifier_parts("SCREAMING_CASE") == Words{"screaming", "case"});
  CHECK(identifier_parts("x") == Words{"x"});
  CHECK(identifier_parts("foo.barBaz(q)") == Words{"foo", "bar", "baz", "q"});
  CHECK(identifier_parts("").empty());
}

TEST_CASE("a line's identifier column holds the parts of its camelCase identifiers only") {
  CHECK(line_idents("int getUserName(parseHTTPRequest x, snake_case y) {") == "get user name parse http request");
  CHECK(line_idents("plain words and snake_case only") == "");
  CHECK(line_idents("") == "");
  CHECK(line_idents("caf\xc3\xa9"
                    "Bar fooBar") == "foo bar");  // (non-ASCII letters cut identifiers)
}

TEST_CASE("a file is cut into chunks of kChunkLines lines, line numbers kept") {
  std::string text;
  for (int i = 1; i <= 65; ++i) text += "line " + std::to_string(i) + " fooBar\r\n";
  const auto chunks = chunk_text(text);
  REQUIRE(chunks.size() == 3);
  CHECK(chunks[0].first_line == 1);
  CHECK(chunks[0].lines == kChunkLines);
  CHECK(chunks[1].first_line == 1 + kChunkLines);
  CHECK(chunks[2].first_line == 1 + 2 * kChunkLines);
  CHECK(chunks[2].lines == 65 - 2 * kChunkLines);
  CHECK(chunks[0].text.rfind("line 1 fooBar\nline 2 fooBar\n", 0) == 0);  // '\r' dropped
  CHECK(chunks[2].text.substr(chunks[2].text.size() - 14) == "line 65 fooBar");
  for (const auto& ch : chunks) {
    // The identifier column has a line for each line of text: a hit in it has a line number.
    CHECK(std::count(ch.idents.begin(), ch.idents.end(), '\n') == std::count(ch.text.begin(), ch.text.end(), '\n'));
    CHECK(ch.idents.rfind("foo bar\nfoo bar\n", 0) == 0);
  }
}

TEST_CASE("chunks of nothing but white space are left out, their lines still count") {
  std::string text(40, '\n');
  text += "  \t\n";
  text += "found here\n";
  const auto chunks = chunk_text(text);
  REQUIRE(chunks.size() == 1);
  CHECK(chunks[0].first_line == 31);
  CHECK(chunks[0].text.find("found here") != std::string::npos);
  CHECK(chunk_text("").empty());
  CHECK(chunk_text("\n\n\n").empty());
  REQUIRE(chunk_text("no newline at the end").size() == 1);
  CHECK(chunk_text("no newline at the end")[0].lines == 1);
}

TEST_CASE("long lines are indexed in part, never cut inside a character, and hit markers become spaces") {
  std::string line = "a";
  for (int i = 0; i < 1500; ++i) line += "\xc3\xa9";  // é: two bytes
  const auto chunks = chunk_text(line + "\nnext\n");
  REQUIRE(chunks.size() == 1);
  const std::string first = chunks[0].text.substr(0, chunks[0].text.find('\n'));
  CHECK(first.size() <= kMaxIndexedLine);
  CHECK(first.size() == kMaxIndexedLine - 1);  // 1 + 2 * 999 bytes: the next é does not fit
  CHECK(chunks[0].text.substr(first.size()) == "\nnext");
  const auto marked = chunk_text(std::string("a\x01") + "b\x02" + "c");
  CHECK(marked[0].text == "a b c");
}

TEST_CASE("a query's words become quoted strings, or'd, camelCase words with their parts") {
  CHECK(fts_query("foo") == "\"foo\"");
  CHECK(fts_query("  async   function\thandler ") == "\"async\" OR \"function\" OR \"handler\"");
  CHECK(fts_query("getUserName") == "\"getUserName\" OR \"get user name\"");
  CHECK(fts_query("get_user_name") == "\"get_user_name\"");
  CHECK(fts_query("say \"hi\"") == "\"say\" OR \"\"\"hi\"\"\"");
  CHECK(fts_query("a* NEAR(b c) col:x -y") == "\"a*\" OR \"NEAR(b\" OR \"c)\" OR \"col:x\" OR \"-y\"");
  CHECK(fts_query("") == "");
  CHECK(fts_query(" \t\n") == "");
  std::string many;
  for (int i = 0; i < 40; ++i) many += "w" + std::to_string(i) + " ";
  CHECK(query_words(many).size() == 40);
  const std::string q = fts_query(many);
  CHECK(q.find("\"w31\"") != std::string::npos);
  CHECK(q.find("\"w32\"") == std::string::npos);  // at most kMaxQueryWords words
}

TEST_CASE("nothing in a query is FTS5 syntax: operators, columns, prefixes and quotes are plain text") {
  Fts fts({"void parseRequest(int x) { return handler(x); }", "AND OR NOT NEAR text col x", "other words here",
           "the text handler"});
  for (const std::string q : {"\"",
                              "\"\"",
                              "\"unbalanced",
                              "*",
                              "a*",
                              "^start",
                              "NEAR(",
                              "NEAR(a b, 2)",
                              "col:",
                              "text:handler",
                              "idents:x",
                              "(",
                              ")",
                              "((a)",
                              "a OR",
                              "AND",
                              "NOT x",
                              "-x",
                              "+x",
                              "{text idents}: x",
                              "x:",
                              ":",
                              "'",
                              "'; DROP TABLE chunks;--",
                              "\\",
                              "\xe2\x80\x94",
                              "\x01\x02",
                              "a\"b\"c",
                              "* OR *",
                              "rank:1"}) {
    CAPTURE(q);
    CHECK_NOTHROW(fts.search(q));
  }
  CHECK(fts.search("text:handler") == std::vector<std::int64_t>{4});  // the phrase "text handler", not a column
  CHECK(fts.search("NEAR(") == std::vector<std::int64_t>{2});         // the word near
  CHECK(fts.search("AND").size() == 1);                               // the word and, not the operator
  CHECK(fts.search("*").empty());
  CHECK(fts.search("a*").empty());  // no prefix query
}

TEST_CASE("identifiers are found whole and by their parts, across naming styles") {
  Fts fts({"int getUserName() { return 1; }", "def get_user_name(): pass", "the user has a name", "unrelated text"});
  CHECK(fts.search("getUserName").size() == 2);    // whole, and get_user_name as the phrase of its parts
  CHECK(fts.search("get_user_name").size() == 2);  // and the other way round
  CHECK(fts.search("user").size() == 3);           // a part of both, and the plain word
  CHECK(fts.search("UserName").size() == 2);       // "user name" as a phrase: not the sentence
  CHECK(fts.search("getusername") == std::vector<std::int64_t>{1});
}

TEST_CASE("similarity is a monotone map of the BM25 score, above 0 and at most 1") {
  CHECK(similarity(-kHalfScore) == doctest::Approx(0.5));
  CHECK(similarity(0) > 0);
  CHECK(similarity(1e-3) > 0);  // (FTS5 never gives a positive score; still in range)
  CHECK(similarity(-1e12) <= 1);
  double before = similarity(0);
  for (double s = 0.001; s < 1000; s *= 1.5) {
    const double now = similarity(-s);
    CHECK(now > before);
    CHECK(now < 1);
    before = now;
  }
}

TEST_CASE("the best line holds the most different words hit, the first on a tie") {
  const std::string a =
      "\x01"
      "handler"
      "\x02";
  CHECK(best_line("no hit\n" + a + " here\nasync " + a +
                      " \x01"
                      "async"
                      "\x02",
                  "\n\n") == 2);
  CHECK(best_line(a + "\n" + a + " " + a + " " + a, "\n") == 0);  // a word hit three times counts once
  CHECK(best_line("x\ny\nz", "\n\n") == 0);
  CHECK(best_line("get_user\nfoo", "\n\x01user name\x02") == 1);  // a hit in the identifier column
  CHECK(best_line("\x01"
                  "a"
                  "\x02\nb",
                  "\x01"
                  "a"
                  "\x02\n") == 0);
}

TEST_CASE("a snippet is its line trimmed, at most kMaxSnippet bytes, never cut inside a character") {
  CHECK(snippet("first\n   second line  \t\nthird", 1) == "second line");
  CHECK(snippet("only", 0) == "only");
  CHECK(snippet("only", 3) == "");
  std::string long_line(499, 'x');
  long_line += "\xc3\xa9\xc3\xa9";
  CHECK(snippet(long_line, 0) == std::string(499, 'x'));
  CHECK(cut_utf8("abc", 10) == "abc");
  CHECK(cut_utf8("a\xc3\xa9", 2) == "a");
}

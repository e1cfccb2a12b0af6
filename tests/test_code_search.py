"""code.search (docs/tool-packs.md, "code.search") through --serve, on real files: ranking,
lines and snippets, identifier parts, the incremental index (its counts and its results
after files are added, changed, replaced and removed), what is never indexed (.gitignore,
hidden, binary, denied names, links), codebases and users, queries that look like FTS5
syntax, bad input, every cap, the deadline, concurrent searches of one index, and where the
index lives (outside every root, never reachable through the file tools)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import TOOLHOST, base_env
from test_tool_packs import Packs, output, refused, snapshot

OURS, SUBJECT, FUNCTION = "AID.CODE.SEARCH.v1", "tools.code.search", "searchCode"
FILLER = ["value", "compute", "item", "index", "total", "result", "buffer", "count", "offset", "length"]


class Search(Packs):
    """A workspace, a folder for the index outside it, and a policy naming that folder."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        (self.ws / "notes.txt").unlink()  # (each test writes the files it counts)
        self.index = tmp / "index"
        self.configure()

    def configure(self, code: str = "", top: str = "", rest: str = "") -> None:
        self.policy(f'{top}\n[code]\nindex_dir = "{self.index}"\n{code}\n{rest}\n')

    def search(self, query: str, aid: str = OURS, user: str | None = None, **inputs: Any) -> dict[str, Any]:
        return self.call(aid, user=user, query=query, **inputs)

    def found(self, query: str, **inputs: Any) -> Any:
        return output(self.search(query, **inputs))

    def write(self, rel: str, text: str) -> Path:
        p = self.ws / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return p


@pytest.fixture
def s(tmp_path: Path) -> Search:
    return Search(tmp_path)


def filler(s: Search, files: int = 30, lines: int = 40) -> None:
    """Files of common words, so that the words searched for are rare (BM25 needs a corpus)."""
    for f in range(files):
        s.write(f"fill/f{f:02}.ts", "".join(
            f"const {FILLER[(f + i) % 10]} = {FILLER[(f * i) % 10]}({FILLER[i % 10]}, {i});\n" for i in range(lines)))


# --- ranking, lines, snippets ---------------------------------------------------------------


def test_the_best_match_comes_first_with_its_line_and_snippet(s: Search) -> None:
    filler(s)
    body = [f"let {FILLER[i % 10]} = {i};\n" for i in range(60)]
    body[41] = "  export async function handler(req, res) {   \n"
    s.write("src/handler.ts", "".join(body))
    s.write("src/partial.ts", "// the handler is elsewhere\nlet x = 1;\n")
    s.write("src/words.ts", "function one() {}\nfunction two() {}\n")
    out = s.found("async function handler")
    results = out["results"]
    assert [r["path"] for r in results[:1]] == ["src/handler.ts"]
    top = results[0]
    assert top["line"] == 42 and top["snippet"] == "export async function handler(req, res) {"
    assert top["first_line"] == 31 and top["last_line"] == 60    # the chunk the line is in
    assert {r["path"] for r in results} == {"src/handler.ts", "src/partial.ts", "src/words.ts"}
    sims = [r["similarity"] for r in results]
    assert all(0 < x <= 1 for x in sims) and sims == sorted(sims, reverse=True)
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    assert top["similarity"] == pytest.approx(top["score"] / (top["score"] + 10))  # the documented transform
    assert out["truncated"] is False and out["codebase_id"] is None
    assert out["index"]["files"] == 33 and out["index"]["indexed"] == 33


def test_the_service_names_answer_the_plain_list(s: Search) -> None:
    filler(s)
    s.write("src/handler.ts", "\n\nasync function handler(req, res) {...}\n")
    r = s.serve({"aid": SUBJECT, "input_json": json.dumps({"query": "async function handler"})},
                {"aid": FUNCTION, "input_json": json.dumps({"query": "async handler", "limit": 1})},
                {"aid": SUBJECT, "input_json": json.dumps({"query": "handler", "limit": None, "codebase_id": None})})
    first = output(r[0])
    assert isinstance(first, list) and first[0] == {"path": "src/handler.ts", "line": 3,
                                                     "snippet": "async function handler(req, res) {...}",
                                                     "similarity": first[0]["similarity"]}
    assert all(set(x) == {"path", "line", "snippet", "similarity"} for x in first)
    assert len(output(r[1])) == 1
    assert output(r[2])[0]["path"] == "src/handler.ts"


def test_all_three_names_are_listed() -> None:
    proc = subprocess.run([TOOLHOST, "--list"], capture_output=True, env=base_env(), timeout=30)
    tools = {t["aid"]: t for t in json.loads(proc.stdout)["tools"]}
    assert tools[OURS]["tags"] == ["pack", "code"] and "alias_of" not in tools[OURS]
    assert tools[SUBJECT]["alias_of"] == OURS and tools[FUNCTION]["alias_of"] == OURS


def test_the_best_line_of_a_chunk_and_long_lines(s: Search) -> None:
    filler(s, files=10)
    lines = [f"line {FILLER[i % 10]}\n" for i in range(90)]
    lines[74] = "\tparse the config file here\n"
    lines[70] = "config only\n"
    lines[80] = "parse only\n"
    s.write("doc.txt", "".join(lines))
    s.write("long.txt", "x = 1\n" + "needle " + "é" * 3000 + "\n")
    top = s.found("parse config file")["results"][0]
    assert (top["path"], top["line"], top["snippet"]) == ("doc.txt", 75, "parse the config file here")
    (hit,) = s.found("needle")["results"]
    assert hit["line"] == 2 and hit["snippet"].startswith("needle é") and len(hit["snippet"].encode()) <= 500


def test_identifiers_are_found_whole_and_by_their_parts(s: Search) -> None:
    filler(s)
    s.write("a.js", "const total = getUserName(request);\n")
    s.write("b.py", "def get_user_name(request):\n    pass\n")
    s.write("c.go", "func parseHTTPRequest(r *Request) {}\n")
    s.write("d.txt", "the name of the user\n")

    def paths(query: str) -> set[str]:
        return {r["path"] for r in s.found(query, limit=50)["results"]}

    assert paths("getUserName") == {"a.js", "b.py"}
    assert paths("get_user_name") == {"a.js", "b.py"}
    assert paths("UserName") == {"a.js", "b.py"}             # the phrase "user name": not d.txt
    assert paths("user") == {"a.js", "b.py", "d.txt"}
    assert paths("getusername") == {"a.js"}
    assert paths("HTTP") == {"c.go"} and paths("parseHttpRequest") == {"c.go"}
    (hit,) = s.found("http request")["results"][:1]
    assert hit["path"] == "c.go" and hit["snippet"] == "func parseHTTPRequest(r *Request) {}"


# --- the incremental index ------------------------------------------------------------------


def test_the_index_follows_the_files(s: Search) -> None:
    s.write("a.py", "alpha = 1\n")
    s.write("b.py", "beta = 2\n")
    s.write("c.py", "gamma = 3\n")

    def index(out: dict[str, Any]) -> dict[str, Any]:
        i = out["index"]
        return {k: i[k] for k in ("files", "indexed", "unchanged", "removed")}

    first = s.found("alpha")
    assert index(first) == {"files": 3, "indexed": 3, "unchanged": 0, "removed": 0}
    assert [r["path"] for r in first["results"]] == ["a.py"]
    again = s.found("alpha")
    assert index(again) == {"files": 3, "indexed": 0, "unchanged": 3, "removed": 0}
    assert again["index"]["bytes_read"] == 0

    # Changed: read again, its old words gone.
    b = s.write("b.py", "delta = 2\n")
    os.utime(b, ns=(b.stat().st_atime_ns, b.stat().st_mtime_ns + 10**9))
    changed = s.found("delta")
    assert index(changed) == {"files": 3, "indexed": 1, "unchanged": 2, "removed": 0}
    assert [r["path"] for r in changed["results"]] == ["b.py"]
    assert s.found("beta")["results"] == []

    # Added.
    s.write("sub/d.py", "epsilon = 4\n")
    added = s.found("epsilon")
    assert index(added) == {"files": 4, "indexed": 1, "unchanged": 3, "removed": 0}
    assert [r["path"] for r in added["results"]] == ["sub/d.py"]

    # Removed.
    (s.ws / "a.py").unlink()
    removed = s.found("alpha")
    assert index(removed) == {"files": 3, "indexed": 0, "unchanged": 3, "removed": 1} and removed["results"] == []

    # Replaced by another file of the same size and time (a rename over it): a new inode.
    c = s.ws / "c.py"
    before = c.stat()
    (s.ws / "new.tmp").write_text("kappa = 3\n")
    os.utime(s.ws / "new.tmp", ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(s.ws / "new.tmp", c)
    replaced = s.found("kappa")
    assert index(replaced)["indexed"] == 1 and [r["path"] for r in replaced["results"]] == ["c.py"]
    assert s.found("gamma")["results"] == []


def test_what_is_never_indexed(s: Search) -> None:
    ws, outside = s.ws, s.outside
    s.configure(code="max_file_bytes = 1000")
    s.write("lib/ok.py", "needle = 1\n")
    s.write(".gitignore", "build/\n")
    s.write("build/gen.py", "needle = 2\n")                 # .gitignore'd
    s.write(".hidden/h.py", "needle = 3\n")                 # hidden
    s.write(".dotfile", "needle = 4\n")
    s.write(".env", "needle=5\n")                           # denied (and hidden)
    s.write("keys/id_rsa", "needle 6\n")                    # denied
    s.write("server.pem", "needle 7\n")
    s.write("config/credentials.json", '{"needle": 8}\n')
    (ws / "blob.bin").write_bytes(b"needle\x00\x01\x02 needle\n")   # binary
    s.write("big.txt", "needle\n" + "x" * 2000)             # over max_file_bytes
    (outside / "x.py").write_text("needle = 9\n")
    (ws / "link.py").symlink_to(outside / "x.py")           # links are not followed
    (ws / "outdir").symlink_to(outside)
    (outside / "h.txt").write_text("needle 10\n")
    os.link(outside / "h.txt", ws / "hard.txt")             # a hard link may lead outside
    os.mkfifo(ws / "pipe")                                  # would hang a reader
    out = s.found("needle", limit=100)
    assert [r["path"] for r in out["results"]] == ["lib/ok.py"]
    assert out["index"]["files"] == 1
    assert out["index"]["skipped"] >= 2                     # binary, hard link (and the FIFO if rg lists it)
    assert s.found("needle", limit=100)["index"]["unchanged"] == out["index"]["indexed"] + 1  # (+ the binary file)


def test_a_name_denied_later_is_never_returned(s: Search) -> None:
    s.write("notes/secret.txt", "launch codes\n")
    assert [r["path"] for r in s.found("launch codes")["results"]] == ["notes/secret.txt"]
    s.configure(rest='[files]\ndeny_also = ["secret.txt"]')
    assert s.found("launch codes")["results"] == []


# --- codebases and users --------------------------------------------------------------------


def codebases(s: Search, tmp: Path) -> tuple[Path, Path, Path]:
    web, api, alice = tmp / "code" / "web", tmp / "code" / "api", tmp / "alice"
    for d, word in ((web, "webword"), (api, "apiword"), (alice, "aliceword")):
        (d / "src").mkdir(parents=True)
        (d / "src" / "main.ts").write_text(f"const x = {word};\n")
    (s.ws / "ws.txt").write_text("wsword webword\n")
    return web, api, alice


def test_a_caller_searches_only_the_codebases_granted(s: Search, tmp_path: Path) -> None:
    web, api, alice = codebases(s, tmp_path)
    s.configure(code='default_codebases = ["api"]',
                rest=f'[codebases]\nweb = "{web}"\napi = "{api}"\n'
                     f'[users.alice]\nroots = ["{alice}"]\ncodebases = ["web"]\n[users.bob]\n')

    def call(user: str | None, **inputs: Any) -> dict[str, Any]:
        return {"aid": OURS, "input_json": json.dumps({"query": "webword apiword aliceword wsword", **inputs}),
                **({"user": user} if user else {})}

    r = s.serve(call("alice", codebase_id="web"), call("alice", codebase_id="api"), call("alice", codebase_id="nope"),
                call("alice"), call(None, codebase_id="api"), call(None, codebase_id="web"), call(None),
                call("bob", codebase_id="api"), call("bob"), call("carol", codebase_id="api"),
                {"aid": SUBJECT, "input_json": json.dumps({"query": "webword", "codebase_id": "web"}), "user": "alice"})
    web_hit = output(r[0])
    assert web_hit["codebase_id"] == "web" and [x["path"] for x in web_hit["results"]] == ["src/main.ts"]
    assert "webword" in web_hit["results"][0]["snippet"]
    # Unknown and not granted read alike: nothing says which ids exist.
    refused(r[1], "access_denied", "codebase 'api' is not available to this caller")
    refused(r[2], "access_denied", "codebase 'nope' is not available to this caller")
    assert [x["snippet"] for x in output(r[3])["results"]] == ["const x = aliceword;"]  # alice's own roots
    assert "apiword" in output(r[4])["results"][0]["snippet"]                           # default_codebases
    refused(r[5], "access_denied", "codebase 'web' is not available")
    assert [x["path"] for x in output(r[6])["results"]] == ["ws.txt"]                    # the [files] roots
    refused(r[7], "access_denied", "codebase 'api' is not available")                   # bob: listed, none of his
    assert [x["path"] for x in output(r[8])["results"]] == ["ws.txt"]
    assert "apiword" in output(r[9])["results"][0]["snippet"]                           # an unknown user: the defaults
    assert output(r[10]) == [{"path": "src/main.ts", "line": 1, "snippet": "const x = webword;",
                              "similarity": output(r[10])[0]["similarity"]}]
    s.configure(top="unknown_users = false", rest=f'[codebases]\napi = "{api}"\n')
    refused(s.search("apiword", user="carol", codebase_id="api"), "access_denied", "user 'carol' is not in the policy")


def test_a_granted_codebase_gone_from_disk_is_not_found(s: Search, tmp_path: Path) -> None:
    web, _, _ = codebases(s, tmp_path)
    s.configure(code='default_codebases = ["web"]', rest=f'[codebases]\nweb = "{web}"\n')
    (s.tmp / "policy.toml").write_text(s.policy_text)
    proc = subprocess.Popen([TOOLHOST, "--serve", "--policy", str(s.tmp / "policy.toml")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(s.ws)}))
    assert proc.stdin is not None and proc.stdout is not None
    try:
        def ask(**inputs: Any) -> dict[str, Any]:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write((json.dumps({"aid": OURS, "input_json": json.dumps(inputs)}) + "\n").encode())
            proc.stdin.flush()
            return dict(json.loads(proc.stdout.readline()))

        assert output(ask(query="webword", codebase_id="web"))["results"]
        for p in sorted(web.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        web.rmdir()
        refused(ask(query="webword", codebase_id="web"), "target_not_found", "codebase 'web': its directory is missing")
        refused(ask(query="webword", codebase_id="other"), "access_denied", "not available")
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_results_from_a_second_root_are_absolute(s: Search, tmp_path: Path) -> None:
    second = tmp_path / "second"
    second.mkdir()
    (second / "far.txt").write_text("farword\n")
    (s.ws / "near.txt").write_text("nearword\n")
    s.configure(rest=f'[files]\nroots = ["{s.ws}", "{second}"]')
    assert {r["path"] for r in s.found("farword nearword")["results"]} == {"near.txt", f"{second}/far.txt"}


# --- queries and bad input ------------------------------------------------------------------


@pytest.mark.parametrize("query", [
    '"', '""', '"handler', 'handler"', "*", "handler*", "NEAR(", "NEAR(handler x, 1)", "col:", "text:handler",
    "idents:handler", "(", ")", "((handler)", "handler)", "AND", "OR handler", "NOT handler", "-handler", "+handler",
    "^handler", "{text}: handler", ":", "'", "'; DROP TABLE files; --", "\\", "—", "\u0001\u0002", "a\"b\"c",
    "handler OR", "rank:", "chunks", "MATCH", "handler AND NOT x",
])
def test_queries_that_look_like_fts5_syntax_are_plain_words(s: Search, query: str) -> None:
    s.write("h.ts", "export function handler() {}\n")
    s.write("other.txt", "nothing else\n")
    r = s.search(query)
    assert r["ok"] is True, r
    assert all(x["path"] in ("h.ts", "other.txt") for x in output(r)["results"])
    service = s.search(query, aid=SUBJECT)
    assert service["ok"] is True and isinstance(output(service), list), service


def test_a_quoted_word_is_still_found(s: Search) -> None:
    s.write("h.ts", "export function handler() {}\n")
    for q in ['"handler"', "handler*", "(handler)", "handler()", "-handler", "handler:"]:
        assert [x["path"] for x in s.found(q)["results"]] == ["h.ts"], q


@pytest.mark.parametrize(("aid", "inputs", "code", "contains"), [
    (OURS, {"query": ""}, "invalid_input", "query must hold at least one word"),
    (SUBJECT, {"query": " \t\n "}, "invalid_input", "query must hold at least one word"),
    (FUNCTION, {"query": "x" * 1001}, "invalid_input", "query is 1001 bytes, over the limit of 1000"),
    (OURS, {"query": " ".join(["w"] * 33)}, "invalid_input", "query has more than 32 words"),
    (SUBJECT, {"query": "a\u0000b"}, "invalid_input", "NUL"),
    (SUBJECT, {"query": "x", "limit": 0}, "invalid_input", "limit must be a whole number from 1 to 100"),
    (SUBJECT, {"query": "x", "limit": 101}, "invalid_input", "limit must be a whole number from 1 to 100"),
    (FUNCTION, {"query": "x", "limit": 2.5}, "schema_violation", "limit"),
    (SUBJECT, {"query": "x", "codebase_id": ""}, "invalid_input", "codebase_id must be a string of 1 to 256 bytes"),
    (SUBJECT, {"query": "x", "codebase_id": "c" * 257}, "invalid_input", "codebase_id must be a string"),
    (OURS, {"query": "x", "limit": 0}, "schema_violation", "limit"),
    (OURS, {"query": "x", "codebase_id": "c" * 257}, "schema_violation", "codebase_id"),
    (OURS, {"query": "x", "path": "."}, "schema_violation", "path"),
    (SUBJECT, {"query": 5}, "schema_violation", "query"),
    (SUBJECT, {}, "schema_violation", "query"),
])
def test_bad_input_is_refused_and_the_host_serves_on(s: Search, aid: str, inputs: dict[str, Any], code: str,
                                                     contains: str) -> None:
    s.write("a.txt", "x\n")
    r = s.serve({"aid": aid, "input_json": json.dumps(inputs)},
                {"aid": OURS, "input_json": json.dumps({"query": "x"})})
    if code == "schema_violation":
        assert r[0]["ok"] is False and r[0]["code"] == code and contains in r[0]["error"], r[0]
    else:
        refused(r[0], code, contains)
    assert [x["path"] for x in output(r[1])["results"]] == ["a.txt"]


# --- caps -----------------------------------------------------------------------------------


def five(s: Search) -> None:
    for name in "abcde":
        s.write(f"{name}.txt", f"common word{name} " + "z" * 40 + "\n")  # 54 bytes each


def test_limit_caps_the_results(s: Search) -> None:
    five(s)
    assert len(s.found("common", limit=2)["results"]) == 2
    assert len(s.found("common")["results"]) == 5
    assert len(output(s.search("common", aid=SUBJECT, limit=3))) == 3


def test_at_most_max_index_files_are_indexed(s: Search) -> None:
    five(s)
    s.configure(code="max_index_files = 3")
    out = s.found("common")
    assert {r["path"] for r in out["results"]} == {"a.txt", "b.txt", "c.txt"}   # the first by path
    assert out["truncated"] is True and out["index"]["more_files"] is True and out["index"]["files"] == 3
    assert s.found("worde")["results"] == []
    s.configure(code="max_index_files = 5")
    whole = s.found("common")
    assert whole["truncated"] is False and whole["index"]["files"] == 5 and whole["index"]["indexed"] == 2


def test_a_refresh_reads_at_most_max_refresh_bytes_and_the_next_goes_on(s: Search) -> None:
    five(s)
    s.configure(code="max_refresh_bytes = 100")   # one 56-byte file a refresh (the first always fits)
    seen = []
    for _ in range(5):
        out = s.found("common")
        seen.append((out["index"]["indexed"], out["index"]["pending"], out["truncated"], len(out["results"])))
    assert seen == [(1, 4, True, 1), (1, 3, True, 2), (1, 2, True, 3), (1, 1, True, 4), (1, 0, False, 5)]


def test_at_most_max_index_bytes_are_indexed(s: Search) -> None:
    five(s)
    s.configure(code="max_index_bytes = 150")
    out = s.found("common")
    assert out["index"]["files"] == 2 and out["index"]["over_cap"] == 3 and out["truncated"] is True
    assert len(out["results"]) == 2


@pytest.mark.parametrize(("text", "message"), [
    ("[code]\nmax_index_files = 0\n", "field 'max_index_files': must be from 1 to"),
    ("[code]\nmax_refresh_bytes = -5\n", "field 'max_refresh_bytes': must be from 1 to"),
    ("[code]\nmax_index_bytes = 'lots'\n", "field 'max_index_bytes': must be an integer"),
    ("[code]\ndefault_codebases = ['nope']\n", "[code]: field 'default_codebases': 'nope' is not in [codebases]"),
    ("[code]\nindex_dir = ''\n", "field 'index_dir': must name a directory"),
    ("[code]\nindex_dir = 'WS/.index'\n", "field 'index_dir': 'WS/.index' overlaps the root 'WS'"),
    ("[code]\nindex_dir = 'WS'\n", "overlaps the root 'WS'"),
    ("[code]\nindex_dir = 'TMP'\n", "overlaps the root"),                       # holds the root
    ("[code]\nindex_dir = 'TMP/cb/idx'\n[codebases]\ncb = 'TMP/cb'\n", "overlaps the root 'TMP/cb'"),
    ("[code]\nindex_dir = 'TMP/al/idx'\n[users.a]\nroots = ['TMP/al']\n", "overlaps the root 'TMP/al'"),
])
def test_a_bad_code_policy_stops_the_host(s: Search, text: str, message: str) -> None:
    for d in ("cb", "al"):
        (s.tmp / d).mkdir()
    text = text.replace("WS", str(s.ws)).replace("TMP", str(s.tmp))
    message = message.replace("WS", str(s.ws)).replace("TMP", str(s.tmp))
    (s.tmp / "policy.toml").write_text(text)
    proc = subprocess.run([TOOLHOST, "--serve", "--policy", str(s.tmp / "policy.toml")], input=b"",
                          capture_output=True, env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(s.ws)}), timeout=30)
    assert proc.returncode == 2 and message in proc.stderr.decode(), proc.stderr


# --- where the index lives ------------------------------------------------------------------


def test_the_index_lives_outside_the_roots_and_no_file_tool_reaches_it(s: Search) -> None:
    filler(s, files=3)
    before = snapshot(s.ws)
    assert s.found("compute")["results"]
    assert snapshot(s.ws) == before                          # a search writes nothing beneath a root
    dbs = list(s.index.glob("*.sqlite"))
    assert len(dbs) == 1 and stat.S_IMODE(s.index.stat().st_mode) == 0o700
    refused(s.call("readFile", path=str(dbs[0])), "access_denied", "outside the allowed directories")
    refused(s.call("readFile", path=f"../index/{dbs[0].name}"), "access_denied", "'..'")
    refused(s.call("AID.CODE.GREP.v1", pattern="compute", path=str(s.index)), "access_denied", "outside")
    assert not any(e["path"].endswith(".sqlite") for e in output(s.call("listFiles", path=".", recursive=True)))


def test_the_default_index_dir_is_the_users_cache(s: Search) -> None:
    s.policy("")
    s.write("a.txt", "cached word\n")
    cache = s.tmp / "cache"
    r = s.serve({"aid": OURS, "input_json": json.dumps({"query": "cached"})}, env={"XDG_CACHE_HOME": str(cache)})
    assert [x["path"] for x in output(r[0])["results"]] == ["a.txt"]
    index = cache / "machina-toolhost" / "code-index"
    assert len(list(index.glob("*.sqlite"))) == 1 and stat.S_IMODE(index.stat().st_mode) == 0o700


def test_a_default_index_dir_inside_a_root_is_refused_at_search(s: Search) -> None:
    s.policy("")
    s.write("a.txt", "word\n")
    before = snapshot(s.ws)
    r = s.serve({"aid": OURS, "input_json": json.dumps({"query": "word"})},
                {"aid": "readFile", "input_json": json.dumps({"path": "a.txt"})},
                env={"XDG_CACHE_HOME": str(s.ws / ".cache")})
    refused(r[0], "system_error", "the default index_dir")
    assert "set [code] index_dir" in r[0]["error"]
    assert output(r[1]) == "word\n"                           # the other tools serve on
    assert snapshot(s.ws) == before
    s.configure()                                             # index_dir set: the default does not matter
    r = s.serve({"aid": OURS, "input_json": json.dumps({"query": "word"})},
                env={"XDG_CACHE_HOME": str(s.ws / ".cache")})
    assert [x["path"] for x in output(r[0])["results"]] == ["a.txt"]
    assert snapshot(s.ws) == before


def test_an_index_dir_others_may_write_to_is_refused(s: Search) -> None:
    s.write("a.txt", "word\n")
    s.index.mkdir()
    s.index.chmod(0o777)
    refused(s.search("word"), "system_error", "is not this user's alone")
    assert list(s.index.iterdir()) == []


def test_a_damaged_index_is_made_again(s: Search) -> None:
    s.write("a.txt", "word\n")
    assert s.found("word")["index"]["indexed"] == 1
    (db,) = s.index.glob("*.sqlite")
    db.write_bytes(b"this is not a database" * 100)
    again = s.found("word")
    assert again["index"]["indexed"] == 1 and [r["path"] for r in again["results"]] == ["a.txt"]


# --- deadline and concurrency ---------------------------------------------------------------


def test_a_search_past_its_deadline_times_out_and_the_next_finishes(s: Search) -> None:
    for f in range(1500):
        s.write(f"d{f // 100}/f{f}.txt", f"token{f} " + " ".join(FILLER) * 100 + "\n")
    r = s.serve({"aid": OURS, "input_json": json.dumps({"query": "token7"}), "timeout_ms": 5},
                {"aid": OURS, "input_json": json.dumps({"query": "token7"}), "timeout_ms": 120_000},
                {"aid": OURS, "input_json": json.dumps({"query": "token7"})})
    assert r[0]["ok"] is False and r[0]["code"] == "timeout", r[0]
    done = output(r[1])
    assert done["index"]["files"] == 1500 and [x["path"] for x in done["results"]] == ["d0/f7.txt"]
    assert output(r[2])["index"]["indexed"] == 0


def test_concurrent_searches_share_one_index_and_read_each_file_once(s: Search) -> None:
    filler(s, files=300, lines=20)
    (s.tmp / "policy.toml").write_text(s.policy_text)
    line = (json.dumps({"aid": OURS, "input_json": json.dumps({"query": "compute offset", "limit": 5})}) + "\n") * 2
    procs = [subprocess.Popen([TOOLHOST, "--serve", "--workers", "2", "--policy", str(s.tmp / "policy.toml")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(s.ws)})) for _ in range(3)]
    outs = [p.communicate(line.encode(), timeout=120) for p in procs]
    answers = [json.loads(x) for out, _ in outs for x in out.splitlines()]
    assert len(answers) == 6 and all(a["ok"] for a in answers), answers
    found = [json.loads(a["output_json"]) for a in answers]
    assert sum(f["index"]["indexed"] for f in found) == 300          # one refresh at a time: each file read once
    assert all(f["index"]["files"] == 300 for f in found)
    assert len({json.dumps(f["results"]) for f in found}) == 1


def test_over_nats_the_service_subject_answers_data_or_error(s: Search) -> None:
    from nats_support import Front, nats_server
    from test_nats import request

    filler(s, files=5)
    s.write("src/handler.ts", "\nasync function handler(req, res) {...}\n")
    (s.tmp / "policy.toml").write_text(s.policy_text)
    env = {"MACHINA_TOOLHOST_WORKSPACE": str(s.ws), "MACHINA_TOOLHOST_POLICY": str(s.tmp / "policy.toml")}
    with nats_server(jetstream=False) as url, Front(url, env=env, log_dir=s.tmp):
        body, _ = request(url, "tools.code.search", {"query": "async function handler", "limit": 1})
        assert body == {"data": [{"path": "src/handler.ts", "line": 2,
                                  "snippet": "async function handler(req, res) {...}",
                                  "similarity": body["data"][0]["similarity"]}], "error": None}
        body, headers = request(url, "tools.code.search", {"query": "x", "codebase_id": "my-proj"})
        assert body == {"data": None, "error": "AccessDenied: codebase 'my-proj' is not available to this caller"}
        assert headers["Nats-Service-Error-Code"] == "403"
        body, _ = request(url, "tools.code.search", {"query": ""})
        assert body["data"] is None and body["error"].startswith("InvalidInput: ")
        call = {"tool_call_id": "call_1", "function": {"name": "searchCode",
                                                       "arguments": json.dumps({"query": "handler"})}}
        body, _ = request(url, "tools.code.search", call)
        assert body["tool_call_id"] == "call_1" and body["name"] == "searchCode"
        assert json.loads(body["content"])[0]["path"] == "src/handler.ts"

"""Comments and docs say what is true now: no history ("used to", "no longer", "the earlier
name"), no measured figures (they belong in the benchmark report, docs/bench-latest/report.md),
and no behaviour named after the document it came from ("seed", "the original host",
"ADR-32"; docs/specifications.md links the specifications instead).

The comments of C and C++ (// and /* */), Python (# and docstrings), CMake and shell (#) and
the prose of docs/*.md and README.md are read. An exception is a line of
tests/comment_allowlist.txt, `path: text`, where text is part of the comment it allows; an
exception that allows nothing fails too, so the list holds only what is still there."""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO

ALLOWLIST = Path(__file__).with_name("comment_allowlist.txt")

CODE_DIRS = ("toolhost", "python", "plugins", "tests", "bench", "fuzz", "scripts", "examples", "docs")
SKIP_DIRS = {"__pycache__", ".mypy_cache", "transcripts", "bench-latest", "build", ".venv", "corpus"}
C_SUFFIXES = (".cpp", ".hpp", ".h", ".c", ".cc", ".def")
HASH_SUFFIXES = (".sh", ".cmake", ".txt", ".toml", ".yaml", ".yml")
# The allowlist and this file quote the words they look for.
SKIP_FILES = {"tests/comment_allowlist.txt", "tests/test_comments.py"}

# History: wording that describes a change rather than what holds.
HISTORY = [
    r"(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )(?<!\bwas )(?<!\bwere )(?<!\bbeing )(?<!\bget )\bused to\b",
    r"\bno longer\b(?! than)",
    r"\banymore\b",
    r"\bpreviously\b",
    r"\bformerly\b",
    r"\bhistorical(ly)?\b",
    r"\bthis round\b",
    r"\b(earlier|older|former|previous|old) (name|machine|version|release|design|code|implementation|behaviou?r)\b",
    r"\bthe (development|earlier|previous|old) machine\b",
    r"\bwas (changed|replaced|renamed|moved|rewritten|introduced|added)\b",
    r"\b(before|after|since|until) (this|the) (change|commit|rewrite|refactor(ing)?|patch|renovation)\b",
    r"\bnow\b[^.;:]{0,40}\binstead\b",
    r"\bnow (takes|uses|lives|goes|comes|runs)\b",
]
# Measured figures: a time with a fine unit, a speed-up, a before/after count, a profile.
FIGURE = [
    r"(?<![\w.])\d[\d.,\u202f]*\s?(ns|µs|us)(?!\w)",
    r"\b(about|some|nearly|roughly|around|~|≈) ?\d[\d.,\u202f]*\s?(ms|s|µs|us|ns|%)(?!\w)",
    r"(?<![\w.])\d+(\.\d+)? ?% (faster|slower|less|more|of the (time|cost))",
    r"(?<![\w.])\d+(\.\d+)? ?(x|×) (faster|slower|as fast|the cost|less|more)\b",
    r"(?<![\w.])\d+ ?(->|→) ?\d+\b",
    r"(?<![\w.])\d[\d.,\u202f]*\s?(ms|s|µs|us|ns|%|x|×)(?!\w)[^.;]{0,30}\b(here|there)\b",
    r"\bin the profile\b",
    r"\bthe profiler? (shows?|showed)\b",
    r"\bcosts? (about|nearly|some|roughly|around)\b",
    r"\d ?(calls|requests|operations)/s\b",
]
# A behaviour named after the document it came from rather than what it does.
SOURCE_NAME = [
    r"(?<![\w-])seed(?![\w-]*(random|hash|rng|corpus))(?!ed)",
    r"\bthe original('s\b| (host|client|toolhost|implementation|dispatch|server|protocol|project|service|system"
    r"|runner|one)s?\b)",
    r"\bADR-?32\b",
]
# "seed" of a random or hash generator is that, not a name of a behaviour.
SEED_OF_A_GENERATOR = re.compile(r"random|hash|rng|prng|srand|mt19937|fuzz|corpus|shuffle|entropy|hypothesis|xxh", re.I)
# The same in code: an identifier or a string value built on "seed".
SEED_IN_CODE = re.compile(r"(?<![a-z0-9])seeds?(?![a-z0-9])", re.I)
CODE_SUFFIXES = (".py", ".pyi", ".cpp", ".hpp", ".h", ".c", ".def")

RULES = [("history", re.compile("|".join(HISTORY), re.I)), ("figure", re.compile("|".join(FIGURE), re.I)),
         ("source-name", re.compile("|".join(SOURCE_NAME), re.I))]


def c_comments(text: str) -> Iterator[tuple[int, str]]:
    """The comments of C or C++ source, a line each, with string and character literals
    (raw strings included) skipped."""
    i, line, n = 0, 1, len(text)
    while i < n:
        ch = text[i]
        if ch == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            yield line, text[i + 2:end]
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end
            for k, part in enumerate(text[i + 2:end].split("\n")):
                yield line + k, part
            line += text.count("\n", i, end)
            i = end + 2
        elif ch == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            open_paren = text.find("(", i + 2)
            delim = text[i + 2:open_paren]
            end = text.find(")" + delim + '"', open_paren)
            end = n if end < 0 else end + len(delim) + 2
            line += text.count("\n", i, end)
            i = end
        elif ch in "\"'":
            if ch == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != ch and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1


def python_comments(text: str) -> Iterator[tuple[int, str]]:
    """The # comments and the docstrings of Python source, a line each."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT and not tok.string.startswith("#!"):
                yield tok.start[0], tok.string[1:]
        tree = ast.parse(text)
    except (SyntaxError, tokenize.TokenError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                for k, part in enumerate(first.value.value.split("\n")):
                    yield first.lineno + k, part


def hash_comments(text: str) -> Iterator[tuple[int, str]]:
    """The # comments of shell, CMake and configuration files (a # inside quotes is not one)."""
    for number, raw in enumerate(text.split("\n"), 1):
        quote = ""
        for k, ch in enumerate(raw):
            if quote:
                quote = "" if ch == quote else quote
            elif ch in "\"'":
                quote = ch
            elif ch == "#" and not raw.startswith("#!"):
                yield number, raw[k + 1:]
                break


def markdown_prose(text: str) -> Iterator[tuple[int, str]]:
    """The lines of a Markdown page outside fenced code blocks."""
    fenced = False
    for number, raw in enumerate(text.split("\n"), 1):
        if raw.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced:
            yield number, raw


def comments_of(rel: str, text: str) -> Iterator[tuple[int, str]]:
    name = os.path.basename(rel)
    if rel.endswith(".py") or rel.endswith(".pyi"):
        return python_comments(text)
    if rel.endswith(C_SUFFIXES):
        return c_comments(text)
    if rel.endswith(".md"):
        return markdown_prose(text)
    if rel.endswith(HASH_SUFFIXES) or name in ("CMakeLists.txt", "commit-msg", "run"):
        return hash_comments(text)
    return iter(())


def scanned_files() -> Iterator[tuple[str, str]]:
    roots = [REPO / d for d in CODE_DIRS] + [REPO / "CMakeLists.txt", REPO / "README.md", REPO / ".ci" / "run"]
    for root in roots:
        if root.is_file():
            yield root.relative_to(REPO).as_posix(), root.read_text(errors="replace")
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
            for filename in sorted(filenames):
                rel = (Path(dirpath) / filename).relative_to(REPO).as_posix()
                if rel in SKIP_FILES:
                    continue
                yield rel, (Path(dirpath) / filename).read_text(errors="replace")


def findings(rel: str, text: str) -> Iterator[tuple[int, str, str, str]]:
    """(line, rule, matched words, comment) for each comment line of one file that breaks a rule."""
    for number, comment in comments_of(rel, text):
        for rule, pattern in RULES:
            match = pattern.search(comment)
            if match is None:
                continue
            if rule == "source-name" and match.group(0).lower() == "seed" and SEED_OF_A_GENERATOR.search(comment):
                continue
            yield number, rule, match.group(0), comment.strip()
            break


def load_allowlist() -> list[tuple[str, str]]:
    entries = []
    for raw in ALLOWLIST.read_text().splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        path, sep, words = raw.partition(": ")
        assert sep and words.strip(), f"{ALLOWLIST.name}: {raw!r} is not `path: text of the comment`"
        entries.append((path.strip(), words.strip()))
    return entries


def seed_names_in_code() -> Iterator[tuple[str, int, str, str, str]]:
    for rel, text in scanned_files():
        if not rel.endswith(CODE_SUFFIXES) or rel.startswith("fuzz/"):
            continue
        for number, line in enumerate(text.split("\n"), 1):
            match = SEED_IN_CODE.search(line)
            if match and not SEED_OF_A_GENERATOR.search(line):
                yield rel, number, "source-name", match.group(0), line.strip()


def all_findings() -> list[tuple[str, int, str, str, str]]:
    in_comments = [(rel, *hit) for rel, text in scanned_files() for hit in findings(rel, text)]
    seen = {(rel, line) for rel, line, *_ in in_comments}
    return in_comments + [hit for hit in seed_names_in_code() if hit[:2] not in seen]


@pytest.fixture(scope="module")
def found() -> list[tuple[str, int, str, str, str]]:
    return all_findings()


def test_comments_say_what_is_true_now(found: list[tuple[str, int, str, str, str]]) -> None:
    allowed = load_allowlist()
    left = [f"{rel}:{line}: {rule} ({words!r}): {comment[:160]}" for rel, line, rule, words, comment in sorted(found)
            if not any(rel == path and text in comment for path, text in allowed)]
    assert not left, ("state what holds (figures go to the benchmark report, history to git, a specification "
                      "is linked from docs/specifications.md), or add `path: comment text` to "
                      f"tests/{ALLOWLIST.name} if the words mean something else here:\n" + "\n".join(left))


def test_every_exception_still_allows_something(found: list[tuple[str, int, str, str, str]]) -> None:
    stale = [f"{path}: {text}" for path, text in load_allowlist()
             if not any(rel == path and text in comment for rel, _, _, _, comment in found)]
    assert not stale, f"remove these lines from tests/{ALLOWLIST.name}, they allow nothing:\n" + "\n".join(stale)


@pytest.mark.parametrize("comment", [
    "The earlier name stays for callers that import it.",
    "A batch with none of its calls open used to be counted twice.",
    "the log no longer shares its buffer",
    "Before default_timeout_ms was added, the host accepted a smaller size.",
    "the host now takes the lock instead of the caller",
    "9 ns less a fresh key on the development machine",
    "Reading the clock twice per call showed in the profile.",
    "the static link drops the relocations (69 -> 41)",
    "made a cache of a million keys 19 % slower there",
    "some 5 ms here, so that an error at start-up",
    "starting it costs about what starting /bin/true does",
    "answers as the original host did",
    "a fresh interpreter per call, the original's runner",
    "the seed's error types",
    "seed-001 skills and MCP servers",
    "NATS micro (ADR-32) endpoints",
])
def test_each_rule_fires(comment: str) -> None:
    assert list(findings("x.cpp", f"int x; // {comment}\n")), comment
    assert list(findings("x.py", f"x = 1  # {comment}\n")), comment
    assert list(findings("x.md", f"{comment}\n")), comment


@pytest.mark.parametrize("comment", [
    "The key is used to sign the lease.",
    "A call that ran before the deadline was answered.",
    "Waits until every call recorded before this one is written.",
    "start_timeout_ms must be from 1 ms to 24 hours",
    "retries after 100 ms, then 200 ms",
    "the hash seed of the process; a random seed for the shuffle",
    "The new key takes the evicted entry's slot.",
])
def test_plain_runtime_wording_passes(comment: str) -> None:
    assert not list(findings("x.cpp", f"int x; // {comment}\n")), comment


def test_the_scanner_reads_comments_not_code() -> None:
    cpp = 'auto s = "// seed"; auto r = R"x(/* seed */)x"; char c = \'"\'; int n = 1\'000; // used to\n'
    assert [(line, words) for line, _, words, _ in findings("x.cpp", cpp)] == [(1, "used to")]
    py = '"""Module: no longer."""\ns = "# seed"\n# 19 % slower\n'
    assert [(line, rule) for line, rule, _, _ in findings("x.py", py)] == [(3, "figure"), (1, "history")]
    md = "```\nused to\n```\nthe original client\n"
    assert [line for line, _, _, _ in findings("x.md", md)] == [4]


@pytest.mark.parametrize("line", ['SEED_TYPES = ("timeout", "crash")', 'if methods == "seed":',
                                  "const char* seed_method;", "def test_the_seed_shape() -> None:",
                                  "def test_the_seeds_manual_session() -> None:"])
def test_a_seed_name_in_code_is_found(line: str) -> None:
    assert SEED_IN_CODE.search(line) and not SEED_OF_A_GENERATOR.search(line), line


@pytest.mark.parametrize("line", ["random.seed(7)", "seed_ = (std::uint64_t{entropy()} << 32) | entropy();",
                                  "XXH3_64bits_withSeed(key.data(), key.size(), seed_ + n);"])
def test_a_generator_seed_in_code_passes(line: str) -> None:
    assert not SEED_IN_CODE.search(line) or SEED_OF_A_GENERATOR.search(line), line

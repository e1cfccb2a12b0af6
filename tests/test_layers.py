"""The layers of the C++ code and the edges between them, read from the sources (no build).

Each file's layer is the folder it sits in: toolhost/<layer>/ (include/machina/ and src/) for the
libraries, toolhost/cli/ for the executable's fronts, python/src/ for the binding, fuzz/ and
tests/unit/ for the tests, plugins/ and the other plugin sources for code that sees only the plugin
ABI. An #include that crosses to a layer the table below does not allow fails with
`file:line -> header (layer A may not include layer B)`. The CMake targets enforce the same edges
at compile time (each library exports its own include root only); this test names the edge
without a build, and also the edges a target cannot refuse (runners see the host layer's
interface headers only). docs/architecture.md draws the same table; the test holds the three
together."""

from __future__ import annotations

import re
from collections.abc import Iterator

from conftest import REPO

# layer -> the layers it may include besides itself. Every layer may include the plugin ABI.
ALLOWED: dict[str, frozenset[str]] = {
    "base": frozenset(),
    "wire": frozenset({"base"}),
    "host": frozenset({"base"}),
    "runners": frozenset({"base", "wire", "host"}),  # of the host only HOST_INTERFACE
    "assembly": frozenset({"base", "wire", "host", "runners"}),
    "client": frozenset({"base", "wire"}),
    "front_kit": frozenset({"base", "wire", "host"}),
}
# The libraries, bottom up: each a CMake target machina_<layer> built from toolhost/<layer>/.
LIBRARY_LAYERS = tuple(ALLOWED)
# The fronts and tests above them: cli may not include the client (the binding alone uses it).
ALLOWED.update({
    "cli": frozenset({"base", "wire", "host", "runners", "assembly", "front_kit"}),
    "binding": frozenset(LIBRARY_LAYERS),
    "fuzz": frozenset(LIBRARY_LAYERS),
    "unit": frozenset(LIBRARY_LAYERS) | {"cli"},
    "plugin": frozenset(),
})
# What the runners may see of the host layer: the seam they plug into, not the pipeline.
HOST_INTERFACE = frozenset({"machina/runner.hpp", "machina/tool.hpp", "machina/tool_registry.hpp"})
# Headers generated at configure time (CMakeLists.txt, machina_embed_python), private to a layer.
GENERATED = {"machina/python_worker_source.hpp": "runners", "machina/python_exec_source.hpp": "runners"}
PLUGIN_ABI_ROOT = "plugins/include"

CPP_SUFFIXES = (".c", ".cc", ".cpp", ".h", ".hpp", ".def")
SCANNED = ("toolhost", "python/src", "fuzz", "tests/unit", "plugins", "tests/plugins", "docs/example_plugin",
           "bench/native")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def layer_of(rel: str) -> str | None:
    parts = rel.split("/")
    if parts[0] == "toolhost" and len(parts) > 2:
        return "cli" if parts[1] == "cli" else parts[1] if parts[1] in LIBRARY_LAYERS else None
    if rel.startswith("python/src/"):
        return "binding"
    if rel.startswith("fuzz/"):
        return "fuzz"
    if rel.startswith("tests/unit/"):
        return "unit"
    if rel.startswith(("plugins/", "tests/plugins/", "docs/example_plugin/", "bench/native/")):
        return "plugin"
    return None


def sources() -> Iterator[str]:
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*")):
            if path.is_file() and path.suffix in CPP_SUFFIXES:
                yield path.relative_to(REPO).as_posix()


def include_roots() -> dict[str, str]:
    """Include root -> layer: toolhost/<layer>/include of each library, and the plugin ABI."""
    roots = {f"toolhost/{layer}/include": layer for layer in LIBRARY_LAYERS}
    roots[PLUGIN_ABI_ROOT] = "plugin_abi"
    return roots


def resolve(src: str, quote: str, name: str) -> list[tuple[str, str]]:
    """The files (path, layer) an include line can mean: a quoted name beside the includer first,
    then every include root that holds it. System headers resolve to nothing."""
    if quote == '"':
        beside = (REPO / src).parent / name
        if beside.is_file():
            rel = beside.resolve().relative_to(REPO).as_posix()
            return [(rel, layer_of(rel) or "outside")]
    found = []
    for root, layer in include_roots().items():
        if (REPO / root / name).is_file():
            found.append((f"{root}/{name}", layer))
    return found


def include_error(src: str, number: int, quote: str, name: str) -> str | None:
    """Why one include line crosses a forbidden edge, or None."""
    layer = layer_of(src)
    assert layer is not None, src
    where = f"{src}:{number} -> {name}"
    targets = resolve(src, quote, name)
    if not targets:
        if name in GENERATED:
            targets = [(name, GENERATED[name])]
        elif name.startswith("machina/"):
            return f"{where} (no layer holds this header)"
        else:
            return None  # a system or third-party header
    if len(targets) > 1:
        return f"{where} (two layers hold this header: {', '.join(t for t, _ in targets)})"
    target, target_layer = targets[0]
    if target_layer == "plugin_abi" or target_layer == layer:
        return None
    if "/src/" in target and target.startswith("toolhost/"):
        return f"{where} (a private header of layer {target_layer}: include through include/machina)"
    if target_layer not in ALLOWED[layer]:
        return f"{where} (layer {layer} may not include layer {target_layer})"
    if layer == "runners" and target_layer == "host" and name not in HOST_INTERFACE:
        return f"{where} (layer runners may include of layer host only {', '.join(sorted(HOST_INTERFACE))})"
    return None


def scan_includes() -> list[str]:
    """The wrong-way includes, as messages."""
    wrong: list[str] = []
    for src in sources():
        for number, line in enumerate((REPO / src).read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            message = m and include_error(src, number, m.group(1), m.group(2))
            if m and message:
                wrong.append(message)
    return wrong


def test_every_file_has_a_layer() -> None:
    """The layer of a file is its folder: a new folder under toolhost/ is a new layer of the table."""
    folders = {p.name for p in (REPO / "toolhost").iterdir() if p.is_dir()}
    assert folders == set(LIBRARY_LAYERS) | {"cli"}, folders
    for layer in LIBRARY_LAYERS:
        for path in (REPO / "toolhost" / layer).iterdir():
            assert path.name in ("include", "src"), f"{path}: a layer holds include/machina/ and src/ only"
        include = REPO / "toolhost" / layer / "include"
        if include.exists():
            assert [p.name for p in include.iterdir()] == ["machina"], f"{include}: headers go under machina/"
    assert all(layer_of(src) for src in sources())


def test_includes_follow_the_layers() -> None:
    wrong = scan_includes()
    assert not wrong, "\n".join(wrong)


def a_header(layer: str) -> str:
    """One public header of a layer, as an include line names it."""
    root = REPO / "toolhost" / layer / "include"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.hpp"))[0]


def test_a_wrong_include_is_reported() -> None:
    """The check itself, on include lines of real files: downward and upward edges, the host
    interface of the runners, the client kept from the executable, a header no layer holds."""
    wire = a_header("wire")
    assert include_error("toolhost/base/src/errors.cpp", 7, "<", wire) == (
        f"toolhost/base/src/errors.cpp:7 -> {wire} (layer base may not include layer wire)")
    assert include_error("toolhost/wire/src/jsonrpc.cpp", 1, "<", "machina/errors.hpp") is None
    assert "layer runners may include of layer host only" in str(
        include_error("toolhost/runners/src/policy.cpp", 1, "<", "machina/host.hpp"))
    assert include_error("toolhost/runners/src/policy.cpp", 1, "<", "machina/runner.hpp") is None
    assert "layer host may not include layer runners" in str(
        include_error("toolhost/host/src/host.cpp", 1, "<", a_header("runners")))
    client = a_header("client")
    assert "layer cli may not include layer client" in str(include_error("toolhost/cli/main.cpp", 1, "<", client))
    assert include_error("python/src/module.cpp", 1, "<", client) is None
    assert "no layer holds" in str(include_error("toolhost/host/src/host.cpp", 1, "<", "machina/nowhere.hpp"))
    assert include_error("toolhost/host/src/host.cpp", 1, "<", "vector") is None
    assert "private header" in str(
        include_error("toolhost/assembly/src/manifest_tools.cpp", 1, '"', "../../runners/src/packs/packs.hpp"))


# A command-line flag as prose: a string literal holding a --flag among other words. A literal that
# is one argument ("--sandbox-exec", "--max-filesize") is a child's command line, not wording.
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
ONE_ARGUMENT = re.compile(r"--[a-z][a-z0-9-]*(=.*)?")
CORE_LAYERS = ("base", "wire", "host", "runners")


def string_literals(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each string literal of a C++ source, comments and character literals skipped.
    Raw strings are yielded whole."""
    i, line, n = 0, 1, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif text.startswith("//", i):
            i = text.find("\n", i)
            if i < 0:
                return
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            line += text.count("\n", i, end)
            i = end
            continue
        elif c == "R" and text.startswith('"', i + 1) and not (text[i - 1:i].isalnum() or text[i - 1:i] == "_"):
            open_paren = text.find("(", i + 2)
            delimiter = ")" + text[i + 2:open_paren] + '"'
            end = text.find(delimiter, open_paren)
            end = n if end < 0 else end + len(delimiter)
            yield line, text[open_paren + 1:end - len(delimiter)]
            line += text.count("\n", i, end)
            i = end
            continue
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            if c == '"':
                yield line, text[i + 1:j]
            i = j + 1
            continue
        i += 1


def flag_wording(text: str) -> Iterator[tuple[int, str, str]]:
    """(line, flag, literal) for each string literal that names a flag among other words."""
    for line, literal in string_literals(text):
        flags = FLAG.findall(literal)
        if flags and not ONE_ARGUMENT.fullmatch(literal):
            for flag in flags:
                yield line, flag, literal


def test_flag_wording_finder() -> None:
    found = list(flag_wording('f("--serve"); g("add --isolation process"); // "--run here"\n/* "--x y" */ '
                              'h("--index-url=x", "a --no-audit b");'))
    assert [(flag, line) for line, flag, _ in found] == [("--isolation", 1), ("--no-audit", 2)]


def test_core_names_no_command_line_flag() -> None:
    """Messages of base, wire, host and runners speak of the rule, not of a front's flag: the
    fronts add their own wording (the command line, Python keywords)."""
    wrong = []
    for src in sources():
        if layer_of(src) not in CORE_LAYERS or src.endswith("_options.def"):
            continue  # (an option table's help text is the command line's, made into it by the fronts)
        for line, flag, literal in flag_wording((REPO / src).read_text(errors="replace")):
            wrong.append(f"{src}:{line}: {flag} in {literal!r}")
    assert not wrong, "\n".join(wrong)


def test_no_front_enum() -> None:
    """The core knows no list of fronts: each front labels its requests with its own name."""
    pattern = re.compile(r"\benum\s+(class\s+)?Front\b|\bFront::")
    hits = [f"{src}:{n}: {line.strip()}" for src in sources() if layer_of(src) != "plugin"
            for n, line in enumerate((REPO / src).read_text(errors="replace").splitlines(), 1)
            if pattern.search(line)]
    assert not hits, "\n".join(hits)


def cmake_layers() -> list[str]:
    text = (REPO / "CMakeLists.txt").read_text()
    m = re.search(r"^set\(MACHINA_LAYERS ([a-z_ ]+)\)", text, re.M)
    assert m, "CMakeLists.txt sets MACHINA_LAYERS, the libraries bottom up"
    return m.group(1).split()


def test_cmake_targets_are_the_layers() -> None:
    """CMakeLists.txt builds a library per layer, linking the layers this table allows."""
    assert cmake_layers() == list(LIBRARY_LAYERS)
    text = (REPO / "CMakeLists.txt").read_text()
    uses = {m.group(1): frozenset(m.group(2).split())
            for m in re.finditer(r"^set\(MACHINA_LAYER_USES_(\w+)((?: \w+)*)\)", text, re.M)}
    assert uses == {layer: ALLOWED[layer] for layer in LIBRARY_LAYERS}


def doc_layer_table() -> dict[str, tuple[str, frozenset[str]]]:
    """docs/architecture.md's layer table: target -> (folder, the layers it may include)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    m = re.search(r"<!-- layers: checked by tests/test_layers.py -->\n(.*?)<!-- /layers -->", text, re.S)
    assert m, "docs/architecture.md holds the layer table between its markers"
    rows: dict[str, tuple[str, frozenset[str]]] = {}
    for line in m.group(1).splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("machina_") and cells[0] not in ("binding", "fuzz", "unit"):
            continue
        may = frozenset(c.strip().strip("`") for c in cells[2].split(",")) - {"—", ""}
        rows[cells[0]] = (cells[1], may)
    return rows


def test_architecture_doc_draws_the_layers() -> None:
    rows = doc_layer_table()
    expected = {f"machina_{layer}": (f"toolhost/{layer}/", ALLOWED[layer]) for layer in LIBRARY_LAYERS}
    expected["machina_cli"] = ("toolhost/cli/", ALLOWED["cli"])
    assert {k: rows.get(k) for k in expected} == expected
    assert set(rows) - set(expected) <= {"machina_tls", "machina_plugin_loader", "machina_nats_front"}, rows


def test_architecture_doc_names_real_files() -> None:
    """Every path the core's and the fronts' tables name exists (toolhost/ paths are relative to it,
    `inc/` standing for a layer's include/machina/), so the tables follow files that move."""
    text = (REPO / "docs" / "architecture.md").read_text()
    tables = text[text.index("## The core: `toolhost/`"):text.index("## Plugins: `plugins/`")]
    missing = []
    prefixes = tuple(f"{layer}/" for layer in (*LIBRARY_LAYERS, "cli")) + ("python/",)
    for token in re.findall(r"`([^`\s]+/[^`\s]*)`", tables):
        if not token.startswith(prefixes):
            continue  # (a folder named in prose, a method such as tools/call)
        path = token if token.startswith("python/") else "toolhost/" + token
        path = re.sub(r"^toolhost/(\w+)/inc/", r"toolhost/\1/include/machina/", path)
        if not list(REPO.glob(path.rstrip("/"))):
            missing.append(token)
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"

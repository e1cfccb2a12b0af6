#!/usr/bin/env bash
# A short tour of the installed machina-toolhost: its built-in tools, then the example
# pack of Python tools (docs/example_tool_pack/), warm and sandboxed.
set -euo pipefail
pack="$(cd "$(dirname "$0")/.." && pwd)/docs/example_tool_pack/tools.toml"
echo "== machina-toolhost --list (aids and tiers)"
machina-toolhost --list | python3 -c '
import json, sys
for t in json.load(sys.stdin)["tools"]:
    print("  %-22s tier %d  %s" % (t["aid"], t["tier"], t["description"]))
'
echo
echo "== --run AID.TEXT.STATS.v1 (one request on stdin, one response on stdout)"
echo '{"input_json": "{\"text\": \"to be or not to be\", \"top\": 2}"}' | machina-toolhost --run AID.TEXT.STATS.v1
echo
echo "== --serve (NDJSON: one response line per request line)"
machina-toolhost --serve <<'NDJSON'
{"id": 1, "aid": "AID.ECHO.v1", "input_json": "{\"hello\": \"world\"}"}
{"id": 2, "aid": "AID.STATE.PUT.v1", "input_json": "{\"slot\": 3, \"type\": \"note\", \"content\": \"remember me\"}"}
{"id": 3, "aid": "AID.STATE.GET.v1", "input_json": "{\"slot\": 3}"}
{"id": 4, "aid": "AID.ECHO.v1", "input_json": "{\"n\": 1}", "idempotency_key": "k1"}
{"id": 5, "aid": "AID.ECHO.v1", "input_json": "{\"n\": 1}", "idempotency_key": "k1"}
{"id": 6, "aid": "AID.TEXT.STATS.v1", "input_json": "{\"text\": 42}"}
{"id": 7, "aid": "AID.NOPE.v1"}
NDJSON
echo
echo "== Python tools: --serve --tools docs/example_tool_pack/tools.toml (warm workers; the trace says what ran each call)"
machina-toolhost --serve --tools "$pack" <<'NDJSON' | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    t = r.get("trace", {})
    print("  id %-2s %-11s %-40s worker %-7s printed %-20r enforced: %s" % (
        r["id"], r["status"], (r["output_json"] or r["error"])[:40], t.get("worker_pid", "-"),
        t.get("stdout", ""), ", ".join(sorted(t.get("enforcement", {}))) or "-"))
'
{"id": 1, "aid": "AID.EXAMPLE.GREET.v1", "input_json": "{\"name\": \"Ada\"}"}
{"id": 2, "aid": "AID.EXAMPLE.GREET.v1", "input_json": "{\"name\": \"Grace\"}"}
{"id": 3, "aid": "AID.EXAMPLE.GREET.v1", "input_json": "{\"name\": \" \"}"}
{"id": 4, "aid": "AID.EXAMPLE.GREET.v1", "input_json": "{\"nom\": \"x\"}"}
{"id": 5, "aid": "AID.EXAMPLE.WORDS.v1", "input_json": "{\"text\": \"to be or not to be\"}"}
{"id": 6, "aid": "AID.EXAMPLE.SLUG.v1", "input_json": "{\"title\": \"Caf\u00e9 au lait, s'il vous pla\u00eet\"}"}
NDJSON

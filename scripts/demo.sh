#!/usr/bin/env bash
# A short tour of the installed machina-toolhost on its built-in tools.
set -euo pipefail
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

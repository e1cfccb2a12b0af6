"""Text tools, pure functions: safe to run under every guarantee."""

import re
import unicodedata


def word_stats(payload):
    words = re.findall(r"\w+", payload["text"].lower())
    return {"words": len(words), "unique": len(set(words)), "longest": max(words, key=len, default="")}


def slugify(payload):
    text = unicodedata.normalize("NFKD", payload["title"]).encode("ascii", "ignore").decode()
    return {"slug": re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")}

"""The example pack's tools (docs/example_tool_pack/tools.toml)."""

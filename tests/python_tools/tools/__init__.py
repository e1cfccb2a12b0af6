"""Python tools for the tests of the Python runner (tests/test_python_tools.py)."""

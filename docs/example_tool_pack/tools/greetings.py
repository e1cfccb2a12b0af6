"""A tool as a tool-protocol-v1 system expects it: a function of the call's payload."""


def greet(payload):
    name = payload["name"].strip()
    if not name:
        raise ValueError("the name is empty")
    print(f"greeting {name}")  # captured: it shows in the call's trace, never on the wire
    return {"message": f"Hello, {name}!"}

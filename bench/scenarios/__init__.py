"""The benchmark scenarios. Each takes the run's context and returns a Section: tables of
figures measured side by side with their baselines in this run, plots, and the headline
figures the report's goal table reads. One module per family; SCENARIOS names them in the
order a full run takes them."""

from __future__ import annotations

from collections.abc import Callable

from ._context import Ctx, Section, Table
from .clients import inprocess, python_client, spawn
from .isolation import isolation
from .jsonrpc import jsonrpc
from .nats import nats_native, nats_scaleout
from .packs import packs
from .python import python_exec, python_tools
from .rules import audit, ds_state, idempotency
from .serve import lockstep, payload, serve_file, tools, workers

__all__ = ["SCENARIOS", "Ctx", "Section", "Table"]

SCENARIOS: dict[str, Callable[[Ctx], Section]] = {
    "serve": serve_file,
    "lockstep": lockstep,
    "python": python_client,
    "spawn": spawn,
    "inprocess": inprocess,
    "workers": workers,
    "idempotency": idempotency,
    "audit": audit,
    "payload": payload,
    "tools": tools,
    "ds_state": ds_state,
    "isolation": isolation,
    "python_tools": python_tools,
    "jsonrpc": jsonrpc,
    "packs": packs,
    "python_exec": python_exec,
    "nats": nats_scaleout,
    "nats_native": nats_native,
}

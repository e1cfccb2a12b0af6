"""asyncio call rates of the pool from one event loop, echo tool, 20 000 calls each:
``asyncio.gather`` of ``acall`` and one ``acall_many``, with 1 and 2 host processes.

    python -m bench.asyncio_rates
"""

from __future__ import annotations

import asyncio
import time

import machina_dispatch as md

N = 20_000


async def rates(processes: int, rounds: int = 7) -> tuple[float, float]:
    best_gather = best_many = 0.0
    async with md.Pool(processes) as pool:
        await pool.acall_many(("AID.ECHO.v1", i) for i in range(1000))  # the processes are up
        for _ in range(rounds):
            start = time.perf_counter()
            got = await asyncio.gather(*(pool.acall("AID.ECHO.v1", {"i": i}) for i in range(N)))
            best_gather = max(best_gather, N / (time.perf_counter() - start))
            assert all(r.ok for r in got)
            start = time.perf_counter()
            many = await pool.acall_many(("AID.ECHO.v1", {"i": i}) for i in range(N))
            best_many = max(best_many, N / (time.perf_counter() - start))
            assert all(r.ok for r in many)
    return best_gather, best_many


def main() -> None:
    for processes in (1, 2):
        gather, many = asyncio.run(rates(processes))
        print(f"processes={processes}: gather(acall) {gather:,.0f} calls/s   acall_many {many:,.0f} calls/s")


if __name__ == "__main__":
    main()

"""Does the candidate's device memory come back after the judge read an output over CUDA IPC? (issue 16)

A producer process (the candidate's side) puts a 2 GiB output on an `OutputShelf`; a consumer (the judge's
side) opens it, reads it, drops it and calls `release_opened`; the producer then clears its shelf. Printed:
the producer's allocated device memory at each step, so a block parked after the send shows as memory that
stays allocated after the clear. Run on a GPU host with the checkout importable as `kforge` (as scripts/run_gpu_tests.sh arranges).
"""

from __future__ import annotations

import json
import multiprocessing as mp


def consumer(conn) -> None:
    import torch

    from kforge.backends import load_backend
    from kforge.tools.harness.handoff import open_outputs, release_opened

    backend = load_backend("cuda")
    torch.cuda.init()
    for _ in range(3):
        descriptors = json.loads(conn.recv())
        got = open_outputs(descriptors, [], backend)
        total = float(got[0].float().sum())
        del got
        release_opened(backend)
        conn.send(total)


def gib(torch) -> float:
    return round(torch.cuda.memory_allocated() / 2**30, 2)


def main() -> None:
    import torch

    from kforge.backends import load_backend
    from kforge.tools.harness.handoff import OutputShelf

    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=consumer, args=(there,))
    proc.start()
    shelf = OutputShelf(load_backend("cuda"))
    for trial in range(3):
        out = torch.ones(2**29, device="cuda")  # 2 GiB
        before = gib(torch)
        here.send(json.dumps(shelf.put([out])))
        del out
        print(f"trial {trial}: allocated {before} GiB with the output; judge read sum {here.recv():.0f}", flush=True)
        print(f"  before clear: {gib(torch)} GiB", flush=True)
        shelf.clear()
        print(f"  after clear (+ipc_collect): {gib(torch)} GiB", flush=True)
        torch.cuda.ipc_collect()
        print(f"  after a second ipc_collect: {gib(torch)} GiB", flush=True)
    proc.join()


if __name__ == "__main__":
    main()

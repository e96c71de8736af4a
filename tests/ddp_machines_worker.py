"""One process of a two-machine launch without the launcher: the test sets torchrun's variables (RANK, GROUP_RANK,
WORLD_SIZE 2, LOCAL_WORLD_SIZE 1, LOCAL_RANK 0, MASTER_ADDR, MASTER_PORT) and starts one process per machine.

    python tests/ddp_machines_worker.py rank0 OUT   # two storage probes in OUT (rank 1 prints each probe's name),
                                                    # then rank 0's tokenizer build raises a KeyError
    python tests/ddp_machines_worker.py store       # all_reduce every 0.1 s (printing `ready` after the first)
                                                    # until a collective fails

Each ends as scripts/train.py does (`exit_run`), with its one line on stderr.
"""

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from vaswani_mt.training.machines import (
    MachinesError,
    exit_run,
    from_rank_zero,
    is_lost_peer,
    is_store_failure,
    lost_machine_error,
    machines,
    settle_storage,
)

dist.init_process_group("gloo")
rank = dist.get_rank()
try:
    if sys.argv[1] == "rank0":
        out = Path(sys.argv[2])
        if rank == 1:  # says which probe it looks for

            def read_text(path, *args, read_text=Path.read_text, **kwargs):
                if path.parent == out:
                    print(f"probe {path.name}", flush=True)
                return read_text(path, *args, **kwargs)

            Path.read_text = read_text
        for _ in range(2):
            settle_storage(machines(), SimpleNamespace(save_on_each_node=False), out)

        def build():
            raise KeyError("added_tokens")  # what a tokenizer.json without its added tokens raises

        from_rank_zero(build)
    else:
        for step in range(1, 3000):
            dist.all_reduce(torch.ones(1))
            if step == 1:
                print("ready", flush=True)
            time.sleep(0.1)
except MachinesError as error:
    exit_run(f"error: {error}")
except RuntimeError as error:
    if not (is_lost_peer(error) or is_store_failure(error)):
        raise
    exit_run(f"error: {lost_machine_error(error, step)}")

"""The processes of one launch (accelerate launch, torchrun underneath) watching each other through the launch's
rendezvous store, for work that has no collective to fail when a peer is gone (sharded translation): each process
beats every second; one whose beat stops for `lost_after` seconds is named lost, with its machine, and this process
is stopped as by SIGTERM, so that it keeps what it finished. A failed store (machine 0 gone) is named as such."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterable
from datetime import timedelta

PREFIX = "vaswani_mt/peers/"


class Peers:
    """This launch's processes, from torchrun's variables (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT). `start()` begins the beat; `lost` is then the one line naming a lost peer, once one is."""

    def __init__(self, lost_after: float = 15.0):
        import torch.distributed as dist

        self.rank, self.world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        self.per_machine = int(os.environ.get("LOCAL_WORLD_SIZE", self.world)) or 1
        self.address = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        self.lost_after, self.lost = lost_after, None
        self._stop = threading.Event()
        self._connect = lambda: dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                              is_master=False, timeout=timedelta(seconds=30),
                                              wait_for_workers=False)  # fmt: skip
        self.store = self._connect()

    def who(self, ranks: Iterable[int]) -> str:
        ranks = sorted(ranks)
        names = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        if self.world <= self.per_machine:
            return names
        machines = sorted({rank // self.per_machine for rank in ranks})
        return f"machine{'s' if len(machines) > 1 else ''} {', '.join(map(str, machines))} ({names})"

    def start(self, doing: str) -> None:
        """Beats, and watches the others' beats, in a daemon thread, until `close()`; `doing` ends the line."""
        threading.Thread(target=self._watch, args=(doing,), daemon=True, name="vaswani_mt peers").start()

    def _watch(self, doing: str) -> None:
        seen: dict[int, tuple[int, float]] = {}
        try:
            store = self._connect()  # a client of its own: the main thread's may be waiting
            while not self._stop.wait(1.0):
                store.add(f"{PREFIX}beat/{self.rank}", 1)
                now = time.monotonic()
                gone = []
                for rank in range(self.world):
                    if rank == self.rank or store.check([f"{PREFIX}left/{rank}"]):
                        continue
                    if store.check([f"{PREFIX}failed/{rank}"]):
                        self._end(f"{self.who([rank])} failed (its log says why); {doing}")
                        return
                    beat = store.add(f"{PREFIX}beat/{rank}", 0)
                    if rank not in seen or seen[rank][0] != beat:
                        seen[rank] = (beat, now)
                    elif now - seen[rank][1] > self.lost_after:
                        gone.append(rank)
                if gone:
                    self._end(f"{self.who(gone)} was lost: no sign of life for {self.lost_after:.0f} s; {doing}")
                    return
        except Exception as error:  # the store: its keeper (machine 0's launcher) or the network to it
            if not self._stop.is_set():
                cause = " ".join(str(error).split())[:120]
                self._end(f"the rendezvous store at {self.address} failed ({cause}), so a peer is gone; {doing}")

    def _end(self, line: str) -> None:
        self.lost = line
        os.kill(os.getpid(), signal.SIGTERM)  # the command stops as on SIGTERM, keeping what it finished

    def mark(self, name: str) -> None:
        self.store.set(f"{PREFIX}{name}/{self.rank}", "1")

    def wait_for(self, name: str, ranks: Iterable[int] | None = None, poll: float = 0.5) -> None:
        """Until every one of `ranks` (default: all) has marked `name`; a lost peer stops it as SIGTERM does."""
        keys = [f"{PREFIX}{name}/{rank}" for rank in (range(self.world) if ranks is None else ranks)]
        while not self.store.check(keys):
            time.sleep(poll)

    def close(self, failed: bool = False) -> None:
        """Says this process leaves (no peer then takes it for lost) or has `failed` (the others stop too), and
        stops the beat."""
        self._stop.set()
        try:
            self.mark("failed" if failed else "left")
        except Exception:  # the store is gone: nobody is left to mislead
            pass


__all__ = ["Peers"]

"""`resume_point` in each of 2 processes whose disks differ: rank r looks for checkpoints in OUT/rank<r>.

Run as `accelerate launch --multi_gpu --num_processes 2 tests/ddp_resume_worker.py OUT [--hide]`. Each rank prints
`rank R resumes from X` or `rank R: error: ...`. With --hide, rank 1 cannot see OUT/rank0 (Path.is_dir says so).
"""

import os
import sys
from pathlib import Path

import torch.distributed as dist

from vaswani_mt.training.arguments import parse_args
from vaswani_mt.training.checkpoints import CheckpointError, resume_point

out = Path(sys.argv[1])
args = parse_args(["--output_dir", str(out), "--report_to", "none", "--use_cpu"])[3]
rank = args.process_index  # accelerate's state: the process group starts here
if "--hide" in sys.argv and rank == 1:
    is_dir = Path.is_dir
    Path.is_dir = lambda path: not str(path).startswith(str(out / "rank0")) and is_dir(path)
try:
    said = f"rank {rank} resumes from {resume_point(args, out / f'rank{rank}')}"
except CheckpointError as error:
    said = f"rank {rank}: error: {error}"
os.write(1, f"{said}\n".encode())  # one write: the two ranks share the pipe
dist.barrier()
dist.destroy_process_group()

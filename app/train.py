"""Train an mLSTM language model with DeepSpeed: pipeline stages x ZeRO data parallelism.

    deepspeed --num_gpus 2 app/train.py --deepspeed_config ds_configs/cpu_pp2_zero1.json --data data/default \\
        --pipeline-stages 2 --out runs/quickstart --max-steps 300
    deepspeed --num_gpus 2 app/train.py --config runs/quickstart/config.json --lr 1e-3 --no-progress

Rerunning the same command in the same --out resumes from its latest complete checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script by the deepspeed launcher: import the repo, not app/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import json

from app.common import phase_clock
from app.common.errors import exit_on_user_error
from app.parallel.runtime import exit_on_lost_peer
from app.training.args import parse_args
from app.training.run_folder import claim_run_folder, mark_run_folder
from app.training.trainer import Trainer


@exit_on_lost_peer
@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    phase_clock.mark("imports")  # the first step's line says where the time to it went
    args = parse_args(argv, __doc__)
    cfg = claim_run_folder(args.cfg)  # before any work: --out holds no input, is ours (or a subfolder of it)
    trainer = Trainer(cfg, args.deepspeed, args.model_overrides)
    if trainer.rank == 0:
        for note in args.notes:
            trainer.log.info(note)
    if args.dry_run:
        if trainer.rank == 0:
            print(json.dumps(trainer.resolved, indent=1, default=str))
        return 0
    if trainer.rank == 0:
        mark_run_folder(cfg)
    trainer.setup()
    return trainer.fit()


__all__ = ["main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())

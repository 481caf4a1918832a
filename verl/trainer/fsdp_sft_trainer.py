"""SFT baseline trainer (docs/METHOD.md §2.3): fine-tune a causal LM on prompt -> target traces with FSDP2.

``torchrun --nproc_per_node N -m verl.trainer.fsdp_sft_trainer key=value ...`` trains on N ranks (gloo on
CPU, NCCL on GPU); ``python -m verl.trainer.fsdp_sft_trainer ...`` trains as one rank in a group it creates
itself; ``run_sft(config)`` does the same in-process and returns the final HF folder and metrics. Each
step takes ``data.train_batch_size`` rows, accumulates gradients over micro-batches, reduces the loss as
one token mean over the whole global batch (verl/trainer/sft/loss.py), clips and applies AdamW. The HF
folders it writes (``<default_local_dir>/final``) start the "SFT then RL" baseline. Left out: sequence
packing and resuming from a mid-run checkpoint (the run writes HF folders, not optimizer state).

Stop signals: SIGTERM/SIGINT on any rank (torchrun forwards its own to every rank; the launch script runs
torchrun through ``verl.trainer.sft.launch``) let the step in progress finish; the ranks agree on the stop
after each step, write that step's HF folder (``trainer.save_on_signal``) and exit 128 + signal. A second
signal aborts at once (verl/utils/signals.py); a repeat of the first within 2 s counts as the same one
(``SFTStop``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import time
from typing import Iterator, Optional, Union

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from verl.trainer.sft.config import (
    CONFIG_DIR,
    CONFIG_NAME,
    ConfigError,
    batch_plan,
    check_override_keys,
    check_sft_config,
    compose_sft_config,
)
from verl.trainer.sft.dataset import (
    SFTDataset,
    epoch_batches,
    loss_token_count,
    pad_micro_batch,
    rank_slice,
    strided_shard,
)
from verl.utils.signals import GracefulStop, exit_code

__all__ = ["FSDPSFTTrainer", "run_sft", "compose_sft_config", "sft_process_group", "main"]

logger = logging.getLogger(__name__)
CONFIG_ERROR_EXIT_CODE = 2


class SFTStop(GracefulStop):
    """``GracefulStop`` that takes a repeat of the first signal within ``DUPLICATE_S`` as the same request:
    Slurm's scancel signals every process of the job, so a rank gets the signal itself and once more from
    torchrun, milliseconds apart; only a later one is a person's second signal (abort now)."""

    DUPLICATE_S = 2.0

    def _handle(self, signum, frame) -> None:
        if self.signum == signum and time.monotonic() - self._first_at < self.DUPLICATE_S:
            return
        if self.signum is None:
            self._first_at = time.monotonic()
        super()._handle(signum, frame)


@contextlib.contextmanager
def sft_process_group(device: str) -> Iterator[tuple[int, int]]:
    """Yield (rank, world size) of the default process group, creating one when there is none.

    Under torchrun (RANK/WORLD_SIZE set) the group is joined from the environment; a plain process gets
    a world-size-1 group on an in-memory store (no port). A group created here is destroyed on exit; an
    existing one is left alone.
    """
    from verl.utils.fsdp_utils import init_distributed

    created = not dist.is_initialized()
    if created:
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            init_distributed(device)
        else:
            if device == "cuda":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(
                "nccl" if device == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1
            )
    try:
        yield dist.get_rank(), dist.get_world_size()
    finally:
        if created:
            dist.destroy_process_group()


class FSDPSFTTrainer:
    """One SFT run over the default process group; build with a validated, resolved config, then ``fit()``."""

    def __init__(self, config: DictConfig, device: str):
        from verl.utils.tokenizer import hf_tokenizer

        from verl.trainer.sft.fsdp_model import build_fsdp_model, build_optimizer
        from verl.utils.fsdp_utils import create_device_mesh

        self.config = config
        self.device = device
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        data = config.data
        self.rows_per_rank, self.micro_batches = batch_plan(
            data.train_batch_size, data.micro_batch_size_per_gpu, self.world_size
        )
        torch.manual_seed(config.trainer.seed)
        if self.rank != 0:  # one set of download/load/save progress bars per run
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        self.tokenizer = hf_tokenizer(config.model.path, trust_remote_code=config.model.trust_remote_code)
        self.train_dataset = self._dataset(data.train_files)
        self.val_dataset = self._dataset(data.val_files) if data.val_files else None
        self.steps_per_epoch = len(epoch_batches(len(self.train_dataset), data.train_batch_size, 0, 0, shuffle=False))
        self.total_steps = config.trainer.total_training_steps or config.trainer.total_epochs * self.steps_per_epoch
        self.model = build_fsdp_model(config.model, device, create_device_mesh(device))
        self.optimizer, self.lr_scheduler = build_optimizer(self.model, config.optim, self.total_steps)
        self.out_dir = os.path.abspath(config.trainer.default_local_dir)
        self.history: list[dict] = []

    def _dataset(self, files) -> SFTDataset:
        data = self.config.data
        files = OmegaConf.to_container(files) if OmegaConf.is_config(files) else files
        return SFTDataset(
            files,
            self.tokenizer,
            prompt_key=data.prompt_key,
            response_key=data.response_key,
            max_length=data.max_length,
            truncation=data.truncation,
            strip_think_prefix=data.strip_think_prefix,
        )

    # ------------------------------------------------------------------ steps
    def _all_reduce_sum(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def _to_device(self, batch: dict) -> dict:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def train_step(self, global_rows: list[int]) -> dict:
        """One optimizer step on a global batch (this rank trains on its slice); returns the step metrics."""
        from verl.trainer.sft.fsdp_model import clip_grad_norm
        from verl.trainer.sft.loss import micro_batch_nll_sum

        micro = self.config.data.micro_batch_size_per_gpu
        items = [self.train_dataset[i] for i in rank_slice(global_rows, self.rank, self.world_size)]
        batches = [
            pad_micro_batch(items[i : i + micro], self.tokenizer.pad_token_id) for i in range(0, len(items), micro)
        ]
        local_tokens = sum(loss_token_count(b["loss_mask"]) for b in batches)
        local_seq_tokens = sum(int(b["attention_mask"].sum()) for b in batches)
        global_tokens, global_seq_tokens = self._all_reduce_sum([local_tokens, local_seq_tokens])
        # FSDP averages gradients over ranks, so world_size / N_global turns that into Σ nll / N_global.
        scale = self.world_size / max(global_tokens, 1.0)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        nll_sum = 0.0
        for batch in batches:
            loss = micro_batch_nll_sum(self.model, self._to_device(batch), self.config.model.loss_chunk_tokens)
            (loss * scale).backward()
            nll_sum += float(loss.detach())
        grad_norm = clip_grad_norm(self.model, self.config.optim.clip_grad)
        lr = self.lr_scheduler.get_last_lr()[0]
        finite = math.isfinite(grad_norm)
        if finite and global_tokens > 0:
            self.optimizer.step()
        elif not finite:  # a non-finite gradient would poison the AdamW moments
            logger.warning("non-finite grad norm %s: optimizer step skipped", grad_norm)
        else:  # no response token survived truncation: nothing to learn, and AdamW would still move weights
            logger.warning("no response tokens in this global batch: optimizer step skipped")
        self.optimizer.zero_grad(set_to_none=True)
        self.lr_scheduler.step()
        (global_nll,) = self._all_reduce_sum([nll_sum])
        return {
            "train/loss": global_nll / max(global_tokens, 1.0),
            "train/lr": lr,
            "train/grad_norm": grad_norm,
            "train/tokens": int(global_tokens),
            "train/seq_tokens": int(global_seq_tokens),
            "train/skipped_step": int(not (finite and global_tokens > 0)),
        }

    @torch.no_grad()
    def validate(self) -> dict:
        """Token-mean NLL of the response tokens over the whole validation set."""
        from verl.trainer.sft.loss import micro_batch_nll_sum

        rows, keep = strided_shard(len(self.val_dataset), self.rank, self.world_size)
        micro = self.config.data.micro_batch_size_per_gpu
        self.model.eval()
        nll_sum, tokens = 0.0, 0
        for i in range(0, len(rows), micro):
            batch = pad_micro_batch(
                [self.val_dataset[r] for r in rows[i : i + micro]],
                self.tokenizer.pad_token_id,
                keep=keep[i : i + micro],
            )
            nll_sum += float(
                micro_batch_nll_sum(self.model, self._to_device(batch), self.config.model.loss_chunk_tokens)
            )
            tokens += loss_token_count(batch["loss_mask"])
        total_nll, total_tokens = self._all_reduce_sum([nll_sum, tokens])
        return {"val/loss": total_nll / max(total_tokens, 1.0), "val/tokens": int(total_tokens)}

    def save(self, step: int, final: bool, stopping: bool = False) -> list[str]:
        """HF folders for this step: global_step_<step>/huggingface on save_freq or when stopping on a signal,
        final after the last step."""
        from verl.trainer.sft.fsdp_model import save_hf_folder

        freq = self.config.trainer.save_freq
        dirs = [os.path.join(self.out_dir, "final")] if final else []
        if (freq > 0 and step % freq == 0) or stopping:
            dirs.insert(0, os.path.join(self.out_dir, f"global_step_{step}", "huggingface"))
        if dirs:
            save_hf_folder(
                self.model,
                dirs,
                self.config.model.path,
                self.tokenizer,
                trust_remote_code=self.config.model.trust_remote_code,
            )
        return dirs

    def _agreed_stop_signal(self, stop: "GracefulStop") -> int:
        """The stop signal any rank got so far (0: none); every rank must call, all get the same answer."""
        flag = torch.tensor([float(stop.signum or 0)], dtype=torch.float64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    # ------------------------------------------------------------------ loop
    def _global_batches(self) -> Iterator[tuple[int, list[int]]]:
        """(epoch, global batch) for every step of the run; epochs reshuffle and repeat as needed."""
        data, seed = self.config.data, self.config.trainer.seed
        step, epoch = 0, 0
        while step < self.total_steps:
            for rows in epoch_batches(len(self.train_dataset), data.train_batch_size, epoch, seed, data.shuffle):
                if step >= self.total_steps:
                    return
                yield epoch, rows
                step += 1
            epoch += 1

    def fit(self) -> dict:
        """Train for ``total_steps``; returns ``{final_model_dir, metrics, history, signal}`` (same on every rank;
        ``signal``: the stop signal that ended the run early after saving, else None)."""
        from tqdm import tqdm

        from verl.utils.tracking import Tracking

        cfg = self.config.trainer
        tracker = None
        if self.rank == 0:
            tracker = Tracking(
                cfg.project_name,
                cfg.experiment_name,
                list(cfg.logger),
                config=OmegaConf.to_container(self.config, resolve=True),
                log_dir=self.out_dir,
                console_all=True,
            )
        # disable=None hides the bar when stderr is not a terminal: in a log file every refresh of a bar joins one
        # ever-growing line (the quickstart's log had a 77 KB one). There, ~10 plain progress lines stand in for it.
        show = self.rank == 0 and bool(cfg.progress_bar)
        bar = tqdm(
            total=self.total_steps, desc="SFT", disable=None if show else True, dynamic_ncols=True, file=sys.stderr
        )
        line_every = max(1, self.total_steps // 10) if show and bar.disable else 0
        metrics: dict = {}
        stopped_by = None
        stop = SFTStop(what="the current SFT step")
        try:
            stop.__enter__()
            for step, (epoch, rows) in enumerate(self._global_batches(), start=1):
                start = time.perf_counter()
                metrics = self.train_step(rows)
                metrics.update({"train/epoch": epoch, "timing_s/step": time.perf_counter() - start})
                metrics["perf/tokens_per_s"] = metrics["train/seq_tokens"] / max(metrics["timing_s/step"], 1e-9)
                last = step == self.total_steps
                stopped_by = self._agreed_stop_signal(stop) or None
                if self.val_dataset is not None and (last or (cfg.test_freq > 0 and step % cfg.test_freq == 0)):
                    metrics.update(self.validate())
                saved = self.save(step, final=last, stopping=bool(stopped_by) and bool(cfg.save_on_signal))
                if stopped_by and self.rank == 0:
                    print(
                        f"SFT stopped by signal {stopped_by} ({signal.Signals(stopped_by).name}) after step {step}/"
                        f"{self.total_steps}; saved: {', '.join(saved) or 'nothing (trainer.save_on_signal=False)'}; "
                        f"exit code {exit_code(stopped_by)}",
                        file=sys.stderr,
                        flush=True,
                    )
                self.history.append({"step": step, **metrics})
                if tracker is not None:
                    with tqdm.external_write_mode():  # console lines above the bar, not through it
                        tracker.log(metrics, step=step)
                bar.set_postfix(loss=f"{metrics['train/loss']:.4f}", lr=f"{metrics['train/lr']:.2e}")
                bar.update(1)
                if line_every and (step % line_every == 0 or last):
                    print(
                        f"SFT step {step}/{self.total_steps}: loss {metrics['train/loss']:.4f}",
                        file=sys.stderr,
                        flush=True,
                    )
                if stopped_by:
                    break
        finally:
            stop.__exit__(None, None, None)
            bar.close()
            if tracker is not None:
                tracker.finish()
        return {
            "final_model_dir": os.path.join(self.out_dir, "final"),
            "metrics": metrics,
            "history": self.history,
            "signal": stopped_by,
        }


def _prepare(config: Union[DictConfig, dict]) -> DictConfig:
    """Validated, resolved copy of ``config`` (a DictConfig or a plain nested dict)."""
    check_sft_config(config)
    resolved = OmegaConf.create(
        OmegaConf.to_container(config if isinstance(config, DictConfig) else OmegaConf.create(config), resolve=True)
    )
    resolved.pop("hydra", None)
    OmegaConf.set_struct(resolved, True)
    return resolved


def run_sft(config: Union[DictConfig, dict]) -> dict:
    """Train in this process (joining torchrun's group or creating a one-rank one) and return
    ``{"final_model_dir": <HF folder>, "metrics": <last step's metrics>, "history": [per-step metrics]}``.

    ``config``: a composed config, e.g. ``compose_sft_config(["model.path=...", "data.train_files=..."])``.
    A stop signal ends the run after the step in progress (saved) with ``SystemExit(128 + signal)``, once the
    process group is released.
    """
    from verl.trainer.sft.fsdp_model import resolve_device

    config = _prepare(config)
    device = resolve_device(config.trainer.device)
    with sft_process_group(device):
        trainer = FSDPSFTTrainer(config, device)
        result = trainer.fit()
    if result["signal"]:
        raise SystemExit(exit_code(result["signal"]))
    return result


# ---------------------------------------------------------------------- command line
def _split_hydra_argv(argv: list[str]) -> Optional[tuple[list[str], list[str]]]:
    """(overrides, Hydra flags in order); None when Hydra's parser rejects the command line itself."""
    from hydra._internal.utils import get_args_parser

    try:
        args = get_args_parser().parse_intermixed_args(argv)
    except SystemExit:
        return None
    overrides, flags, i = list(args.overrides), [], 0
    for token in argv:
        if i < len(overrides) and token == overrides[i]:
            i += 1
        else:
            flags.append(token)
    return overrides, flags


def _exit_with_config_error(exc: ConfigError) -> None:
    for line in exc.errors:
        print(f"Config error: {line}", file=sys.stderr)
    sys.stderr.flush()
    sys.exit(CONFIG_ERROR_EXIT_CODE)


def _hydra_entry():
    import hydra

    @hydra.main(config_path=CONFIG_DIR, config_name=CONFIG_NAME, version_base=None)
    def hydra_main(config: DictConfig) -> None:
        try:
            prepared = _prepare(config)
        except ConfigError as exc:
            _exit_with_config_error(exc)
        is_rank0 = int(os.environ.get("RANK", "0")) == 0
        if is_rank0:  # the resolved config goes to a file; the console gets its path
            path = os.path.join(os.path.abspath(str(prepared.trainer.default_local_dir)), "resolved_config.yaml")
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(OmegaConf.to_yaml(prepared))
                print(f"SFT resolved config: {path}", flush=True)
            except OSError:
                print(OmegaConf.to_yaml(prepared), flush=True)
        result = run_sft(prepared)
        if is_rank0:
            print(f"SFT done: final model at {result['final_model_dir']}", flush=True)

    return hydra_main


def main(argv: Optional[list[str]] = None) -> None:
    """Command line: overrides are checked against the YAML first (unknown keys name the closest key)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    split = _split_hydra_argv(argv)
    if split is not None:
        overrides, flags = split
        try:
            prepared = check_override_keys(overrides)
        except ConfigError as exc:
            _exit_with_config_error(exc)
        # Overrides before flags: Hydra refuses overrides on both sides of a flag.
        argv = prepared + flags
    sys.argv = [sys.argv[0]] + argv
    _hydra_entry()()


if __name__ == "__main__":
    main()

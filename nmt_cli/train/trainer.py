"""The training loop: epochs of updates, logging, validation, checkpoints, stopping.

`train(cfg, model_cfg)` is the whole of `nmt train`. Re-running it on the same run
directory resumes from `checkpoint_last.pt` exactly where that checkpoint left off
(the same batches, dropout masks and optimizer state), so an interrupted run and an
uninterrupted one end with the same parameters and the same train_log.jsonl.
"""

from __future__ import annotations

import math
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt_cli.checkpoints.format import check_state_dict_fits, load_checkpoint, model_checkpoint
from nmt_cli.checkpoints.names import LAST
from nmt_cli.config import ModelConfig, TrainConfig
from nmt_cli.data.batching import check_update_freq, epoch_batches, filter_by_size, make_batches, rank_share
from nmt_cli.data.pairs import PairDataset, load_data_bin
from nmt_cli.errors import NmtError
from nmt_cli.host_memory import keep_freed_memory, release_freed_memory
from nmt_cli.models.size import check_model_fits, check_training_fits
from nmt_cli.run_lock import directory_lock
from nmt_cli.train import agreement, distributed
from nmt_cli.train.best import KeepBestChange, is_better, keep_best
from nmt_cli.train.distributed import DistInfo
from nmt_cli.train.live import Limits, eta_seconds
from nmt_cli.train.ema import start_ema
from nmt_cli.train.eval_bleu import BleuScores, ValidBleu, shared_scores
from nmt_cli.train.log import LOG_NAME, MetricsLog, Reporter, per_token_bits
from nmt_cli.train.optim import set_hyperparameters
from nmt_cli.train.resume_state import (
    Progress,
    capture_rng,
    check_compatible,
    check_optimizer_state_fits,
    progress_from_checkpoint,
    progress_to_checkpoint,
    restore_rng,
    restoring,
)
from nmt_cli.train.run_history import check_same_data, data_fingerprint, recover_run_dir
from nmt_cli.train.saving import (
    check_writable,
    checkpoint_names,
    checkpoints_to_prune,
    prepare_run_dir,
    write_checkpoints,
)
from nmt_cli.train.step import build_engine, evaluate, train_update
from nmt_cli.train.tensorboard import TensorBoardLog, require_tensorboard
from nmt_cli.train.window import Window

MAX_CONSECUTIVE_OOM = 5


@dataclass
class TrainResult:
    num_updates: int
    epoch: int
    best_metric: float | None
    stop_reason: str


def train(cfg: TrainConfig, model_cfg: ModelConfig) -> TrainResult:
    """Train (or resume training) as `cfg` says; return where it stopped and why."""
    dist = distributed.setup(cfg.device)
    if dist.device.type == "cpu":
        keep_freed_memory()  # each update frees and reallocates the same activations
    try:
        check_precision_fits_device(cfg.precision, dist.device)
        # One writer per run directory; the other ranks write nothing there.
        with directory_lock(Path(cfg.save_dir), "--save-dir") if dist.is_main else nullcontext():
            trainer = Trainer(cfg, model_cfg, dist)
            try:
                return trainer.run()
            finally:
                trainer.close()
    finally:
        distributed.teardown(dist)


def check_precision_fits_device(precision: str, device: torch.device) -> None:
    """fp16 autocast on a CPU runs many times slower than fp32 (translate refuses it too)."""
    if precision == "fp16" and device.type == "cpu":
        raise NmtError("--precision fp16 needs --device cuda (this training runs on the CPU: "
                       "use --precision bf16 or fp32 there)")


class Trainer:
    """State of one training run; `run()` drives it to a stopping condition."""

    def __init__(self, cfg: TrainConfig, model_cfg: ModelConfig, dist: DistInfo) -> None:
        self.cfg, self.model_cfg, self.dist = cfg, model_cfg, dist
        self.reporter = Reporter(enabled=dist.is_main)
        self.data = load_data_bin(cfg.data, cfg.source_lang, cfg.target_lang)
        self.train_split = self.data.split(cfg.train_subset)
        self.valid_split = None if cfg.disable_validation else self.data.split(cfg.valid_subset)
        self.save_dir = Path(cfg.save_dir)
        check_writable(self.save_dir)
        # Rank 0 brings the run directory to a resumable state (a save finished, a stale best
        # repaired, --reset-run carried out) before any rank reads its checkpoint; an error
        # there stops every rank instead of leaving the others waiting.
        recovery_error = None
        if dist.is_main:
            try:
                if cfg.tensorboard_logdir:  # only rank 0 writes it; a missing extra stops every rank now
                    require_tensorboard()
                recover_run_dir(self.save_dir, cfg, model_cfg, self.reporter.warning)
            except NmtError as error:
                recovery_error = str(error)
        agreement.raise_if_any_failed(recovery_error, dist)
        self.data_fingerprint = data_fingerprint(self.data, self.train_split)
        if model_cfg.share_all_embeddings and self.data.src_dict != self.data.tgt_dict:
            # Equal sizes are not enough: one embedding row must mean one symbol on both sides.
            raise NmtError(f"--share-all-embeddings needs one joined dictionary, but {cfg.data} has different "
                           "source and target dictionaries (preprocess with --joined-dictionary)")
        # Before anything is built: a model whose training cannot fit would swap the machine to a
        # standstill. First the model alone (build_model's check, whose messages say which part
        # cannot be built), then what training holds on top.
        vocab_sizes = len(self.data.src_dict), len(self.data.tgt_dict)
        check_model_fits(model_cfg, *vocab_sizes)
        check_training_fits(model_cfg, *vocab_sizes, dist.device, pure_bf16=cfg.precision == "pure-bf16",
                            ema=cfg.ema_decay_in_use is not None)
        if cfg.reset_run:  # a fresh start on every rank, whatever a node-local --save-dir still holds
            shared = agreement.ResumeState(None, "no checkpoint (--reset-run)")
        else:
            shared = agreement.resume_state(self.save_dir / LAST, dist, self._check_resumable)
        resume = shared.state
        self.engine = build_engine(cfg, model_cfg, len(self.data.src_dict), len(self.data.tgt_dict), dist)
        self.progress = self._restore(resume)
        self.ema = start_ema(cfg, self.engine.model, resume, self.save_dir / LAST, self.reporter.warning)
        if dist.is_main:
            prepare_run_dir(self.save_dir, self.data, cfg, model_cfg)
        self.log = MetricsLog(self.save_dir / LOG_NAME, dist.is_main, self.progress.log_records)
        if self.log.missing_records:
            self.reporter.warning(f"{self.log.path} lacks {self.log.missing_records} earlier record(s); appending")
        # Fed the records of train_log.jsonl; scalars an interrupted run wrote after its checkpoint are purged.
        self.tensorboard = (TensorBoardLog(Path(cfg.tensorboard_logdir), self.progress.num_updates)
                            if cfg.tensorboard_logdir and dist.is_main else None)
        self.batches = self._plan(self.train_split, "train", shuffle_seed=cfg.seed)
        check_update_freq(cfg.update_freq, dist.world_size, len(self.batches))
        self.valid_batches = self._plan(self.valid_split, "valid", shuffle_seed=0) if self.valid_split else []
        self.valid_bleu = (ValidBleu(cfg, self.data, self.valid_split, model_cfg.max_source_positions,
                                     model_cfg.max_target_positions)
                           if cfg.eval_bleu and self.valid_split is not None else None)
        release_freed_memory()  # planning's temporaries, which malloc would otherwise keep for the whole run
        if dist.world_size > 1:
            state = agreement.training_state(self.engine.model, self.engine.optimizer, self.progress, self.batches,
                                             agreement.shared_settings(cfg, model_cfg),
                                             self.ema.weights if self.ema is not None else None)
            agreement.check_ranks_agree(state, shared.origin, dist)
        self.window = self._resume_window(resume)
        self.start_time = time.monotonic()
        self.start_updates = self.progress.num_updates
        self.consecutive_oom = 0
        self.skipped_oom = 0

    # --- setup ------------------------------------------------------------------------

    def _check_resumable(self, state: dict[str, Any], path: Path) -> None:
        check_compatible(state, path, self.data, self.model_cfg)
        check_same_data(state, path, self.data_fingerprint, self.data.path)

    def _check_fixed_schedule_kept(self, resume: dict[str, Any], progress: Progress) -> None:
        """Older versions' `--lr-scheduler fixed` trained at the constant --lr whatever
        --warmup-updates said; this one warms up. Resumed within the warm-up, such a run's
        rate would drop mid-run, so that is refused. Its checkpoints record no warm-up in
        their scheduler entry, and their last update's rate (the optimizer's) is the
        constant one where this schedule's would be lower."""
        scheduler, schedule = resume.get("scheduler") or {}, self.engine.schedule
        if scheduler.get("name") != "fixed" or "warmup_updates" in scheduler or schedule.name != "fixed":
            return
        if not 0 < progress.num_updates < schedule.warmup_updates:
            return
        groups = (resume.get("optimizer") or {}).get("param_groups") or [{}]
        last_rate = float(groups[0].get("lr", 0.0))
        constant = float((resume.get("train_config") or {}).get("lr", 0.0))
        if last_rate > 0 and math.isclose(last_rate, constant, rel_tol=1e-6):
            raise NmtError(f"{self.save_dir / LAST} was trained by an older nmt, whose --lr-scheduler fixed kept the "
                           f"constant --lr without warm-up; this one warms up over --warmup-updates "
                           f"{schedule.warmup_updates}: give --warmup-updates 0 to go on as the run began")

    def _warn_if_epoch_replanned(self, before: dict[str, Any], progress: Progress) -> None:
        """Other batching flags than the checkpoint's (or another nmt's defaults for them) plan
        other batches than the run's so far: say so, and how to keep the run's. Mid-epoch, the
        batches already done are skipped from a plan that is not the one they came from."""
        keys = ("max_tokens", "batch_size", "required_batch_size_multiple", "seed")
        now = self.cfg.to_dict()  # as recorded: max_tokens is the cap in use
        changed = [k for k in keys if k in before and before[k] != now[k]]
        if not changed:
            return
        listed = ", ".join(f"--{k.replace('_', '-')} {before[k]} -> {now[k]}" for k in changed)
        kept = " ".join(f"--{k.replace('_', '-')} {before[k]}" for k in changed if before[k] is not None)
        how = f" (give {kept} to keep the run's)" if kept else ""
        if progress.batches_done:
            self.reporter.warning(f"{listed} since the checkpoint: the rest of epoch {progress.epoch} is "
                                  f"planned anew and its first {progress.batches_done} batches are skipped, so some of "
                                  f"its sentences may be seen twice or not at all{how}")
        else:
            self.reporter.warning(f"{listed} since the checkpoint: the epochs from here on are batched "
                                  f"otherwise than the run's so far{how}")

    def _restart_best_if_metric_changed(self, before: dict[str, Any], progress: Progress) -> None:
        """A best valid nll compared with valid losses would never be beaten (and --patience
        would stop early), so another --best-checkpoint-metric starts the best over."""
        metric = self.cfg.best_checkpoint_metric
        previous = before.get("best_checkpoint_metric", metric)
        if previous != metric and progress.best_metric is not None:
            self.reporter.warning(f"--best-checkpoint-metric is now {metric} (was {previous}): "
                                  "the best value and --patience start over")
            progress.best_metric, progress.patience_counter = None, 0
            progress.best_checkpoints = []  # ranked by the old metric; their files stay

    def _restore(self, resume: dict[str, Any] | None) -> Progress:
        engine, cfg = self.engine, self.cfg
        if resume is not None:
            check_state_dict_fits(engine.model, resume["model"], self.save_dir / LAST)
            engine.load_weights(resume["model"])
            progress = progress_from_checkpoint(resume, self.save_dir / LAST)
            if cfg.reset_optimizer:
                self.reporter.info("--reset-optimizer: fresh optimizer state (weights and progress resumed)")
            else:
                with restoring("optimizer state", self.save_dir / LAST):
                    engine.optimizer.load_state_dict(resume["optimizer"])
                    check_optimizer_state_fits(engine.optimizer)
                    set_hyperparameters(engine.optimizer, cfg.adam_betas, cfg.adam_eps, cfg.weight_decay)
                    if engine.scaler is not None and resume.get("scaler"):
                        engine.scaler.load_state_dict(resume["scaler"])
            with restoring("random number generator states", self.save_dir / LAST):
                restore_rng(resume["rng"])
            previous_cfg = resume.get("train_config") or {}
            self._check_fixed_schedule_kept(resume, progress)
            self._warn_if_epoch_replanned(previous_cfg, progress)
            self._restart_best_if_metric_changed(previous_cfg, progress)
            if cfg.finetune_from:
                self.reporter.info(f"--finetune-from ignored: {self.save_dir / LAST} exists")
            self.reporter.info(f"resumed from {self.save_dir / LAST} at update {progress.num_updates}, epoch {progress.epoch}")
            return progress
        if cfg.finetune_from:
            path = Path(cfg.finetune_from)
            state = load_checkpoint(path)
            check_compatible(state, path, self.data, self.model_cfg)
            check_state_dict_fits(engine.model, state["model"], path)
            engine.load_weights(state["model"])
            self.reporter.info(f"fine-tuning from the weights of {path}")
        return Progress()

    def _resume_window(self, resume: dict[str, Any] | None) -> Window:
        """The log window in progress when the checkpoint was written (empty for a fresh run)."""
        if resume is None or "log_window" not in resume:
            return Window.start(self.engine.device)
        with restoring("log window", self.save_dir / LAST):
            return Window.from_checkpoint(resume["log_window"], self.engine.device, self.dist.is_main)

    def _plan(self, split: PairDataset, name: str, shuffle_seed: int) -> list[np.ndarray]:
        cfg = self.cfg
        kept, skipped = filter_by_size(
            split.src_sizes, split.tgt_sizes, self.model_cfg.max_source_positions, self.model_cfg.max_target_positions
        )
        if skipped:
            self.reporter.warning(
                f"{name}: skipped {skipped} of {len(split)} pairs that are empty or longer than "
                f"--max-source-positions {self.model_cfg.max_source_positions} / "
                f"--max-target-positions {self.model_cfg.max_target_positions}"
            )
        if len(kept) == 0:
            raise NmtError(f"{name} split of {self.data.path} has no usable pairs")
        batches = make_batches(split.src_sizes, split.tgt_sizes, cfg.max_tokens_in_use, cfg.batch_size,
                               cfg.required_batch_size_multiple, shuffle_seed, kept, split=name)
        self.reporter.info(f"{name}: {len(kept)} pairs in {len(batches)} batches")
        return batches

    # --- the loop ---------------------------------------------------------------------

    def run(self) -> TrainResult:
        cfg, progress = self.cfg, self.progress
        params = sum(p.numel() for p in self.engine.model.parameters())
        self.reporter.info(f"model {cfg.arch}: {params:,} parameters; {self.dist.world_size} process(es) on {self.engine.device}, {cfg.precision}")
        stop = self._limit_reached()
        self.reporter.start_live(Limits(cfg.max_update, cfg.max_time), self.start_time, self.start_updates, progress.epoch)
        while not stop:
            stop = self._run_epoch()
        if self.skipped_oom:
            self.reporter.warning(f"{self.skipped_oom} update(s) skipped after running out of GPU memory")
        # Stopped at an epoch's end, the iterator already stands at the next epoch's start.
        epoch = progress.epoch - 1 if progress.batches_done == 0 and progress.epoch > 1 else progress.epoch
        return TrainResult(progress.num_updates, epoch, progress.best_metric, stop)

    def _limit_reached(self) -> str:
        if self.cfg.max_update and self.progress.num_updates >= self.cfg.max_update:
            return "max_update"
        if self.cfg.max_epoch and self.progress.epoch > self.cfg.max_epoch:
            return "max_epoch"
        return ""

    def _run_epoch(self) -> str:
        cfg, progress, dist = self.cfg, self.progress, self.dist
        order = epoch_batches(self.batches, progress.epoch, cfg.seed)
        per_update = cfg.update_freq * dist.world_size
        while progress.batches_done < len(order):
            group = order[progress.batches_done : progress.batches_done + per_update]
            shares = rank_share(order, progress.batches_done, cfg.update_freq, dist.world_size, dist.rank)
            update_ntokens = int(sum(int(self.train_split.tgt_sizes[b].sum()) for b in group))
            stats = self._guarded_update(shares, group[0], update_ntokens)
            progress.batches_done += len(group)
            if stats is None:
                continue
            progress.num_updates += 1
            self.reporter.updated(progress.num_updates, progress.epoch)
            if self.ema is not None:
                self.ema.after_update(self.engine.model, progress.num_updates)
            self.window.add(stats, update_ntokens, progress.num_updates, self.engine.scaler is not None)
            stop = self._after_update()
            if stop:
                return stop
        return self._end_of_epoch()

    def _guarded_update(self, shares: list[np.ndarray], fallback: np.ndarray, ntokens: int):
        """One update; on a CUDA out-of-memory error skip it (single process) and go on."""
        try:
            stats = train_update(self.engine, self.train_split, shares, fallback, ntokens, self.progress.num_updates)
            self.consecutive_oom = 0
            return stats
        except torch.cuda.OutOfMemoryError:  # torch.OutOfMemoryError in torch >= 2.5
            if self.dist.world_size > 1:
                raise NmtError(f"out of GPU memory at update {self.progress.num_updates + 1}; lower --max-tokens or --batch-size") from None
            self.engine.discard_gradients()
            torch.cuda.empty_cache()
            self.consecutive_oom += 1
            self.skipped_oom += 1
            self.reporter.warning(f"out of GPU memory in update {self.progress.num_updates + 1}; skipped its batches")
            if self.consecutive_oom >= MAX_CONSECUTIVE_OOM:
                raise NmtError(f"out of GPU memory {self.consecutive_oom} updates in a row; lower --max-tokens or --batch-size") from None
            return None

    def _after_update(self) -> str:
        cfg, n = self.cfg, self.progress.num_updates
        at_log = n % cfg.log_interval == 0
        if at_log:
            self._log_train()
        time_up = self._time_is_up(at_log)
        at_max = bool(cfg.max_update) and n >= cfg.max_update
        at_save = bool(cfg.save_interval_updates) and n % cfg.save_interval_updates == 0
        at_validation = bool(cfg.validate_interval_updates) and n % cfg.validate_interval_updates == 0
        is_best, best_file = False, None
        # As fairseq: a checkpoint of --save-interval-updates is validated too, so that
        # checkpoint_best.pt, --patience and --keep-best-checkpoints see it.
        if self.valid_split is not None and (at_validation or at_save or at_max):
            is_best, best_file = self._validate()
        stop = "max_update" if at_max else "max_time" if time_up else self._patience_exhausted()
        if at_save or is_best or stop or best_file:
            self._save(end_of_epoch=False, is_best=is_best, best_file=best_file)
        if stop == "max_time":
            self.reporter.info(f"--max-time reached after update {n}; checkpoint saved")
        return stop

    def _end_of_epoch(self) -> str:
        cfg, progress = self.cfg, self.progress
        completed = progress.epoch
        is_best, best_file = False, None
        if (self.valid_split is not None and cfg.validate_interval and completed % cfg.validate_interval == 0
                and progress.validated_at != progress.num_updates):  # not twice for one update
            is_best, best_file = self._validate()
        progress.epoch, progress.batches_done = completed + 1, 0
        last_epoch = bool(cfg.max_epoch) and completed >= cfg.max_epoch
        stop = "max_epoch" if last_epoch else self._patience_exhausted()
        if (cfg.save_interval and completed % cfg.save_interval == 0) or is_best or stop or best_file:
            self._save(end_of_epoch=True, is_best=is_best, completed_epoch=completed, best_file=best_file)
        return stop

    def _patience_exhausted(self) -> str:
        if self.cfg.patience and self.progress.patience_counter >= self.cfg.patience:
            self.reporter.info(f"stopping: no improvement in {self.cfg.patience} validations (--patience)")
            return "patience"
        return ""

    def _time_is_up(self, at_log: bool) -> bool:
        if not self.cfg.max_time:
            return False
        if self.dist.world_size == 1:
            return time.monotonic() - self.start_time >= self.cfg.max_time
        if not at_log:  # ranks agree only at log points, where they already communicate
            return False
        elapsed = torch.tensor([time.monotonic() - self.start_time], device=self.engine.device)
        return distributed.all_reduce_max(elapsed, self.dist).item() >= self.cfg.max_time

    # --- logging, validation, checkpoints ---------------------------------------------

    def _log_train(self) -> None:
        n = self.progress.num_updates
        totals = self.window.totals(self.dist)
        self._raise_if_loss_not_finite()
        now = time.monotonic()
        record = {
            "type": "train", "epoch": self.progress.epoch, "update": n,
            "loss": per_token_bits(totals.loss, totals.tokens), "nll": per_token_bits(totals.nll, totals.tokens),
            "ppl": 2 ** per_token_bits(totals.nll, totals.tokens), "lr": self.engine.schedule.lr_at(n),
            "gnorm": totals.grad_norm, "tokens_per_s": totals.tokens / max(now - self.window.start_time, 1e-9),
            "wall": now - self.start_time,
        }
        if self.engine.scaler is not None:
            record["overflows"] = totals.overflows
            record["loss_scale"] = self.engine.scaler.get_scale()
            if record["loss_scale"] < 1e-4:
                raise NmtError(f"fp16 loss scale fell to {record['loss_scale']:g} by update {n}: training diverged")
        if self.engine.device.type == "cuda":
            record["gpu_peak_mem_gb"] = torch.cuda.max_memory_allocated(self.engine.device) / 2**30
        eta = eta_seconds(Limits(self.cfg.max_update, self.cfg.max_time), now - self.start_time,
                          n - self.start_updates, n)
        self.reporter.train_line(record, eta)
        self._write_record(record)
        self.window = Window.start(self.engine.device)

    def _raise_if_loss_not_finite(self) -> None:
        """Before each log, validation and save: a NaN loss stops the run there."""
        self.window.raise_if_not_finite(self.engine.scaler is not None, self.dist, self.save_dir / LAST)

    def _write_record(self, record: dict[str, Any]) -> None:
        self.log.write(record)
        self.progress.log_records += 1
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def close(self) -> None:
        """Stop the live display (so that a final error line shows below it) and close the TensorBoard log."""
        self.reporter.stop_live()
        if self.tensorboard is not None:
            self.tensorboard.close()

    def _validate(self) -> tuple[bool, KeepBestChange | None]:
        """Validate, update best metric and patience: whether this is the best so far, and
        the --keep-best-checkpoints change that the save after it writes (None: no file)."""
        self._raise_if_loss_not_finite()
        with self._validation_weights():
            metrics: dict[str, Any] = evaluate(self.engine, self.valid_split, self.valid_batches)
            if self.valid_bleu is not None:
                metrics.update(self._eval_bleu().record_fields())
        self.progress.validated_at = self.progress.num_updates
        metric = self.cfg.best_checkpoint_metric
        value = metrics[metric]
        is_best = is_better(value, self.progress.best_metric, metric)
        if is_best:
            self.progress.best_metric, self.progress.patience_counter = value, 0
        else:
            self.progress.patience_counter += 1
        best_files = keep_best(self.progress.best_checkpoints, value, metric, self.cfg.keep_best_checkpoints)
        self.progress.best_checkpoints = best_files.kept
        record = {"type": "valid", "subset": self.cfg.valid_subset, "epoch": self.progress.epoch,
                  "update": self.progress.num_updates, **metrics, "best": self.progress.best_metric}
        record["wall"] = time.monotonic() - self.start_time  # for curves against time (`nmt plot`)
        self.reporter.valid_line(record)
        self._write_record(record)
        return is_best, best_files if best_files.write is not None else None

    def _validation_weights(self) -> AbstractContextManager:
        """With --ema-validate, the EMA in the model that validation runs; else nothing changes."""
        if self.ema is not None and self.cfg.ema_validate:
            return self.ema.weights_swapped_into(self.engine.working_model)
        return nullcontext()
    def _eval_bleu(self) -> BleuScores:
        """--eval-bleu on the model being trained: translated and scored by the main rank."""
        assert self.valid_bleu is not None
        engine = self.engine
        scores = (self.valid_bleu.score(engine.working_model, engine.device, engine.autocast, self.reporter.info)
                  if self.dist.is_main else None)
        return shared_scores(scores, self.dist, engine.device)

    def _save(self, end_of_epoch: bool, is_best: bool, completed_epoch: int | None = None,
              best_file: KeepBestChange | None = None) -> None:
        """`best_file`: the --keep-best-checkpoints file the validation before it made."""
        self._raise_if_loss_not_finite()
        log_window = self.window.checkpoint_state(self.dist)
        if not self.dist.is_main:
            return
        epoch = completed_epoch if completed_epoch is not None else self.progress.epoch
        names = checkpoint_names(epoch, self.progress.num_updates, end_of_epoch, self.cfg, is_best,
                                 also=best_file.write if best_file is not None else None)
        doomed = checkpoints_to_prune(self.save_dir, names, self.cfg)
        if best_file is not None:
            doomed += [name for name in best_file.remove if name not in names]
        write_checkpoints(self._checkpoint_state(epoch, log_window), self.save_dir, names, doomed)

    def _checkpoint_state(self, epoch: int, log_window: dict[str, Any]) -> dict[str, Any]:
        engine, data = self.engine, self.data
        state = model_checkpoint(self.model_cfg, engine.model.state_dict(), data.source_lang, data.target_lang,
                                 data.src_dict.symbols, data.tgt_dict.symbols, self.progress.num_updates, epoch)
        state.update({
            "train_config": self.cfg.to_dict(),
            "optimizer": engine.optimizer.state_dict(),
            # warmup_updates: the warm-up in effect, which tells this nmt's fixed schedule from older ones'.
            "scheduler": {"name": engine.schedule.name, "num_updates": self.progress.num_updates,
                          "warmup_updates": engine.schedule.warmup_updates},
            "scaler": engine.scaler.state_dict() if engine.scaler is not None else {},
            "rng": capture_rng(),
            "log_window": log_window,
            "data_fingerprint": self.data_fingerprint,
        })
        if self.ema is not None:
            state["ema"] = self.ema.checkpoint_state()
        state.update(progress_to_checkpoint(self.progress, epoch))
        return state

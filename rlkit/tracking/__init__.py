"""Experiment tracking: loggers (wandb, JSONL, null) behind one interface, and HF-folder export."""

from rlkit.tracking.loggers import JSONLLogger, Logger, MultiLogger, NullLogger, WandbLogger, build_logger

__all__ = ["JSONLLogger", "Logger", "MultiLogger", "NullLogger", "WandbLogger", "build_logger"]

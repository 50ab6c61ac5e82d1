"""Experiment tracking: loggers (wandb, JSONL, several or none) behind one interface, and HF-folder export."""

from rlkit.tracking.loggers import JSONLLogger, Logger, MultiLogger, WandbLogger, build_logger

__all__ = ["JSONLLogger", "Logger", "MultiLogger", "WandbLogger", "build_logger"]

"""What starting a session cost and said: seconds per part, one progress line per engine, the warnings.

Why: building a session takes 10-30 s on a CPU machine (a Megatron-Core policy, a vLLM engine), and without a
word the cell just hangs. So each engine announces itself and its time on one line::

    rlkit: starting the policy (Megatron-Core) ... ready in 2.1 s
    rlkit: starting the generator (vLLM, in this process) ... ready in 8.4 s

and everything else stays quiet: every part runs in :func:`rlkit.quiet.quiet_engine_start`, which holds back the
third-party notices rlkit knows to be harmless. Warnings that remain (rlkit's own, or anything unexpected)
are shown as usual and kept in :attr:`StartupReport.warnings`, which the session card shows on top.
``session.startup`` is the report; ``make bench`` prints it for the fast preset.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from rlkit.quiet import Held, quiet_engine_start, sorted_warnings


@dataclass
class StartupReport:
    """Seconds per part of a session's start (config, model folder, tokenizer, environment, data, policy, generator),
    how many known third-party notices were held back, and the warnings shown while it started."""

    verbose: bool = False  # True: nothing held back
    seconds: dict[str, float] = field(default_factory=dict)
    held_back: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        """Seconds of all parts together."""
        return sum(self.seconds.values())

    @contextlib.contextmanager
    def part(self, name: str, engine: Optional[str] = None, quiet: bool = True) -> Iterator[None]:
        """Time the block as ``name``, quietly (unless verbose); an ``engine`` (e.g. ``"vLLM, in this process"``)
        also gets its progress line. ``quiet=False`` holds nothing back and only keeps the warnings shown (the
        config's load: rlkit's config checks warn there, e.g. about a model folder that holds another model than
        the preset's)."""
        if engine is not None:
            print(f"rlkit: starting the {name} ({engine}) ...", end="", flush=True)
        t0 = time.perf_counter()
        ok, held = False, Held()
        try:
            with (quiet_engine_start(self.verbose) if quiet else sorted_warnings(held)) as held:
                yield
            ok = True
        finally:
            self.seconds[name] = time.perf_counter() - t0
            self._keep(held)
            if engine is not None:
                print(f" ready in {self.seconds[name]:.1f} s" if ok else " failed", flush=True)

    def joined(self, later: "StartupReport") -> None:
        """Put ``later``'s parts and warnings after this one's (the session's start after its config's load)."""
        self.seconds.update(later.seconds)
        self.held_back += later.held_back
        self.warnings += later.warnings
        self.verbose = later.verbose

    def _keep(self, held: Held) -> None:
        self.held_back += held.dropped
        self.warnings += [f"{w.category.__name__}: {w.message}" for w in held.shown]  # as the session card lists them

    def breakdown(self) -> str:
        """``12.3 s: model folder 0.1 s, tokenizer 0.1 s, ...``"""
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.seconds.items())
        return f"{self.total:.1f} s: {parts}"

    def __repr__(self) -> str:
        held = "" if self.verbose else f"; {self.held_back} known third-party notice(s) held back (verbose=True shows them)"
        shown = f"; {len(self.warnings)} warning(s)" if self.warnings else ""
        return f"StartupReport({self.breakdown()}{held}{shown})"


def policy_engine(config: Any) -> str:
    """The policy backend a config builds, in words (what :func:`rlkit.builders.build_policy` picks)."""
    p = config.policy
    workers = p.num_workers > 1 or p.ray_address is not None
    return p.backend_section.start_words + (f", {p.num_workers} Ray workers" if workers else "")


def generator_engine(config: Any) -> str:
    """The generation engine a config builds, in words (what :func:`rlkit.builders.build_generation` picks)."""
    where = ", in this process" if config.generation_colocated else ", in a Ray actor"
    return config.policy.generation.engine.words + where

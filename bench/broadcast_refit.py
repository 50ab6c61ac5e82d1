"""Broadcast refit time divided by a raw broadcast of the same bytes over the same group, in one run.

The refit (``BroadcastWeightSync``) exports the policy's HF-named tensors in buckets of whole fused groups,
tells the engine's Ray actor each bucket's layout, broadcasts the tensors (gloo on CPU, NCCL on GPU), and
the actor reloads them into vLLM; then the prefix cache is reset. The baseline broadcasts one flat buffer
of the same size to the same actor over the same group and discards it (a Ray call + one broadcast; its
receiving end, ``RawReceiver``, is benchmark code, mixed into the actor next to the refit's receiver), and also
the same bytes as one broadcast per exported tensor, all in flight, into buffers kept across calls (the refit's
own message pattern); the floor is the faster of the two. (On 2026-12-01 the one-message broadcast took 106-213 ms
where it had taken 57 ms, slower than the whole refit's 94-140 ms of the same bytes: one 76 MB gloo message was no
longer the fastest way to move them, and the ratio against it, 0.50-0.55, said nothing.)
A third side reloads the same tensors into vLLM inside the actor with no transfer under it (kept from a refit):
the refit can take no less than the longer of that and the raw broadcast, and the bench prints the refit over
that too. The sides alternate, so drift in machine load hits all of them equally; medians over repeats.

It also counts CPU-seconds (all threads) in this process and in the actor for each: on a machine with few
cores their sum over the cores is a floor under the wall time that no overlap can beat, printed as a ratio
to the raw broadcast next to the measured one.
Usage: python bench/broadcast_refit.py [--preset small] [--repeats 7] [--bucket-mb 256]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from rlkit.distributed import broadcast
from rlkit.weight_sync import BroadcastReceiver


class RawReceiver(BroadcastReceiver):
    """The actor's end of the refit, plus the baseline's: receive a broadcast of ``nbytes`` and discard it."""

    def receive_bytes(self, nbytes: int) -> float:
        """Receive and discard ``nbytes``; returns this process's CPU-seconds for it."""
        c0 = time.process_time()
        flat = torch.empty(nbytes, dtype=torch.uint8, device=self.weight_device)
        broadcast(self.weight_group, flat, root=0)
        return time.process_time() - c0

    def receive_tensors(self, sizes: list[int]) -> float:
        """Receive one broadcast per entry of ``sizes`` (bytes) into buffers kept across calls, all posted at
        once, and discard them; returns this process's CPU-seconds for it."""
        from rlkit.distributed import start_broadcast

        c0 = time.process_time()
        if [b.numel() for b in getattr(self, "raw_buffers", [])] != sizes:
            self.raw_buffers = [torch.empty(n, dtype=torch.uint8, device=self.weight_device) for n in sizes]
        for work in [start_broadcast(self.weight_group, b) for b in self.raw_buffers]:
            work.wait()
        return time.process_time() - c0

    def receive_weights(self) -> dict[str, float]:
        c0 = time.process_time()
        clock = super().receive_weights()
        return dict(clock, cpu=time.process_time() - c0)

    def keep_next_refit(self) -> None:
        """Keep a copy of the tensors the next refit brings, for :meth:`reload_kept`."""
        self.kept, self.keeping = [], True

    def _incoming(self, clock, failures):
        for name, tensor in super()._incoming(clock, failures):
            if getattr(self, "keeping", False):
                self.kept.append((name, tensor.clone()))
            yield name, tensor
        self.keeping = False

    def reload_kept(self) -> tuple[float, float]:
        """Reload the kept tensors, already in this process, into vLLM: the actor's reload with no transfer
        under it; returns its (wall, CPU) seconds."""
        t0, c0 = time.perf_counter(), time.process_time()
        self.update_weights(iter(self.kept))
        return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--bucket-mb", type=float, default=256.0)
    args = parser.parse_args()

    import ray

    from rlkit.config.components import GenerationConfig, PolicyConfig
    from rlkit.distributed import start_broadcast
    from rlkit.generation.remote import RemoteGenerator
    from rlkit.models import make_model
    from rlkit.models.factory import count_parameters
    from rlkit.policy.megatron.policy import MegatronPolicy
    from rlkit.weight_sync import BroadcastWeightSync, ColocatedWeightSync
    from rlkit.weight_sync.broadcast import as_bytes

    with tempfile.TemporaryDirectory() as tmp:
        path = make_model(tmp, args.preset, "llama")
        params = count_parameters(path)
        policy = MegatronPolicy(PolicyConfig(model_name=str(path)))
        generator = RemoteGenerator(path, GenerationConfig(), max_model_len=64, actor_extension=RawReceiver)
        try:
            sync = BroadcastWeightSync(generator, bucket_bytes=args.bucket_mb * 1e6)
            report = sync.sync(policy, generator)  # warm-up; opens the group
            nbytes = report.bytes_moved
            device = next(t for g in policy.export_hf_groups() for _, t in g).device
            flat = torch.ones(nbytes, dtype=torch.uint8, device=device)

            def raw() -> tuple[float, float]:
                """Wall seconds of a raw broadcast, and the CPU-seconds it took here and in the actor."""
                t0, c0 = time.perf_counter(), time.process_time()
                receiving = generator.actor.receive_bytes.remote(nbytes)
                start_broadcast(sync.group, flat).wait()
                actor_cpu = ray.get(receiving)
                return time.perf_counter() - t0, time.process_time() - c0 + actor_cpu

            tensors = [as_bytes(t).clone() for g in policy.export_hf_groups() for _, t in g]
            sizes = [t.numel() for t in tensors]

            def raw_tensors() -> tuple[float, float]:
                """The same, as one broadcast per exported tensor, all in flight (how the refit sends them)."""
                t0, c0 = time.perf_counter(), time.process_time()
                receiving = generator.actor.receive_tensors.remote(sizes)
                for work in [start_broadcast(sync.group, t) for t in tensors]:
                    work.wait()
                actor_cpu = ray.get(receiving)
                return time.perf_counter() - t0, time.process_time() - c0 + actor_cpu

            generator.actor.keep_next_refit.remote()
            sync.sync(policy, generator)
            raw(), raw_tensors(), ray.get(generator.actor.reload_kept.remote())  # warm-up
            refit, baseline, store, load, refit_cpu, raw_cpu = [], [], [], [], [], []
            per_tensor, per_tensor_cpu, alone, alone_cpu = [], [], [], []
            for _ in range(args.repeats):
                c0 = time.process_time()
                report = sync.sync(policy, generator)
                refit_cpu.append(time.process_time() - c0 + sync.last_actor_seconds["cpu"])
                refit.append(report.seconds)
                load.append(sync.last_actor_seconds["load"])
                wall, cpu = raw()
                baseline.append(wall)
                raw_cpu.append(cpu)
                wall, cpu = raw_tensors()
                per_tensor.append(wall)
                per_tensor_cpu.append(cpu)
                wall, cpu = ray.get(generator.actor.reload_kept.remote())
                alone.append(wall)
                alone_cpu.append(cpu)
            for _ in range(max(1, args.repeats // 2)):  # for reference: tensors through Ray's object store
                store.append(ColocatedWeightSync().sync(policy, generator).seconds)
        finally:
            generator.close()
            policy.close()

    r, one, o, lo, rc, one_cpu, each, each_cpu, al, al_cpu = (statistics.median(x) for x in (
        refit, baseline, store, load, refit_cpu, raw_cpu, per_tensor, per_tensor_cpu, alone, alone_cpu))
    b, bc = min((one, one_cpu), (each, each_cpu))  # the floor: the faster way to broadcast the same bytes
    cores = len(os.sched_getaffinity(0))
    print(f"model: {args.preset} llama, {params / 1e6:.1f}M parameters, {nbytes / 1e6:.1f} MB, "
          f"{report.num_buckets} bucket(s) of <= {args.bucket_mb:.0f} MB, {sync.backend}, {args.repeats} repeats")
    print(f"broadcast refit (export, broadcast, vLLM reload, cache reset): {r * 1e3:8.1f} ms  ({nbytes / r / 1e9:.2f} GB/s)")
    print(f"  of which vLLM reload_weights in the actor:                   {lo * 1e3:8.1f} ms")
    print(f"  the actor's reload of the same tensors, already received:   {al * 1e3:8.1f} ms  (CPU {al_cpu * 1e3:.1f} ms)")
    print(f"raw broadcast of the same bytes, one message:                  {one * 1e3:8.1f} ms  ({nbytes / one / 1e9:.2f} GB/s)")
    print(f"raw broadcast of the same tensors, {len(sizes):4d} messages in flight:   {each * 1e3:8.1f} ms  "
          f"({nbytes / each / 1e9:.2f} GB/s)")
    print(f"(reference) refit through Ray's object store:                  {o * 1e3:8.1f} ms")
    print(f"CPU-seconds, this process + the actor: refit {rc * 1e3:.1f} ms, raw broadcast {bc * 1e3:.1f} ms; on "
          f"{cores} cores a refit cannot take less than {rc / cores * 1e3:.1f} ms = {rc / cores / b:.2f}x the raw broadcast")
    print(f"broadcast refit / the longer of its two halves alone (raw broadcast, the actor's reload): "
          f"{r / max(b, al):.2f} (1.0 would be a transfer wholly hidden under the reload, or the reverse)")
    print(f"ratio broadcast refit / raw broadcast (the faster of the two): {r / b:.2f} "
          f"(load average {os.getloadavg()[0]:.1f})")
    print(f"broadcast_refit_over_raw={r / b:.3f} broadcast_refit_ms={r * 1e3:.1f} raw_broadcast_ms={b * 1e3:.1f} "
          f"raw_one_message_ms={one * 1e3:.1f} raw_per_tensor_ms={each * 1e3:.1f} "
          f"actor_reload_ms={lo * 1e3:.1f} actor_reload_alone_ms={al * 1e3:.1f} "
          f"refit_over_longer_half={r / max(b, al):.3f} buckets={report.num_buckets} refit_cpu_floor_over_raw={rc / cores / b:.3f}")

if __name__ == "__main__":
    main()

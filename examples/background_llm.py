"""A background LLM service that holds the accelerator only while npud lets it.

    npu serve --runtime-dir /tmp/npu --no-drivers &      # in another terminal
    python examples/background_llm.py --runtime-dir /tmp/npu

Uses the asyncio client: ``async with mgr.reserve(request) as lease`` waits
for CAN_LOAD_NOW, reports the model loaded, and reports it unloaded when the
block ends. The service works until npud asks for the accelerator back (a
foreground app arrived, the device got hot), then leaves and asks again.
"""

from __future__ import annotations

import argparse
import asyncio

from npumanager import AsyncNpuManager, ModelLoadRequest, ModelPriority, ModelSize


async def serve_llm(runtime_dir: str | None, rounds: int, work_s: float) -> None:
    async with await AsyncNpuManager.connect(runtime_dir) as mgr:
        for i in range(1, rounds + 1):
            request = ModelLoadRequest(i, ModelSize.GREATER_THAN_2G, ModelPriority.BACKGROUND)
            print(f"round {i}: asking npud for room for a >2 GB model...")
            async with mgr.reserve(request) as lease:
                print(f"round {i}: loaded under grant {(lease.grant_id or '?')[:8]}")
                try:
                    reason = await asyncio.wait_for(lease.unload_requested(), work_s)
                    print(f"round {i}: npud wants the accelerator back ({reason}); leaving")
                except TimeoutError:
                    print(f"round {i}: work done; leaving")
            # npud's COMPLETE may still be on its way (it follows the driver's release):
            # a status here is one that came first, a REVOKED above all.
            ended = f" ({lease.status.name})" if lease.status else ""
            print(f"round {i}: unloaded{ended}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime-dir", default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work-seconds", type=float, default=2.0)
    args = ap.parse_args()
    asyncio.run(serve_llm(args.runtime_dir, args.rounds, args.work_seconds))


if __name__ == "__main__":
    from npumanager.errors import NpuError

    try:
        main()
    except NpuError as exc:  # npud absent or refusing: a sentence, not a traceback
        raise SystemExit(f"{__file__.rsplit('/', 1)[-1]}: {type(exc).__name__}: {exc}") from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None

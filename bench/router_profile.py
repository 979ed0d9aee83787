"""``argus endpoint`` in this process, optionally on uvloop and under cProfile: for
``bench/router_vs_ray.py`` (``--uvloop``, ``--profile DIR``) only.

Usage: ``python bench/router_profile.py [--uvloop] [--profile FILE] -- endpoint --listen ...``:
what follows ``--`` is the ``argus`` command line, run by ``reconciler.cli.main`` unchanged (the
endpoint is single-threaded asyncio, so the profile of this main thread is the whole endpoint).
``--uvloop`` installs uvloop's event loop policy before ``asyncio.run`` (argus itself does not);
``--profile FILE`` writes cProfile's stats (CPU time, the whole process's life) there when the
endpoint stops (SIGTERM).
"""

from __future__ import annotations

import cProfile
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    if "--" not in argv:
        raise SystemExit(__doc__)
    cut = argv.index("--")
    ours, argus = argv[:cut], argv[cut + 1 :]
    profile = None
    while ours:
        opt = ours.pop(0)
        if opt == "--uvloop":
            import uvloop

            uvloop.install()
        elif opt == "--profile" and ours:
            profile = ours.pop(0)
        else:
            raise SystemExit(f"unknown option {opt!r}\n{__doc__}")

    from reconciler.cli import main as argus_main

    if profile is None:
        return argus_main(argus)
    prof = cProfile.Profile(time.process_time)  # CPU time: waits on sockets and preemption are not counted
    prof.enable()
    try:
        return argus_main(argus)
    finally:
        prof.disable()
        prof.dump_stats(profile)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

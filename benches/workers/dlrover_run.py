"""``dlrover-run`` for the benchmark: DLRover's own launcher (``dlrover.trainer.torch.main``),
with one compatibility shim. DLRover 0.6.1 builds torch's ``SubprocessHandler`` without the
``numa_options`` argument that torch 2.9 and later require; here it defaults to None (no NUMA
binding, as DLRover intends). Nothing else is changed."""

import inspect
import sys

from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

_Handler = subprocess_handler.SubprocessHandler
if "numa_options" in inspect.signature(_Handler.__init__).parameters:
    _init = _Handler.__init__

    def _init_without_numa(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if len(args) < 7:
            kwargs.setdefault("numa_options", None)
        _init(self, *args, **kwargs)

    _Handler.__init__ = _init_without_numa  # type: ignore[method-assign]

from dlrover.trainer.torch.main import main  # noqa: E402

sys.argv[0] = "dlrover-run"
sys.exit(main())

"""Unit tests of drun.dcp (one process, no process group): which files each rank commits, a
StatefulDataLoader's state saved with the step and refused across a world-size change."""

import os
import sys
import tempfile
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import drun  # noqa: E402

try:
    import torch
    import drun.dcp  # noqa: E402
    from torchdata.stateful_dataloader import StatefulDataLoader
except ImportError as e:  # pragma: no cover - CI installs them (.ci/setup)
    if os.environ.get("DRUN_REQUIRE_TORCH") == "1":
        raise ImportError("drun.dcp's tests need torch and torchdata in this python: run .ci/setup "
                          "(%s)" % e) from e
    torch = None

from test_drun import CLEAN, FakeAgent  # noqa: E402


@unittest.skipIf(torch is None, "needs torch and torchdata (DRUN_REQUIRE_TORCH=1 makes it fail)")
class Dcp(unittest.TestCase):
    def setUp(self):
        drun._client.close()

    def test_each_file_belongs_to_one_rank(self):
        d = tempfile.mkdtemp()
        for name in (".metadata", "__0_0.distcp", "__1_0.distcp", "__1_1.distcp",
                     "loader-rank1.pt", ".metadata.tmp", "drun-manifest-4-1.json"):
            open(os.path.join(d, name), "w").close()
        names = [[os.path.basename(p) for p in drun.dcp.files_of_rank(d, r)] for r in range(3)]
        self.assertEqual(names, [[".metadata", "__0_0.distcp"],
                                 ["__1_0.distcp", "__1_1.distcp", "loader-rank1.pt"], []])

    def test_save_commits_what_dcp_wrote_and_load_restores_model_and_loader(self):
        agent = FakeAgent(lambda r: {"ok": True, "sealed": True, "waiting_for": []})
        d = tempfile.mkdtemp()
        env = dict(CLEAN, DRUN_AGENT_SOCK=agent.path, RANK="0", WORLD_SIZE="1",
                   DRUN_GENERATION="1", DRUN_CKPT_DIR=d, DRUN_RUN_ID="job")
        loader = StatefulDataLoader(list(range(20)), batch_size=2)
        batches = iter(loader)
        next(batches), next(batches), next(batches)
        model = torch.nn.Linear(3, 2)
        with mock.patch.dict(os.environ, env, clear=True):
            answer = drun.dcp.save({"model": model.state_dict()}, 6, loader=loader)
        self.assertTrue(answer["sealed"])
        req = agent.requests[0]
        self.assertNotIn("cursor", req, "no sampler, no cursor")
        names = sorted(os.path.basename(f["path"]) for f in req["files"])
        self.assertEqual(names, [".metadata", "__0_0.distcp", "loader-rank0.pt"])
        step_dir = os.path.dirname(req["files"][0]["path"])
        self.assertEqual(step_dir, os.path.join(d, "job", "step-00000006-g1"))

        fresh = torch.nn.Linear(3, 2)
        state = {"model": fresh.state_dict()}
        resumed_loader = StatefulDataLoader(list(range(20)), batch_size=2)
        resumed = dict(CLEAN, RANK="0", WORLD_SIZE="1", DRUN_RESUME_STEP="6",
                       DRUN_RESUME_PATH=step_dir, DRUN_RESUME_WORLD_SIZE="1")
        with mock.patch.dict(os.environ, resumed, clear=True):
            self.assertEqual(drun.dcp.load(state, loader=resumed_loader), 6)
        self.assertTrue(torch.equal(state["model"]["weight"], model.weight))
        self.assertEqual(next(iter(resumed_loader)).tolist(), [6, 7], "the loader goes on")

        elastic = dict(resumed, DRUN_RESUME_WORLD_SIZE="2")
        with mock.patch.dict(os.environ, elastic, clear=True):
            with self.assertRaisesRegex(ValueError, "saved by 2 ranks, this generation has 1: "
                                        "a StatefulDataLoader's per-rank state cannot be "
                                        "re-split; use drun.ElasticSampler"):
                drun.dcp.load(state, loader=resumed_loader)

    def test_outside_drun_load_starts_fresh(self):
        with mock.patch.dict(os.environ, CLEAN, clear=True):
            self.assertIsNone(drun.dcp.load({}))


if __name__ == "__main__":
    unittest.main()

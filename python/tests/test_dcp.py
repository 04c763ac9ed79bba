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

    def test_under_ckpt_memory_dcp_writes_memory_and_commits_staged(self):
        agent = FakeAgent(lambda r: {"ok": True, "sealed": False, "staged": True})
        d, stage = tempfile.mkdtemp(), tempfile.mkdtemp()
        env = dict(CLEAN, DRUN_AGENT_SOCK=agent.path, RANK="0", WORLD_SIZE="1",
                   DRUN_GENERATION="3", DRUN_CKPT_DIR=d, DRUN_RUN_ID="job",
                   DRUN_CKPT_STAGE_DIR=stage)
        loader = StatefulDataLoader(list(range(20)), batch_size=2)
        model = torch.nn.Linear(3, 2)
        with mock.patch.dict(os.environ, env, clear=True):
            answer = drun.dcp.save({"model": model.state_dict()}, 5, loader=loader)
        self.assertTrue(answer["staged"])
        final = os.path.join(d, "job", "step-00000005-g3")
        self.assertFalse(os.path.exists(final), "nothing on disk: the agent persists it")
        staged = os.path.join(stage, "job", "step-00000005-g3")
        req = agent.requests[0]
        self.assertIn("save_started_ms", req)
        self.assertEqual(sorted(os.path.basename(f["path"]) for f in req["files"]),
                         [".metadata", "__0_0.distcp", "loader-rank0.pt"])
        for f in req["files"]:
            self.assertTrue(f["staged"], f)
            self.assertEqual(os.path.dirname(f["path"]), final, "named by their place on disk")
            self.assertNotIn("sha256", f, "the agent hashes them as it persists them")
            here = os.path.join(staged, os.path.basename(f["path"]))
            self.assertEqual(os.path.getsize(here), f["bytes"])
        self.assertEqual(drun._STATE.staged, {}, "nothing left to report twice")
        # Resumed from the staged directory (a restart under the same agent).
        fresh = {"model": torch.nn.Linear(3, 2).state_dict()}
        resumed = dict(CLEAN, RANK="0", WORLD_SIZE="1", DRUN_RESUME_STEP="5",
                       DRUN_RESUME_PATH=staged, DRUN_RESUME_WORLD_SIZE="1")
        with mock.patch.dict(os.environ, resumed, clear=True):
            self.assertEqual(drun.dcp.load(fresh), 5)
        self.assertTrue(torch.equal(fresh["model"]["weight"], model.weight))

    def test_a_dcp_save_that_cannot_be_staged_goes_to_disk_with_one_warning(self):
        agent = FakeAgent(lambda r: {"ok": True, "sealed": True})
        d = tempfile.mkdtemp()
        blocked = os.path.join(tempfile.mkdtemp(), "gone")
        open(blocked, "w").close()  # a file where the staging directory should be
        env = dict(CLEAN, DRUN_AGENT_SOCK=agent.path, RANK="0", WORLD_SIZE="1",
                   DRUN_GENERATION="1", DRUN_CKPT_DIR=d, DRUN_RUN_ID="job",
                   DRUN_CKPT_STAGE_DIR=blocked)
        drun._STATE.stage_warned = False
        with mock.patch.dict(os.environ, env, clear=True), mock.patch("sys.stderr") as err:
            drun.dcp.save({"model": torch.nn.Linear(3, 2).state_dict()}, 2)
        lines = "".join(c.args[0] for c in err.write.call_args_list)
        self.assertEqual(lines.count("cannot stage the checkpoint in memory"), 1, lines)
        files = agent.requests[0]["files"]
        self.assertEqual(sorted(os.path.basename(f["path"]) for f in files),
                         [".metadata", "__0_0.distcp"])
        for f in files:
            self.assertNotIn("staged", f)
            self.assertEqual(os.path.getsize(f["path"]), f["bytes"], "on disk")
            self.assertEqual(len(f["sha256"]), 64)

    def test_outside_drun_load_starts_fresh(self):
        with mock.patch.dict(os.environ, CLEAN, clear=True):
            self.assertIsNone(drun.dcp.load({}))


if __name__ == "__main__":
    unittest.main()

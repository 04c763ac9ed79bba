"""Unit tests of the drun Python helper (run: python -m unittest discover -s python/tests)."""

import hashlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import drun  # noqa: E402

try:
    import torch
    from torch.utils.data.distributed import DistributedSampler
except ImportError:  # pragma: no cover - CI requires torch
    torch = None
    if os.environ.get("DRUN_REQUIRE_TORCH") == "1":
        raise

CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("DRUN_", "RANK", "WORLD_SIZE"))}


def resumed_env(epoch, samples):
    env = dict(CLEAN)
    env.update(DRUN_RESUME_STEP="3", DRUN_DATA_EPOCH=str(epoch),
               DRUN_GLOBAL_SAMPLES=str(samples))
    return env


@unittest.skipIf(torch is None, "torch is not installed")
class SamplerMatchesDistributedSampler(unittest.TestCase):
    def test_same_indices_per_rank_and_epoch(self):
        n, seed = 96, 17
        for world in (1, 2, 3, 4):
            for epoch in (0, 1, 5):
                for rank in range(world):
                    with mock.patch.dict(os.environ, CLEAN, clear=True):
                        ours = drun.ElasticSampler(n, seed=seed, global_batch=12, rank=rank,
                                                   world_size=world)
                    ours.set_epoch(epoch)
                    ref = DistributedSampler(list(range(n)), num_replicas=world, rank=rank,
                                             shuffle=True, seed=seed)
                    ref.set_epoch(epoch)
                    self.assertEqual(list(ours), list(ref), (world, epoch, rank))
                    self.assertEqual(len(ours), len(ref))


class Resharding(unittest.TestCase):
    def perm(self, n, seed, epoch):
        return drun._permutation(n, seed, epoch, True)

    def test_remaining_suffix_is_covered_exactly_after_n_to_m(self):
        n, seed, batch = 240, 3, 12
        for old_world, new_world in ((4, 2), (2, 4), (4, 3), (1, 6), (3, 1)):
            steps_done = 7
            with mock.patch.dict(os.environ, CLEAN, clear=True):
                before = [drun.ElasticSampler(n, seed, batch, rank=r, world_size=old_world)
                          for r in range(old_world)]
            consumed = []
            for s in before:
                consumed += s.indices()[: steps_done * s.local_batch]
            cursor = before[0].cursor(steps_done)
            self.assertTrue(all(s.cursor(steps_done) == cursor for s in before))
            self.assertEqual(cursor["consumed_in_epoch"], steps_done * batch)
            with mock.patch.dict(os.environ, resumed_env(cursor["epoch"],
                                                         cursor["consumed_in_epoch"]),
                                 clear=True):
                after = [drun.ElasticSampler(n, seed, batch, rank=r, world_size=new_world)
                         for r in range(new_world)]
            rest = []
            for s in after:
                rest += s.indices()
            perm = self.perm(n, seed, 0)
            self.assertEqual(sorted(consumed), sorted(perm[: steps_done * batch]))
            self.assertEqual(sorted(rest), sorted(perm[steps_done * batch:]))
            self.assertEqual(sorted(consumed + rest), list(range(n)), (old_world, new_world))
            # Step k after the resume consumes exactly the next global batch of the permutation.
            local = after[0].local_batch
            for k in range(after[0].steps_per_epoch - steps_done):
                step = []
                for s in after:
                    step += s.indices()[k * local:(k + 1) * local]
                lo = (steps_done + k) * batch
                self.assertEqual(sorted(step), sorted(perm[lo:lo + batch]))

    def test_cursor_rolls_into_the_next_epoch_and_offset_is_per_epoch(self):
        with mock.patch.dict(os.environ, resumed_env(2, 24), clear=True):
            s = drun.ElasticSampler(50, seed=0, global_batch=8, rank=0, world_size=2)
        self.assertEqual((s.epoch, s.start, s.start_step, s.usable), (2, 24, 3, 48))
        self.assertEqual(s.cursor(3), {"epoch": 3, "consumed_in_epoch": 0,
                                       "consumed_total": 144, "seed": 0,
                                       "dataset_len": 50, "global_batch": 8})
        with self.assertRaisesRegex(ValueError, "run past the end of epoch 2"):
            s.cursor(4)
        s.set_epoch(3)
        self.assertEqual(s.start, 0)
        self.assertEqual(len(s), 24)

    def test_a_cursor_of_another_dataset_or_batch_is_refused(self):
        d = tempfile.mkdtemp()
        manifest = os.path.join(d, "m.json")
        with open(manifest, "w") as f:
            json.dump({"cursor": {"epoch": 0, "consumed_in_epoch": 16, "dataset_len": 64,
                                  "global_batch": 8, "seed": 0}}, f)
        env = dict(resumed_env(0, 16), DRUN_RESUME_MANIFEST=manifest)
        with mock.patch.dict(os.environ, env, clear=True):
            drun.ElasticSampler(64, seed=0, global_batch=8, rank=0, world_size=2)
            with self.assertRaisesRegex(ValueError, "global_batch=8 but this sampler global_batch=16"):
                drun.ElasticSampler(64, seed=0, global_batch=16, rank=0, world_size=2)

    def test_global_batch_must_divide_by_world(self):
        with self.assertRaises(ValueError):
            drun.ElasticSampler(10, global_batch=5, rank=0, world_size=2)


class FakeAgent:
    """A Unix socket that records requests and answers with `reply(request)`; the helper's
    `hello` is answered with `hello` (by default the helper's own protocol) and not recorded."""

    def __init__(self, reply, hello=None):
        self.hello = hello or {"ok": True, "protocol": drun.PROTOCOL, "agent": "test"}
        self.dir = tempfile.mkdtemp()
        self.path = os.path.join(self.dir, "agent.sock")
        self.requests = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(1)
        self.reply = reply
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        conn, _ = self.sock.accept()
        f = conn.makefile("rb")
        for line in f:
            req = json.loads(line)
            if req["op"] == "hello":
                conn.sendall(json.dumps(self.hello).encode() + b"\n")
                continue
            self.requests.append(req)
            conn.sendall(json.dumps(self.reply(req)).encode() + b"\n")


class AgentApi(unittest.TestCase):
    def setUp(self):
        drun._client.close()

    def test_commit_sends_hashes_rank_generation_and_cursor(self):
        agent = FakeAgent(lambda r: {"ok": True, "sealed": r["op"] == "commit", "save": True})
        d = tempfile.mkdtemp()
        env = dict(CLEAN, DRUN_AGENT_SOCK=agent.path, RANK="3", DRUN_GENERATION="5",
                   DRUN_CKPT_DIR=d, DRUN_RUN_ID="job7")
        with mock.patch.dict(os.environ, env, clear=True):
            path = drun.shard_path(40)
            self.assertEqual(path, os.path.join(d, "job7", "step-00000040-g5", "rank3.pt"))
            sha, size = drun.atomic_save(path, lambda f: f.write(b"x" * 1000))
            answer = drun.commit(40, [path], {"epoch": 0, "consumed_in_epoch": 320})
            self.assertTrue(drun.should_save())
        self.assertTrue(answer["sealed"])
        req = agent.requests[0]
        self.assertEqual((req["op"], req["rank"], req["generation"], req["step"]),
                         ("commit", 3, 5, 40))
        self.assertEqual(req["files"], [{"path": path, "bytes": 1000,
                                         "sha256": hashlib.sha256(b"x" * 1000).hexdigest()}])
        self.assertEqual((sha, size), (hashlib.sha256(b"x" * 1000).hexdigest(), 1000))
        self.assertEqual(req["cursor"]["consumed_in_epoch"], 320)
        self.assertEqual(agent.requests[1]["op"], "should_save")

    def test_a_rank_without_files_or_cursor_commits(self):
        agent = FakeAgent(lambda r: {"ok": True, "sealed": False, "waiting_for": []})
        with mock.patch.dict(os.environ, dict(CLEAN, DRUN_AGENT_SOCK=agent.path, RANK="1"),
                             clear=True):
            drun.commit(8, [])
        req = agent.requests[0]
        self.assertEqual((req["op"], req["rank"], req["step"], req["files"]), ("commit", 1, 8, []))
        self.assertNotIn("cursor", req)

    def test_a_fractional_or_negative_step_is_refused_not_rounded(self):
        agent = FakeAgent(lambda r: {"ok": True, "sealed": False, "waiting_for": []})
        with mock.patch.dict(os.environ, dict(CLEAN, DRUN_AGENT_SOCK=agent.path, RANK="0"),
                             clear=True):
            for bad in (1.5, -1, "3"):
                with self.assertRaisesRegex(ValueError, "step must be"):
                    drun.commit(bad, [])
            drun.commit(4.0, [])
        self.assertEqual([r["step"] for r in agent.requests], [4])

    def test_step_dir_is_the_shard_paths_directory(self):
        d = tempfile.mkdtemp()
        env = dict(CLEAN, DRUN_CKPT_DIR=d, DRUN_RUN_ID="job7", DRUN_GENERATION="2", RANK="1")
        with mock.patch.dict(os.environ, env, clear=True):
            sd = drun.step_dir(12)
            self.assertEqual(sd, os.path.join(d, "job7", "step-00000012-g2"))
            self.assertEqual(os.path.dirname(drun.shard_path(12)), sd)
            self.assertTrue(os.path.isdir(sd))

    def test_protocol_mismatch_names_both_versions(self):
        agent = FakeAgent(lambda r: {"ok": True},
                          hello={"ok": True, "protocol": drun.PROTOCOL + 1, "agent": "9.9.9"})
        with mock.patch.dict(os.environ, dict(CLEAN, DRUN_AGENT_SOCK=agent.path), clear=True):
            with self.assertRaisesRegex(
                    drun.DrunError, r"speaks worker-API protocol %d but runs under drun 9\.9\.9, "
                    r"whose worker API is protocol %d: install the helper that ships"
                    % (drun.PROTOCOL, drun.PROTOCOL + 1)):
                drun.progress(1)
        self.assertEqual(agent.requests, [], "nothing is sent after a mismatch")

    def test_an_agent_without_hello_is_named_older(self):
        agent = FakeAgent(lambda r: {"ok": True}, hello={
            "ok": False, "error": "bad request: unknown variant `hello`"})
        with mock.patch.dict(os.environ, dict(CLEAN, DRUN_AGENT_SOCK=agent.path), clear=True):
            with self.assertRaisesRegex(drun.DrunError, "runs under an older drun agent"):
                drun.progress(1)

    def test_the_save_start_goes_with_the_commit(self):
        agent = FakeAgent(lambda r: {"ok": True, "sealed": True, "save": True})
        d = tempfile.mkdtemp()
        env = dict(CLEAN, DRUN_AGENT_SOCK=agent.path, RANK="0", DRUN_CKPT_DIR=d)
        with mock.patch.dict(os.environ, env, clear=True):
            before = int(__import__("time").time() * 1000)
            self.assertTrue(drun.should_save(sync=False))  # asked: the save starts now
            path = drun.shard_path(2)
            drun.atomic_save(path, lambda f: f.write(b"x"))
            drun.commit(2, [path], {"consumed_in_epoch": 8})
            path = drun.shard_path(4)
            drun.atomic_save(path, lambda f: f.write(b"y"))
            drun.commit(4, [path], {"consumed_in_epoch": 16})
            drun.commit(4, [path], {"consumed_in_epoch": 16})
        first, second, third = [r for r in agent.requests if r["op"] == "commit"]
        self.assertGreaterEqual(first["save_started_ms"], before)
        self.assertLessEqual(first["save_started_ms"], second["save_started_ms"])
        self.assertNotIn("save_started_ms", third, "one start per save")

    def test_no_answer_raises_drun_error(self):
        agent = FakeAgent(lambda r: (__import__("time").sleep(2), {"ok": True})[1])
        f = tempfile.NamedTemporaryFile(delete=False)
        f.write(b"abc")
        f.close()
        with mock.patch.dict(os.environ, dict(CLEAN, DRUN_AGENT_SOCK=agent.path), clear=True):
            with self.assertRaisesRegex(drun.DrunError, "no answer from the drun agent to commit"):
                drun.commit(1, f.name, {"consumed_in_epoch": 0}, timeout=0.2)

    def test_refusal_raises_with_the_agents_line(self):
        agent = FakeAgent(lambda r: {"ok": False, "error": "stale commit: generation 2 is over"})
        f = tempfile.NamedTemporaryFile(delete=False)
        f.write(b"abc")
        f.close()
        with mock.patch.dict(os.environ, dict(CLEAN, DRUN_AGENT_SOCK=agent.path), clear=True):
            with self.assertRaisesRegex(drun.DrunError, "generation 2 is over"):
                drun.commit(1, f.name, {"consumed_in_epoch": 0})

    def test_outside_drun_everything_is_a_no_op(self):
        with mock.patch.dict(os.environ, CLEAN, clear=True):
            self.assertIsNone(drun.resume_info())
            self.assertIsNone(drun.commit(1, [], {}))
            self.assertFalse(drun.should_save())
            drun.progress(3)

    def test_atomic_save_leaves_nothing_when_the_writer_fails(self):
        d = tempfile.mkdtemp()
        target = os.path.join(d, "x.pt")

        def boom(f):
            f.write(b"partial")
            raise KeyboardInterrupt

        with self.assertRaises(KeyboardInterrupt):
            drun.atomic_save(target, boom)
        self.assertEqual(os.listdir(d), [])

    def test_a_save_under_ckpt_memory_is_staged_and_committed_staged(self):
        agent = FakeAgent(lambda r: {"ok": True, "sealed": False, "staged": True})
        d, stage = tempfile.mkdtemp(), tempfile.mkdtemp()
        env = dict(CLEAN, DRUN_AGENT_SOCK=agent.path, RANK="1", DRUN_GENERATION="2",
                   DRUN_CKPT_DIR=d, DRUN_RUN_ID="job", DRUN_CKPT_STAGE_DIR=stage)
        with mock.patch.dict(os.environ, env, clear=True):
            path = drun.shard_path(7)
            sha, size = drun.atomic_save(path, lambda f: f.write(b"s" * 64))
            answer = drun.commit(7, [path])
        self.assertTrue(answer["staged"])
        self.assertFalse(os.path.exists(path), "nothing on disk: the agent persists it")
        staged = os.path.join(stage, "job", "step-00000007-g2", "rank1.pt")
        with open(staged, "rb") as f:
            self.assertEqual(f.read(), b"s" * 64)
        self.assertEqual(agent.requests[0]["files"], [
            {"path": path, "bytes": 64, "staged": True}])
        self.assertEqual((sha, size), ("", 64), "the agent hashes it as it persists it")

    def test_a_rank_whose_step_outgrew_its_share_saves_the_next_ones_to_disk(self):
        agent = FakeAgent(lambda r: {"ok": True, "sealed": False, "staged": True})
        d, stage = tempfile.mkdtemp(), tempfile.mkdtemp()
        env = dict(CLEAN, DRUN_AGENT_SOCK=agent.path, RANK="0", DRUN_GENERATION="1",
                   DRUN_CKPT_DIR=d, DRUN_RUN_ID="job", DRUN_CKPT_STAGE_DIR=stage,
                   DRUN_CKPT_STAGE_SHARE="100")
        drun._STATE.last_staged_bytes, drun._STATE.share_warned = 0, False
        try:
            with mock.patch.dict(os.environ, env, clear=True), \
                    mock.patch("sys.stderr") as err:
                # The first step's size is not known before it is written: staged.
                first = drun.shard_path(1)
                drun.atomic_save(first, lambda f: f.write(b"a" * 500))
                drun.commit(1, [first])
                # It did not fit the share: the next ones go straight to --ckpt-dir.
                for step in (2, 3):
                    p = drun.shard_path(step)
                    drun.atomic_save(p, lambda f: f.write(b"b" * 500))
                    drun.commit(step, [p])
                    self.assertTrue(os.path.exists(p), "on disk, not staged")
        finally:
            drun._STATE.last_staged_bytes, drun._STATE.share_warned = 0, False
        self.assertEqual(agent.requests[0]["files"][0].get("staged"), True)
        for r in agent.requests[1:]:
            self.assertNotIn("staged", r["files"][0])
        lines = "".join(c.args[0] for c in err.write.call_args_list)
        self.assertEqual(lines.count("is larger than its share of --ckpt-memory"), 1, lines)

    def test_a_save_that_cannot_be_staged_goes_to_disk_with_one_warning(self):
        agent = FakeAgent(lambda r: {"ok": True, "sealed": True})
        d = tempfile.mkdtemp()
        missing = os.path.join(tempfile.mkdtemp(), "gone")
        open(missing, "w").close()  # a file where the staging directory should be
        env = dict(CLEAN, DRUN_AGENT_SOCK=agent.path, RANK="0", DRUN_CKPT_DIR=d,
                   DRUN_CKPT_STAGE_DIR=missing)
        drun._STATE.stage_warned = False
        with mock.patch.dict(os.environ, env, clear=True), \
                mock.patch("sys.stderr") as err:
            paths = [drun.shard_path(s) for s in (1, 2)]
            for p in paths:
                drun.atomic_save(p, lambda f: f.write(b"d"))
            drun.commit(2, paths[1:])
        self.assertTrue(all(os.path.exists(p) for p in paths))
        lines = "".join(c.args[0] for c in err.write.call_args_list)
        self.assertEqual(lines.count("cannot stage the checkpoint in memory"), 1, lines)
        self.assertNotIn("staged", agent.requests[0]["files"][0])

    def test_resume_info_reads_env_and_manifest(self):
        d = tempfile.mkdtemp()
        manifest = os.path.join(d, "m.json")
        with open(manifest, "w") as f:
            json.dump({"cursor": {"epoch": 1, "consumed_in_epoch": 16}}, f)
        env = dict(CLEAN, DRUN_RESUME_STEP="12", DRUN_RESUME_WORLD_SIZE="4",
                   DRUN_RESUME_PATH=d, DRUN_RESUME_MANIFEST=manifest, DRUN_DATA_EPOCH="1",
                   DRUN_GLOBAL_SAMPLES="16", DRUN_RESUME_GENERATION="2")
        with mock.patch.dict(os.environ, env, clear=True):
            info = drun.resume_info()
        self.assertEqual((info["step"], info["world_size"], info["epoch"],
                          info["global_samples"], info["generation"]), (12, 4, 1, 16, 2))
        self.assertEqual(info["cursor"]["consumed_in_epoch"], 16)


class FlightRecorderDump(unittest.TestCase):
    """The helper's thread answers the agent's request (its FIFO opened for writing) with a dump,
    again for every request; outside torch.distributed the dump says so."""

    def test_each_request_on_the_fifo_writes_a_dump(self):
        from drun._flight import FlightDump
        d = tempfile.mkdtemp()
        paths = {"request": os.path.join(d, "flight-rank0.fifo"),
                 "dump": os.path.join(d, "flight-rank0.json")}
        # A stale FIFO (a previous worker's) is replaced.
        os.mkfifo(paths["request"])
        fd = FlightDump()
        fd.register(None)
        self.assertIsNone(fd.request)
        fd.register(paths)
        fd.register({"request": "/elsewhere", "dump": "/elsewhere"})  # once per process
        self.assertEqual(fd.request, paths["request"])
        for _ in range(2):
            if os.path.exists(paths["dump"]):
                os.unlink(paths["dump"])
            w = open_fifo_for_writing(paths["request"])
            os.write(w, b"dump\n")
            os.close(w)
            deadline = time.monotonic() + 10
            while not os.path.exists(paths["dump"]):
                self.assertLess(time.monotonic(), deadline, "no dump written")
                time.sleep(0.01)
            with open(paths["dump"]) as f:
                dump = json.load(f)
            self.assertEqual(dump, {"error": "torch.distributed is not initialized in this process"})


def open_fifo_for_writing(path):
    """Opens the FIFO as the agent does (non-blocking: ENXIO until the helper listens)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


if __name__ == "__main__":
    unittest.main()

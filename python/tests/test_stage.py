"""Unit tests of the staging memory of saves under ``drun --ckpt-memory`` (``drun._stage``): the
spare file allocated and mapped ahead, and a save written through its mapping, whose bytes are
those a plain file would hold whatever the writer does (run: python -m unittest discover -s
python/tests)."""

import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, HELPER)
import drun  # noqa: E402
from drun import _ledger, _stage  # noqa: E402
from test_drun import FakeAgent  # noqa: E402

try:
    import torch
    from torch.utils.serialization import config as torch_config
except ImportError:  # pragma: no cover - CI requires torch
    torch = None
    if os.environ.get("DRUN_REQUIRE_TORCH") == "1":
        raise

CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("DRUN_", "RANK", "WORLD_SIZE"))}


def shm_dir():
    """A private directory on the tmpfs when there is one (the staging memory's file system),
    else a temporary directory."""
    return tempfile.mkdtemp(prefix="drun-test-stage-",
                            dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


class Staged(unittest.TestCase):
    """Saves through ``drun.atomic_save`` with a staging directory, each committed to a fake
    agent that answers staged."""

    def setUp(self):
        self.ckpt, self.stage = tempfile.mkdtemp(), shm_dir()
        self.addCleanup(shutil.rmtree, self.ckpt, True)
        self.addCleanup(shutil.rmtree, self.stage, True)
        drun._client.close()
        self.agent = FakeAgent(lambda r: {"ok": True, "staged": True, "sealed": False})
        env = dict(CLEAN, DRUN_AGENT_SOCK=self.agent.path, RANK="0",
                   DRUN_GENERATION="1", DRUN_RUN_ID="job", DRUN_CKPT_DIR=self.ckpt,
                   DRUN_CKPT_STAGE_DIR=self.stage, LOCAL_WORLD_SIZE="1")
        patch = mock.patch.dict(os.environ, env, clear=True)
        patch.start()
        self.addCleanup(patch.stop)
        _ledger.STATE.spare = _stage.Spares()
        _ledger.STATE.last_staged_bytes, _ledger.STATE.share_warned = 0, False
        self.addCleanup(self.settle)

    def settle(self):
        """Waits for the spare's background work and unmaps what it left ready."""
        ready = _ledger.STATE.spare.take()
        if ready is not None:
            ready.discard()

    def save(self, step, write):
        """A staged save of ``step`` and its commit; returns (whether a spare was ready, the
        staged bytes)."""
        spares = _ledger.STATE.spare
        if spares.thread is not None:
            spares.thread.join()
        had_spare = spares.ready is not None
        path = drun.shard_path(step)
        sha, size = drun.atomic_save(path, write)
        self.assertIsNone(spares.thread, "no spare is prepared before the commit returned")
        self.assertTrue(drun.commit(step, [path])["staged"])
        self.assertFalse(os.path.exists(path), "staged, not on disk")
        staged = _ledger._staged_place(path)
        with open(staged, "rb") as f:
            data = f.read()
        self.assertEqual((sha, size), ("", len(data)))
        return had_spare, data

    def leftovers(self):
        """Files in the staging directory other than staged saves and the spare."""
        out = []
        for root, _, files in os.walk(self.stage):
            out += [f for f in files if f.startswith(".tmp-")]
        return out

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_torch_saves_over_a_spare_are_byte_identical_to_torch_save(self):
        # Shrinking, then larger than the spare, then the spare of that larger one.
        sizes = [3 << 20, 1 << 20, 200 << 20, 5 << 20]
        spares = []
        for step, n in enumerate(sizes, start=1):
            state = {"w": torch.arange(n // 4, dtype=torch.float32) + step,
                     "meta": {"step": step, "names": ["a", "b"]},
                     "small": [torch.ones(3) * i for i in range(50)]}
            had, data = self.save(step, lambda f: torch.save(state, f))
            spares.append(had)
            before = torch_config.save.compute_crc32
            torch_config.save.compute_crc32 = False  # a staged save leaves the CRC-32s out
            try:
                ref = io.BytesIO()
                torch.save(state, ref)
            finally:
                torch_config.save.compute_crc32 = before
            self.assertEqual(data, ref.getvalue(), "step %d: the bytes torch.save writes" % step)
            got = torch.load(io.BytesIO(data), weights_only=True)
            self.assertTrue(torch.equal(got["w"], state["w"]))
        self.assertEqual(spares, [False, True, True, True],
                         "every save after the first writes over a spare")
        self.assertEqual(self.leftovers(), [])

    def test_a_writer_that_seeks_truncates_and_takes_the_descriptor_gets_an_unbuffered_files_bytes(self):
        def writer(f):
            f.write(b"H" * 16)
            f.write(bytearray(b"x" * (2 << 20)))  # a writable buffer
            f.seek(4)
            f.write(b"head")
            f.seek(0, os.SEEK_END)
            f.write(memoryview(b"0123456789" * 1000)[10:])
            f.seek(-5, os.SEEK_CUR)
            f.write(b"tail!!")
            f.truncate(f.tell() - 1)
            f.seek(0, os.SEEK_END)
            f.writelines([b"a", b"b"])
            os.write(f.fileno(), b"<fd>")
            f.write(b"after")
            return f.tell()

        ref = os.path.join(self.ckpt, "plain")
        with open(ref, "wb", buffering=0) as f:  # unbuffered: the descriptor's writes in order
            end = writer(f)
        with open(ref, "rb") as f:
            want = f.read()
        self.assertEqual(end, len(want))
        self.assertEqual(self.save(1, lambda f: f.write(b"s" * (4 << 20))), (False, b"s" * (4 << 20)))
        had, data = self.save(2, writer)
        self.assertTrue(had)
        self.assertEqual(data, want)

    def test_a_save_larger_than_its_spare_grows_past_the_mapping(self):
        self.save(1, lambda f: f.write(b"a" * (1 << 20)))
        big = bytes(range(256)) * ((9 << 20) // 256)
        had, data = self.save(2, lambda f: f.write(big))
        self.assertTrue(had)
        self.assertEqual(data, big)
        # The next spare is sized for the larger save: a smaller one is cut to its own size.
        had, data = self.save(3, lambda f: f.write(b"c" * 100))
        self.assertTrue(had)
        self.assertEqual(data, b"c" * 100)

    def test_no_spare_beyond_the_ranks_share_of_the_budget(self):
        # A 64 KiB budget over 2 ranks: no 1 MiB spare fits beside a save (a user's two spares
        # counted against such a budget, and every save went to disk).
        os.environ["DRUN_CKPT_STAGE_SHARE"] = str(32 << 10)
        self.save(1, lambda f: f.write(b"a" * 100))
        had, data = self.save(2, lambda f: f.write(b"b" * 100))
        self.assertFalse(had)
        self.assertEqual(data, b"b" * 100)
        # A share that holds it: the next save has its spare again.
        os.environ["DRUN_CKPT_STAGE_SHARE"] = str(64 << 20)
        self.save(3, lambda f: f.write(b"c" * 100))
        had, _ = self.save(4, lambda f: f.write(b"d" * 100))
        self.assertTrue(had)

    def test_no_spare_is_made_when_the_agent_keeps_no_room_for_it(self):
        # The agent's --ckpt-memory holds no room for a spare beside its checkpoints: the
        # commit's answer says so, and the next save writes fresh memory instead.
        self.agent.reply = lambda r: {"ok": True, "staged": True, "sealed": False,
                                       "spares": False}
        self.save(1, lambda f: f.write(b"a" * (2 << 20)))
        self.assertIsNone(_ledger.STATE.spare.thread)
        self.assertFalse(os.path.exists(_stage.Spares.path()), "no spare file")
        had, data = self.save(2, lambda f: f.write(b"b" * (2 << 20)))
        self.assertFalse(had)
        self.assertEqual(data, b"b" * (2 << 20))
        self.agent.reply = lambda r: {"ok": True, "staged": True, "sealed": False,
                                       "spares": True}
        self.save(3, lambda f: f.write(b"c" * (2 << 20)))
        had, _ = self.save(4, lambda f: f.write(b"d" * (2 << 20)))
        self.assertTrue(had, "room again: the spare is made")

    def test_a_save_the_agent_has_no_room_for_goes_straight_to_disk(self):
        # The agent answers stage_room: room for step 2, none for step 3 (the steps before it
        # not on disk yet), room again for step 4. A first save asks nothing.
        rooms = {2: True, 3: False, 4: True}

        def reply(r):
            if r["op"] == "stage_room":
                return {"ok": True, "stage": rooms[len(commits) + 1]}
            commits.append(r)
            return {"ok": True, "staged": all(f.get("staged") for f in r["files"]),
                    "sealed": False}

        commits = []
        self.agent.reply = reply
        for step in (1, 2, 3, 4):
            path = drun.shard_path(step)
            drun.atomic_save(path, lambda f: f.write(bytes([step]) * (1 << 20)))
            drun.atomic_save(path + ".extra", lambda f: f.write(b"x"))
            drun.commit(step, [path, path + ".extra"])
        asks = [r for r in self.agent.requests if r["op"] == "stage_room"]
        self.assertEqual([a["bytes"] for a in asks], [(1 << 20) + 1] * 3,
                         "once a step, for as much as the last staged step")
        staged = [all(f.get("staged") for f in c["files"]) for c in commits]
        self.assertEqual(staged, [True, True, False, True])
        with open(drun.shard_path(3), "rb") as f:
            self.assertEqual(f.read(), b"\x03" * (1 << 20), "on disk, written by the rank")
        self.assertFalse(os.path.exists(_ledger._staged_place(drun.shard_path(3))))

    def test_a_writer_failing_over_a_spare_leaves_no_file_and_the_next_save_works(self):
        self.save(1, lambda f: f.write(b"a" * (2 << 20)))

        def boom(f):
            f.write(b"partial" * 1000)
            raise KeyboardInterrupt

        path = drun.shard_path(2)
        with self.assertRaises(KeyboardInterrupt):
            drun.atomic_save(path, boom)
        self.assertEqual(_ledger.STATE.spare.pending, 0, "a failed save asks for no spare")
        _ledger.STATE.spare.start()  # the mapping it wrote through is unmapped
        self.assertFalse(os.path.exists(_ledger._staged_place(path)))
        self.assertEqual(self.leftovers(), [])
        had, data = self.save(3, lambda f: f.write(b"b" * 10))
        self.assertEqual(data, b"b" * 10)

    def test_a_rank_killed_mid_write_over_its_spare_leaves_no_staged_file(self):
        # A process saves step 1, then dies by SIGKILL while step 2 is half written over the
        # spare: step 2's staged path never exists (only a temporary file no commit names).
        script = textwrap.dedent("""
            import os, signal, sys
            sys.path.insert(0, %r)
            import drun
            from drun import _ledger
            drun.atomic_save(drun.shard_path(1), lambda f: f.write(b"1" * (4 << 20)))
            _ledger.STATE.spare.start()  # as drun.commit does
            _ledger.STATE.spare.thread.join()
            assert _ledger.STATE.spare.ready is not None, "a spare is ready"
            def die(f):
                f.write(b"2" * (2 << 20))
                os.kill(os.getpid(), signal.SIGKILL)
            drun.atomic_save(drun.shard_path(2), die)
        """ % HELPER)
        p = subprocess.run([sys.executable, "-c", script], env=dict(os.environ),
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, -signal.SIGKILL, p.stderr)
        self.assertTrue(os.path.exists(_ledger._staged_place(drun.shard_path(1))))
        self.assertFalse(os.path.exists(_ledger._staged_place(drun.shard_path(2))))
        self.assertEqual(len(self.leftovers()), 1, "the half-written temporary file only")


    @unittest.skipIf(torch is None, "torch is not installed")
    def test_dcp_data_files_over_a_spare_are_byte_identical_and_load_back(self):
        import torch.distributed.checkpoint as dcp
        import drun.dcp

        spares = []
        for step, n in enumerate([1 << 20, 3 << 20, 1 << 18], start=1):
            state = {"w": torch.arange(n, dtype=torch.float32) * step, "b": torch.ones(7) * step}
            if _ledger.STATE.spare.thread is not None:
                _ledger.STATE.spare.thread.join()
            spares.append(_ledger.STATE.spare.ready is not None)
            staged = os.path.join(self.stage, "step%d" % step)
            plain = os.path.join(self.ckpt, "plain%d" % step)
            with _ledger._no_zip_crc():
                os.makedirs(staged)
                dcp.save(state, checkpoint_id=staged, no_dist=True,
                         storage_writer=drun.dcp._staged_writer(staged))
                dcp.save(state, checkpoint_id=plain, no_dist=True)
            _ledger.STATE.spare.start()  # as drun.dcp.save's commit does
            with open(os.path.join(staged, "__0_0.distcp"), "rb") as a, \
                    open(os.path.join(plain, "__0_0.distcp"), "rb") as b:
                data = a.read()
                self.assertEqual(data, b.read(), "step %d: the bytes DCP writes" % step)
            got = {"w": torch.zeros(n), "b": torch.zeros(7)}
            dcp.load(got, checkpoint_id=staged, no_dist=True)
            self.assertTrue(torch.equal(got["w"], state["w"]) and torch.equal(got["b"], state["b"]))
        self.assertEqual(spares, [False, True, True])


class Copy(unittest.TestCase):
    def test_a_copy_split_among_threads_copies_every_byte(self):
        src = bytearray(os.urandom(1 << 16) * ((_stage._PARALLEL_COPY >> 16) + 3))
        src += b"odd tail"
        dst = bytearray(len(src))
        import ctypes
        s = (ctypes.c_char * len(src)).from_buffer(src)
        d = (ctypes.c_char * len(dst)).from_buffer(dst)
        _stage._copy(ctypes.addressof(d), ctypes.addressof(s), len(src), 3)
        del s, d
        self.assertEqual(dst, src)


class Populate(unittest.TestCase):
    """The spare's page tables are filled by its background thread without holding the GIL."""

    def mapped(self, size):
        import mmap
        d = shm_dir()
        self.addCleanup(shutil.rmtree, d, True)
        fd = os.open(os.path.join(d, "spare"), os.O_RDWR | os.O_CREAT, 0o600)
        self.addCleanup(os.close, fd)
        os.posix_fallocate(fd, 0, size)
        m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        self.addCleanup(m.close)
        return m

    @staticmethod
    def resident(m):
        """The resident bytes of mapping ``m`` (``/proc/self/smaps``)."""
        import ctypes
        v = (ctypes.c_char * 1).from_buffer(m)
        start = ctypes.addressof(v)
        del v
        with open("/proc/self/smaps") as f:
            inside = False
            for line in f:
                head = line.split()[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo <= start < hi
                elif inside and head == "Rss:":
                    return int(line.split()[1]) * 1024
        return 0

    @unittest.skipUnless(sys.platform.startswith("linux"), "madvise(MADV_POPULATE_WRITE)")
    def test_the_spares_pages_are_filled_while_the_training_thread_runs_python(self):
        import threading
        import time
        size = 256 << 20
        # The training's thread counts what it runs while another thread populates; with the
        # GIL held for the whole populate (mmap's MAP_POPULATE did) its longest gap is the
        # whole populate. A loaded machine can stop it for a while: three tries.
        tries = []
        for _ in range(3):
            m = self.mapped(size)
            self.assertLess(self.resident(m), size // 4, "not populated yet")
            took = []

            def populate():
                t = time.perf_counter()
                _stage._populate(m, size)
                took.append(time.perf_counter() - t)

            th = threading.Thread(target=populate)
            last, gap = time.perf_counter(), 0.0
            th.start()
            while th.is_alive():
                now = time.perf_counter()
                gap, last = max(gap, now - last), now
            th.join()
            self.assertGreaterEqual(self.resident(m), size, "every page of the spare is mapped")
            tries.append((gap, took[0]))
            if gap < took[0] / 2:
                return
        self.fail("the training's thread stopped for most of each populate (longest gap, "
                  "populate): %r" % tries)

    def test_without_madv_populate_write_the_spares_pages_are_faulted_in_by_writing_them(self):
        size = 8 << 20
        m = self.mapped(size)
        m[:4] = b"old!"  # a released step's file: its bytes are written over
        # An advice the kernel does not know fails as MADV_POPULATE_WRITE does before 5.14.
        with mock.patch.object(_stage, "_MADV_POPULATE_WRITE", 0x7fff):
            _stage._populate(m, size)
        self.assertGreaterEqual(self.resident(m), size)
        self.assertEqual(m[:4], b"\0\0\0\0")


if __name__ == "__main__":
    unittest.main()

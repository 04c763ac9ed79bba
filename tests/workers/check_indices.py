"""Checks the data order of an elastic run of examples/train_ddp.py (needs torch).

  check_indices.py indices PREFIX [PREFIX...] --dataset-len N --seed S --global-batch B --epochs E
      PREFIX.rank<R>.gen<G> files hold "<step> <comma-separated sample indices>" lines. For each
      step the newest generation that ran it is the one whose work was kept (a re-form resumes
      from the last sealed checkpoint and runs the later steps again). The union over ranks of
      each kept step must be exactly the next global batch of that epoch's permutation, so each
      epoch sees every sample exactly once. Several prefixes are runs in order (e.g. a job and
      its requeued continuation): a later prefix's generations are newer than an earlier one's.
      Prints a JSON summary; exits 1 on any mismatch.

  check_indices.py compare A.pt B.pt --tol T
      Largest absolute difference between the model parameters of two final checkpoints.
"""

import argparse
import collections
import glob
import json
import re
import sys

import torch


def indices(a):
    records = collections.defaultdict(dict)  # step -> gen -> list of indices
    ranks_seen = collections.defaultdict(set)  # gen -> ranks
    paths = [(run, p) for run, prefix in enumerate(a.prefix)
             for p in glob.glob(prefix + ".rank*.gen*")]
    for run, path in paths:
        m = re.search(r"\.rank(\d+)\.gen(\d+)$", path)
        rank, gen = int(m.group(1)), (run, int(m.group(2)))
        ranks_seen[gen].add(rank)
        with open(path) as f:
            for line in f:
                step, idx = line.split()
                records[int(step)].setdefault(gen, []).extend(int(i) for i in idx.split(","))
    spe = a.dataset_len // a.global_batch
    total = spe * a.epochs
    errors = []
    replayed = 0
    per_epoch = collections.defaultdict(list)
    for step in range(1, total + 1):
        gens = records.get(step)
        if not gens:
            errors.append("step %d was never run" % step)
            continue
        replayed += len(gens) - 1
        kept = gens[max(gens)]
        epoch, j = divmod(step - 1, spe)
        g = torch.Generator()
        g.manual_seed(a.seed + epoch)
        perm = torch.randperm(a.dataset_len, generator=g).tolist()
        want = perm[j * a.global_batch:(j + 1) * a.global_batch]
        if sorted(kept) != sorted(want):
            missing = sorted(set(want) - set(kept))[:5]
            extra = sorted(set(kept) - set(want))[:5]
            errors.append("step %d (run, generation %s): %d indices, missing %s, unexpected %s"
                          % (step, max(gens), len(kept), missing, extra))
        per_epoch[epoch].extend(kept)
    for epoch, seen in per_epoch.items():
        counts = collections.Counter(seen)
        twice = [i for i, c in counts.items() if c > 1]
        never = sorted(set(range(a.dataset_len)) - set(counts))
        if twice:
            errors.append("epoch %d: %d samples seen twice, e.g. %s" % (epoch, len(twice), twice[:5]))
        if len(seen) != spe * a.global_batch:
            errors.append("epoch %d: %d samples, expected %d" % (epoch, len(seen), spe * a.global_batch))
        if spe * a.global_batch == a.dataset_len and never:
            errors.append("epoch %d: %d samples never seen, e.g. %s" % (epoch, len(never), never[:5]))
    extra_steps = [s for s in records if s > total]
    if extra_steps:
        errors.append("steps beyond the end: %s" % extra_steps[:5])
    summary = {
        "steps": total,
        "generations": {("%d.%d" % g if len(a.prefix) > 1 else str(g[1])): sorted(r)
                        for g, r in sorted(ranks_seen.items())},
        "steps_run_again": replayed,
        "errors": errors,
    }
    print(json.dumps(summary))
    return 1 if errors else 0


def compare(a):
    sa = torch.load(a.a, weights_only=True)["model"]
    sb = torch.load(a.b, weights_only=True)["model"]
    diff = max((sa[k] - sb[k]).abs().max().item() for k in sa)
    print(json.dumps({"max_abs_diff": diff, "tol": a.tol}))
    return 0 if diff <= a.tol else 1


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("indices")
    i.add_argument("prefix", nargs="+")
    i.add_argument("--dataset-len", type=int, required=True)
    i.add_argument("--seed", type=int, required=True)
    i.add_argument("--global-batch", type=int, required=True)
    i.add_argument("--epochs", type=int, required=True)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--tol", type=float, required=True)
    a = p.parse_args()
    sys.exit(indices(a) if a.cmd == "indices" else compare(a))


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# The GPU path in one run, for a machine with an NVIDIA GPU (issue 36): versions, the GPU health
# check (doctor and the agent's line), launch → first CUDA op and worker restart → first CUDA op
# for drun and torchrun side by side, `--preflight` on NCCL, a rank spinning in a CUDA kernel
# caught by `--hang-timeout`, and a SIGKILLed agent leaving no process holding GPU memory.
#
#   benches/gpu/proof.sh OUT            on the GPU machine, from the repository root; drun is
#                                       $DRUN (default target/release/drun), python is $PYTHON
#                                       (default python3, which must hold torch with CUDA)
#   DRUN_GPU_PROOF_CPU=1 benches/gpu/proof.sh OUT
#                                       a dry run on a CPU machine (gloo, no nvidia-smi): checks
#                                       the script itself
#
# Everything goes to OUT: summary.txt (the numbers, `key value`), and one log per step.
# RUNS (default 3) launches of each kind; medians in the summary. About 3 minutes on an H100.
set -uo pipefail
out=${1:?usage: benches/gpu/proof.sh OUT}
mkdir -p "$out"
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
DRUN=${DRUN:-target/release/drun}
DRUN=$(cd "$(dirname "$DRUN")" && pwd)/$(basename "$DRUN")
PY=${PYTHON:-python3}
RUNS=${RUNS:-3}
cpu=${DRUN_GPU_PROOF_CPU:-0}
export DRUN_GPU_PROOF_CPU=$cpu PYTHONUNBUFFERED=1
# The workers' `import drun` (the helper the wheel installs) from this checkout.
export PYTHONPATH="$here/../../python${PYTHONPATH:+:$PYTHONPATH}"
worker="$here/worker.py"
summary="$out/summary.txt"
: >"$summary"

say() { echo "$*" | tee -a "$summary"; }
now_ns() { date +%s%N; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }
# The value of KEY in the files matching GLOB (one per line).
values() { cat $1 2>/dev/null | awk -v k="$2" '$1 == k {print $2}'; }

say "date $(date -u +%FT%TZ)"
if [ "$cpu" = 1 ]; then
  say "device cpu (dry run)"
  nproc=2
else
  nvidia-smi -L | tee "$out/nvidia-smi.txt"
  say "gpu $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  say "driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
  nproc=gpu
fi
say "torch $("$PY" -c 'import torch; print(torch.__version__)')"
say "cuda $("$PY" -c 'import torch; print(torch.version.cuda)')"
say "nccl $("$PY" -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-")')"
say "drun $("$DRUN" --version)"

# 1. GPU health: doctor's verdict, the agent's line, and what one check costs.
"$DRUN" doctor --standalone --nproc-per-node "$nproc" "$worker" >"$out/doctor.txt" 2>&1
say "doctor_gpu_warnings $(grep -c 'GPU health' "$out/doctor.txt")"
if [ "$cpu" != 1 ]; then
  t0=$(now_ns)
  nvidia-smi --query-gpu=index,pci.bus_id,uuid,name,memory.used,memory.total,ecc.errors.uncorrected.volatile.total,clocks_throttle_reasons.active --format=csv,noheader,nounits >"$out/health-query.txt" 2>&1
  say "health_check_s $(( ($(now_ns) - t0) / 1000000 ))e-3"
fi

# 2. Launch → first CUDA op, drun and torchrun alternating.
for i in $(seq "$RUNS"); do
  for l in drun torchrun; do
    d="$out/first-op-$l-$i"; mkdir -p "$d"
    export DRUN_PROOF_T0=$(now_ns)
    if [ $l = drun ]; then
      "$DRUN" --standalone --nproc-per-node "$nproc" --python "$PY" "$worker" first-op "$d" >"$d.log" 2>&1
    else
      "$PY" -m torch.distributed.run --standalone --nproc-per-node "$nproc" "$worker" first-op "$d" >"$d.log" 2>&1
    fi
    echo "exit $?" >>"$d.log"
  done
done
for l in drun torchrun; do
  say "launch_to_first_cuda_op_s_$l $(values "$out/first-op-$l-*/first-op_rank0_0.txt" first_op_s | median)"
done
grep -h "GPU health" "$out"/first-op-drun-1.log | head -2 >"$out/health-line.txt"
say "health_line $(head -1 "$out/health-line.txt" | sed 's/.*GPU health/GPU health/')"

# 3. A worker fails once: failure → the restarted worker's first CUDA op.
for i in $(seq "$RUNS"); do
  for l in drun torchrun; do
    d="$out/restart-$l-$i"; mkdir -p "$d"
    if [ $l = drun ]; then
      "$DRUN" --standalone --nproc-per-node 1 --max-restarts 1 --python "$PY" "$worker" restart "$d" >"$d.log" 2>&1
    else
      "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 --max-restarts 1 "$worker" restart "$d" >"$d.log" 2>&1
    fi
    echo "exit $?" >>"$d.log"
  done
done
for l in drun torchrun; do
  say "restart_to_first_cuda_op_s_$l $(values "$out/restart-$l-*/restart_rank0_1.txt" restart_to_first_op_s | median)"
done

# 4. --preflight on the job's backend (NCCL on a GPU); one GPU: one rank, no link.
d="$out/preflight"; mkdir -p "$d"
DRUN_PROOF_T0=$(now_ns) "$DRUN" --standalone --nproc-per-node "$nproc" --preflight --python "$PY" "$worker" first-op "$d" >"$d.log" 2>&1
say "preflight $(grep -h 'preflight: ' "$d.log" | head -1 | sed 's/.*preflight: //')"

# 5. A rank spinning in a CUDA kernel: --hang-timeout names it, with its stack and the flight
#    recorder's verdict.
d="$out/hang"; mkdir -p "$d"
t0=$(now_ns)
timeout 120 "$DRUN" --standalone --nproc-per-node 1 --hang-timeout 5 --python "$PY" "$worker" hang "$d" >"$d.log" 2>&1
echo "exit $?" >>"$d.log"
say "hang_detected $(grep -c 'hang: rank' "$d.log") line(s), exit $(tail -1 "$d.log" | cut -d' ' -f2), $(( ($(now_ns) - t0) / 1000000 )) ms from launch"
grep -h "hang: \|flight recorder" "$d.log" | head -8 >"$out/hang-lines.txt"
say "flight_recorder $(grep -h 'flight recorder' "$d.log" | head -1 | sed 's/.*flight recorder/flight recorder/')"

# 6. SIGKILL of the agent while its worker holds 8 GiB of GPU memory: how long until no process
#    holds GPU memory (or, on the CPU dry run, until the worker is gone).
d="$out/hold"; mkdir -p "$d"
"$DRUN" --standalone --nproc-per-node 1 --python "$PY" "$worker" hold "$d" >"$d.log" 2>&1 &
agent=$!
for _ in $(seq 600); do [ -e "$d/hold_rank0_0.txt" ] && break; sleep 0.1; done
wpid=$(values "$d/hold_rank0_0.txt" pid)
kill -9 "$agent"
t0=$(now_ns)
left=unknown
for _ in $(seq 300); do
  if [ "$cpu" = 1 ]; then
    kill -0 "$wpid" 2>/dev/null || { left=0; break; }
  else
    n=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -c .)
    [ "$n" = 0 ] && { left=0; break; }
    left=$n
  fi
  sleep 0.05
done
wait "$agent" 2>/dev/null
say "after_agent_sigkill_processes_holding_gpu $left after $(( ($(now_ns) - t0) / 1000000 )) ms"
[ "$cpu" = 1 ] || nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >"$out/compute-apps-after.txt" 2>&1
kill -9 "$wpid" 2>/dev/null

echo "summary in $summary"

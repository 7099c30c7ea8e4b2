#!/usr/bin/env bash
# Regenerates the example nsadiag reports under reports/ on the CPU (about fifteen minutes on
# a loaded 2-core machine). Every example is a run directory's report.md and summary.json
# (plus its plots): the tests check each summary.json against nsadiag/schemas.
# The layer benchmark has its own script: bench/bench_layer.py (make bench).
# ONLY="sweep-layers triage-per-token-loop" regenerates just those examples. An example whose
# command left no report (killed from outside) is named at the end, and the script exits 1.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
NSADIAG=("$PY" -m nsadiag.cli)
ONLY=${ONLY:-}
missing=()

wanted() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }

run() {  # run NAME ARGS...: one command into runs/example-NAME, its report into reports/NAME
  local name=$1; shift
  wanted "$name" || return 0
  rm -rf "runs/example-$name"
  # --out right after the command: `run` passes everything after `--` to the user's command
  "${NSADIAG[@]}" "$1" --out "runs/example-$name" "${@:2}"  # a failure verdict is the point
  if [ ! -f "runs/example-$name/report.md" ]; then
    missing+=("$name"); return 0
  fi
  mkdir -p "reports/$name"
  cp "runs/example-$name"/{report.md,summary.json} "reports/$name/"
  for extra in sweep.png memory.png flame.png trace.json; do
    if [ -f "runs/example-$name/$extra" ]; then cp "runs/example-$name/$extra" "reports/$name/"; fi
  done
}

run sweep-layers sweep-layers --layers 1-6 --seq-len 256
run isolate-branch isolate-branch sel --layers 1-4 --seq-len 256
run sweep-slow sweep-layers --target repro.per_token_loop:make --layers 2-4 --seq-len 1024 \
    --steps 30 --budget 20 --stall-timeout 30
run sweep-deadlock sweep-layers --target repro.lock_deadlock:make --layers 1-3 --seq-len 64 \
    --stall-timeout 5
run ddp-stall ddp --world-size 2 --ddp-backend gloo --target repro.rank_divergent:make \
    --seq-len 64 --batch 2 --steps 3 --stall-timeout 3

run sweep-seq sweep-seq --seq-lens 256,512,1024 --layers 2 --steps 2
run memory memory --layers 2 --seq-len 2048 --steps 1
run memory-naive memory --layers 2 --seq-len 2048 --steps 1 --backend naive
run trace trace --layers 2 --seq-len 512

run check-ckpt check ckpt --target repro.late_bound_ckpt:make --seq-len 16

# a user's own script under `nsadiag run`: a per-token loop cut off at its deadline
run run-slow-script run --deadline 20 --stall-timeout 10 -- "$PY" repro/scripts/slow_token_loop.py

# triage of a zoo entry: threshold, repeats, where the time goes, bisection (exit 1 expected)
run triage-per-token-loop triage --target repro.per_token_loop:make --seq-len 512 --steps 200 \
    --budget 20 --stall-timeout 20 --max-layers 4 --max-minutes 8

# the CI summary: `make ci-triage` (what .ci/run runs) with a step summary file
if wanted ci-summary; then
  mkdir -p reports/ci-summary
  rm -f reports/ci-summary/step-summary.md
  code=0
  GITHUB_STEP_SUMMARY=reports/ci-summary/step-summary.md make -s ci-triage PY="$PY" || code=$?
  echo "exit code $code" > reports/ci-summary/exit-code.txt
  if [ -f runs/ci-triage/report.md ]; then
    cp runs/ci-triage/{report.md,summary.json} reports/ci-summary/
  else
    missing+=(ci-summary)
  fi
fi

# stacks of a live zoo child: a lock_deadlock trial, sampled once it waits in backward
if wanted stacks; then
  rm -rf runs/example-stacks runs/example-stacks-trial && mkdir -p runs/example-stacks-trial
  "$PY" -c 'from nsadiag.spec import JobSpec, TrialSpec
print(JobSpec("trial", TrialSpec(target="repro.lock_deadlock:make", n_layers=2, seq_len=64,
      steps=1, out_dir="runs/example-stacks-trial/trial")).to_json())' \
      > runs/example-stacks-trial/job.json
  "$PY" -m nsadiag.harness.child runs/example-stacks-trial/job.json > /dev/null 2>&1 &
  child=$!
  for _ in $(seq 300); do  # up to 60 s for torch to import and the forward to end
    grep -q '"phase":"backward"' runs/example-stacks-trial/trial/events.jsonl 2>/dev/null && break
    sleep 0.2
  done
  sleep 1
  run stacks stacks "$child" --native --samples 3 --interval 0.5
  kill "$child" 2>/dev/null || true
  wait "$child" 2>/dev/null || true
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "regenerate.sh: no report from: ${missing[*]} (see runs/example-<name>)" >&2
  exit 1
fi

#!/usr/bin/env bash
# One batch of everything the course checks on a GPU: device tests, every chapter notebook, benchmarks.
#
# Usage (from the repository root, on a machine with a CUDA GPU):
#     OUT=/some/folder tools/gpu_run.sh            # everything (about 15-25 minutes on an H100)
#     OUT=/some/folder STEPS="tests bench" tools/gpu_run.sh
#     NOTEBOOKS="book/ch1[0-5]*.ipynb" STEPS=notebooks tools/gpu_run.sh
#     DEVICE=cpu STEPS=notebooks NOTEBOOKS="book/ch01*.ipynb" tools/gpu_run.sh   # a dry run of the script on a CPU
#
# On the course's GPU machine (python3 with a CUDA torch, transformers, pytest, matplotlib, but no Jupyter),
# the Jupyter packages travel as wheels in .whl/ and are installed beside, not into, that python:
#     python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#     OUT=$OUT tools/gpu_run.sh
#
# Assumptions, checked at the start:
# * No internet. Nothing is installed from an index. The script looks for a python whose torch sees a
#   CUDA GPU ($PYTHON if set, else .venv/bin/python, python3, python) and uses it as it is. This
#   checkout's companion (and grader/'s companion_grader) are put first on PYTHONPATH (no install
#   needed: both are pure Python); PYTHONPATH is only ever added to, so what was there (the /tmp/site
#   of the wheels above) stays after them, and the notebooks' kernels inherit it. Missing optional
#   tools are reported and their step skipped, never installed: pytest for the tests; nbclient,
#   nbformat, ipykernel, jupyter_client, pyzmq and matplotlib for the notebooks; transformers for the
#   Hugging Face comparisons (a test or notebook that imports it fails and is recorded as failed).
# * The notebooks run in a kernel whose spec the script writes into a temporary JUPYTER_PATH
#   (`ipykernel install --prefix`), pointing at the same python: no 'python3' kernelspec need exist.
# * Hugging Face is offline (HF_HUB_OFFLINE=1): every HF model in the course is built from a config.
# * Results go under $OUT (default: ./gpu_run_out) as seven files, no subfolder (the device tool
#   brings back 8 files at most): env.txt, tests.txt, notebooks.json (per notebook: seconds, ok, the
#   first error line; rewritten after each notebook), notebooks.tar.gz (the executed notebooks),
#   bench.txt, bench_compile.txt and steps.txt. A failing step does not stop the others; the exit
#   status is 0 when all ran and passed.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_run_out}"
mkdir -p "$OUT"
STEPS="${STEPS:-tests notebooks bench}"
NB_TIMEOUT="${NB_TIMEOUT:-900}"  # seconds per cell
DEVICE="${DEVICE:-cuda}"
NOTEBOOKS="${NOTEBOOKS:-book/ch*.ipynb}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 COMPANION_DEVICE="$DEVICE" MPLBACKEND=Agg PYTHONUNBUFFERED=1
# This checkout's packages first, whatever an installed copy says; keep the rest (e.g. /tmp/site).
export PYTHONPATH="$PWD:$PWD/grader${PYTHONPATH:+:$PYTHONPATH}"
status=0

find_python() {
  for py in ${PYTHON:-} .venv/bin/python python3 python; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() or '$DEVICE' == 'cpu' else 1)" 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  return 1
}
PY="$(find_python)" || { echo "no python with a CUDA-enabled torch found (set PYTHON=...)" | tee "$OUT/env.txt"; exit 2; }
has() { "$PY" -c "import $1" 2>/dev/null; }

{
  echo "python: $PY ($("$PY" -V 2>&1)); PYTHONPATH=$PYTHONPATH"
  "$PY" - <<'PYEOF'
import importlib, torch
print("torch", torch.__version__, "CUDA", torch.version.cuda)
if torch.cuda.is_available():
    print("GPU", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
for name in ("companion", "transformers", "pytest", "nbclient", "ipykernel", "matplotlib", "numpy"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", ""), getattr(m, "__file__", ""))
    except Exception as error:
        print(name, "MISSING:", error)
from companion.device import mixed_precision, pick_device
print("pick_device:", pick_device(), "mixed precision:", mixed_precision(pick_device()))
PYEOF
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

run_tests() {
  has pytest || { echo "tests: pytest missing, skipped" | tee "$OUT/tests.txt"; return 1; }
  # The device tests on the device, one process: addopts cleared (no nbval notebook collection, no xdist).
  local start=$SECONDS
  COMPANION_TEST_DEVICE="$DEVICE" "$PY" -m pytest -p no:cacheprovider -p no:nbval -o addopts="" -q \
    tests/test_device.py tests/test_placement.py tests/test_generation.py tests/test_kv_cache.py \
    tests/test_training.py tests/test_precision.py > "$OUT/tests.txt" 2>&1
  local rc=$?
  echo "tests: rc=$rc in $((SECONDS - start)) s" | tee -a "$OUT/tests.txt"
  tail -3 "$OUT/tests.txt"
  return $rc
}

run_notebooks() {
  local missing="" m
  for m in nbclient nbformat ipykernel jupyter_client zmq matplotlib; do has "$m" || missing="$missing $m"; done
  if [ -n "$missing" ]; then echo "notebooks: missing$missing; skipped" | tee "$OUT/notebooks.json"; return 1; fi
  local work rc=0
  work="$(mktemp -d)"
  # A kernelspec for this very python (sys.executable) in a temporary JUPYTER_PATH.
  if ! "$PY" -m ipykernel install --prefix "$work/jupyter" --name companion-run >/dev/null 2>"$work/install.err"; then
    echo "notebooks: ipykernel install failed: $(tail -1 "$work/install.err")" | tee "$OUT/notebooks.json"
    rm -rf "$work"; return 1
  fi
  # shellcheck disable=SC2086
  JUPYTER_PATH="$work/jupyter/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}" \
    "$PY" - "$OUT" "$work/executed" "$NB_TIMEOUT" $NOTEBOOKS <<'PYEOF' || rc=1
import json, sys, time
from pathlib import Path
import nbformat
from nbclient import NotebookClient

out, executed, timeout = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
executed.mkdir(parents=True, exist_ok=True)
results = []
for path in map(Path, sorted(sys.argv[4:])):
    nb = nbformat.read(path, as_version=4)
    start, ok, error = time.perf_counter(), True, ""
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="companion-run",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    except Exception as exc:  # record and go on to the next notebook
        text = str(exc).strip()
        ok, error = False, f"{type(exc).__name__}: {text.splitlines()[-1] if text else ''}"[:500]
    seconds = round(time.perf_counter() - start, 1)
    nbformat.write(nb, executed / f"{path.parent.name}_{path.name}")  # book_ch10_....ipynb, solutions_...
    results.append({"notebook": str(path), "ok": ok, "seconds": seconds, "error": error})
    print(f"{path}: {'ok' if ok else 'FAILED'} in {seconds} s {error}", flush=True)
    (out / "notebooks.json").write_text(json.dumps(results, indent=1))  # a run cut short keeps what it did
sys.exit(0 if results and all(r["ok"] for r in results) else 1)
PYEOF
  tar -czf "$OUT/notebooks.tar.gz" -C "$work" executed || rc=1
  rm -rf "$work"
  return $rc
}

run_bench() {
  local rc=0
  # Eager: the course GPT against HF GPT2LMHeadModel (training, cached generation), the minimal fused GPT, mixed precision.
  "$PY" -m benchmarks.run --device "$DEVICE" > "$OUT/bench.txt" 2>&1 || rc=1
  cat "$OUT/bench.txt"
  # torch.compile: the training step of both GPTs compiled (the first, untimed calls compile).
  "$PY" -m benchmarks.run --device "$DEVICE" --compile --only gpt.training minimal_gpt.training > "$OUT/bench_compile.txt" 2>&1 || rc=1
  cat "$OUT/bench_compile.txt"
  return $rc
}

for step in $STEPS; do
  start=$SECONDS
  case "$step" in
    tests) run_tests || status=1 ;;
    notebooks) run_notebooks || status=1 ;;
    bench) run_bench || status=1 ;;
    *) echo "unknown step $step"; status=1 ;;
  esac
  echo "== $step: $((SECONDS - start)) s" | tee -a "$OUT/steps.txt"
done
exit $status

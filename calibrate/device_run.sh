#!/usr/bin/env bash
# One prepared GPU calibration run: measure kvsim cost profiles for the shipped models on a CUDA GPU.
#
#   OUT=/some/dir bash calibrate/device_run.sh [DEADLINE_S] [eager|graphs]
#
# "graphs" times decode, LM head and prefill as CUDA-graph replays (kvsim calibrate --cuda-graphs), as
# vLLM runs them; "eager" (the default) launches every kernel from Python.
# Everything lands in $OUT/gpu-calibration.tar.gz (profiles, raw samples, logs, nvidia-smi), written
# even when a model runs out of time, because each calibration has its own timeout inside DEADLINE_S.
# fp16, as Vidur's public profiles, so that the two can be compared point for point.
# A machine without pydantic gets it from wheels in .whl/ (python3 -m pip download ... -d .whl).
set -u
export PYTHONUNBUFFERED=1
deadline=$(( $(date +%s) + ${1:-420} ))
mode=${2:-eager}
extra=()
suffix=""
if [ "$mode" = graphs ]; then extra=(--cuda-graphs); suffix="-graphs"; fi
OUT=${OUT:-/tmp/kvsim-gpu-out}
work=/tmp/kvsim-gpu
mkdir -p "$OUT" "$work"
log="$work/run.log"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
} >"$log" 2>&1

left() { echo $(( deadline - $(date +%s) )); }

calibrate() {  # model grid name
  local budget
  budget=$(left)
  if [ "$budget" -lt 30 ]; then echo "skip $3: ${budget}s left" >>"$log"; return 1; fi
  echo "== $3 ($1, grid $2, ${budget}s left)" >>"$log"
  timeout "$budget" python3 -m calibrate --model "$1" --device cuda --dtype float16 --grid "$2" \
    "${extra[@]}" -o "$work/$3.yaml" >>"$log" 2>&1
  local status=$?
  echo "== $3 exit $status" >>"$log"
  return $status
}

# A smoke run first: if the CUDA path is broken, fail in seconds, not minutes.
if calibrate Llama-2-7B smoke smoke; then
  if [ "$mode" = eager ]; then
    calibrate Llama-2-7B quick h200-llama-2-7b-quick
    calibrate Llama-3.1-8B quick h200-llama-3.1-8b-quick
  fi
  calibrate Llama-3.1-8B full "h200-llama-3.1-8b-full$suffix"
  calibrate Llama-2-7B full "h200-llama-2-7b-full$suffix"
fi
rm -f "$work/smoke.yaml" "$work/smoke.csv"
tar -czf "$OUT/gpu-calibration.tar.gz" -C "$work" .
cp "$log" "$OUT/run.log"
tail -n 40 "$log"

#!/usr/bin/env bash
# Nsight Compute on the one-kernel decode step, on the GPU machine (ncu is
# there; nsys is not): warp-stall samples per SASS instruction and per
# source line (tools/ncu_top.py), and the details page, into OUT (default
# $OUT or /tmp/ncu).
#   bash bench/ncu_step.sh "qwen3-4b qwen3-0.6b" [N] ["EXTRA BENCH OPTIONS"]
# (e.g. "--quantization fp8" for the e4m3 kernels; the run is batch 1 unless
# the options name another --batch)
# The kernel is built with -lineinfo. Samples of the 13th decode_step launch
# (past the warm-up and the graph capture); ncu replays it with memory saved
# and restored, so the step's counters and barriers start as they would.
set -uo pipefail
G=${GPU_DIR:-.gpu}
O=${OUT:-/tmp/ncu}
mkdir -p "$O"
export LD_LIBRARY_PATH="$PWD/$G/lib" REPLAY_SOURCE_DIR="$PWD" PATH="$PATH:/usr/local/cuda/bin"
# the kernels' SASS with line info, from the binary itself
D=/tmp/ncu_elf && rm -rf $D && mkdir -p $D && (cd $D && cuobjdump -xelf all "$OLDPWD/$G/bin/replay" >/dev/null)
for m in $1; do
  timeout 200 ncu -k regex:decode_step --launch-skip 12 --launch-count 1 --set full --import-source yes \
    --source-folders "$PWD/src/backend/cuda/kernels" -f -o "/tmp/ncu_$m" \
    "$G/bin/replay" bench decode --dummy-weights "$m" --batch 1 --ctx 512 --no-eager --steps 16 ${3:-} >"$O/run_$m.txt" 2>&1
  echo "ncu $m: rc $?"
  ncu -i "/tmp/ncu_$m.ncu-rep" --page details >"$O/details_$m.txt" 2>&1
  # decode_step_kernel<G, HD, NB, DYNK, PK, W8> -> its mangled name 
  k=$(grep -m1 -o 'decode_step_kernel<[0-9a-z, ]*>' "$O/details_$m.txt" | sed 's/.*<//; s/>//; s/,//g')
  # G, HD, NB are ints; the rest are bools, which ncu prints as true/false or 1/0
  f=_Z18decode_step_kernelI i=0
  for t in $k; do
    case $t in true) t=1 ;; false) t=0 ;; esac
    if ((i++ < 3)); then f+=Li${t}E; else f+=Lb${t}E; fi
  done
  f+=Ev7ds_args
  for c in $D/*.cubin; do
    nvdisasm -gi "$c" 2>/dev/null | awk -v f=".text.$f:" '$1 == f {on = 1; next} /^[ \t]*\.text\./ {on = 0} on' \
      >"/tmp/ncu_dis_$m.txt"
    [ -s "/tmp/ncu_dis_$m.txt" ] && break
  done
  ncu -i "/tmp/ncu_$m.ncu-rep" --page source --csv --print-source sass >"/tmp/ncu_sass_$m.csv" 2>/dev/null
  python3 tools/ncu_top.py "/tmp/ncu_sass_$m.csv" "${2:-60}" "/tmp/ncu_dis_$m.txt" >"$O/top_sass_$m.txt" 2>&1
  echo "$m: kernel $f, $(wc -l <"/tmp/ncu_dis_$m.txt") SASS listing lines"
  sed -n '/by source line/,+25p' "$O/top_sass_$m.txt"
done

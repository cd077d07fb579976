#!/usr/bin/env bash
# Soak test of `replay serve` on the GPU machine (after scripts/gpu-bundle.sh):
#   bash scripts/soak-serve.sh [SECONDS] [MODEL] [RATE]      (defaults 540, qwen3-0.6b, 800)
# Serves MODEL's dummy weights and offers RATE requests/s (above what one GPU serves of 256-token
# prompts and 128-token answers, so requests queue and the queue limit turns some away with 503)
# in rounds of 10 s until SECONDS have passed, a tenth of the clients hanging up mid-stream
# (bench serve --abort-fraction). After every round it checks that bench serve saw no error but
# 503/429s and hang-ups, and that every KV page came back; at the end, that the server's resident
# memory stayed flat (the last third of the rounds within 10% + 64 MiB of the first third, after
# a warm-up round) and that SIGTERM ends it with status 0. Prints a line per round, then PASS or
# FAIL. The load generator runs from one address, as a reverse proxy would: the per-address
# connection limit is raised accordingly.
set -uo pipefail
G=${GPU_DIR:-.gpu}
export LD_LIBRARY_PATH="$PWD/$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
secs=${1:-540} model=${2:-qwen3-0.6b} rate=${3:-800}
round_s=10 port=18400 url=http://127.0.0.1:18400
B=$G/bin/replay
log=${OUT:-/tmp}/soak-serve.log
"$B" serve --dummy-weights "$model" --port $port --max-connections-per-address 8192 -q 2>"$log" &
pid=$!
for _ in $(seq 300); do curl -s -o /dev/null "$url/health" && break; sleep 0.2; done
curl -s -o /dev/null "$url/health" || { echo "FAIL: the server did not start"; tail "$log"; exit 1; }
metric() { curl -s "$url/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
rss_mib() { awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$pid/status"; }
fail=0 round=0 t0=$SECONDS
rss=()
printf '%5s %7s %6s %8s %7s %6s %9s %8s\n' round ok hungup rejected failed pages rss_mib tok/s
while ((SECONDS - t0 < secs)); do
  round=$((round + 1))
  out=$("$B" bench serve --base-url "$url" --num-prompts $((rate * round_s)) --request-rate "$rate" \
          --input-len 256 --output-len 128 --random-range-ratio 0.5 --abort-fraction 0.1 --seed "$round" 2>&1)
  rc=$?
  val() { echo "$out" | awk -v k="$1" 'index($0, k) == 1 {print $NF}'; }
  used=
  for _ in $(seq 100); do used=$(metric replay_kv_pages_used); [ "$used" = 0 ] && break; sleep 0.1; done
  r=$(rss_mib)
  rss+=("$r")
  printf '%5d %7s %6s %8s %7s %6s %9s %8s\n' "$round" "$(val 'Successful requests:')" \
    "$(val 'Hung up by the client')" "$(val 'Turned away')" "$(val 'Failed:')" "$used" "$r" \
    "$(val 'Output token throughput')"
  if [ "$rc" != 0 ]; then fail=1; echo "$out" | tail -3; fi
  [ "$used" = 0 ] || { fail=1; echo "round $round: $used KV pages still in use"; }
done
echo "rejections counted by the server: $(curl -s "$url/metrics" | grep '^replay_requests_rejected_total' | tr '\n' ' ')"
n=${#rss[@]}
if ((n >= 4)); then
  third=$(((n - 1) / 3)); third=$((third > 0 ? third : 1))
  first=0 last=0
  for ((i = 1; i <= third; i++)); do ((rss[i] > first)) && first=${rss[i]}; done
  for ((i = n - third; i < n; i++)); do ((rss[i] > last)) && last=${rss[i]}; done
  echo "resident memory: first third max ${first} MiB, last third max ${last} MiB"
  ((last <= first + first / 10 + 64)) || { fail=1; echo "memory grew"; }
fi
kill -TERM "$pid"
t=$SECONDS
wait "$pid"
rc=$?
echo "SIGTERM: exit status $rc after $((SECONDS - t)) s"
[ "$rc" = 0 ] || fail=1
[ "$fail" = 0 ] && echo PASS || { echo FAIL; tail -5 "$log"; }
exit $fail

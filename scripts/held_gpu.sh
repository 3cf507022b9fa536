#!/usr/bin/env bash
# The held programs on a GPU in one command that fits the device tool's 10 minutes: first every program is
# compiled and checked in JOBS processes at once (`--no-time`), which fills Triton's kernel cache, then one
# process checks, tunes and times them all on a quiet GPU, compiling nothing. Each phase plans into its own
# empty plan cache, so the timed phase tunes again rather than reuse plans tuned under contention; with
# REUSE=1 the timed phase takes the plans the parallel phase tuned (faster; a config tuned beside other
# processes may be a little slower than the best).
#
#     bash scripts/held_gpu.sh [NAMES...] [held options]      (JOBS=8 by default; output as held's)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python}
JOBS=${JOBS:-8}
names=()
for a in "$@"; do [[ $a == -* ]] && break; names+=("$a"); done
opts=("${@:$((${#names[@]} + 1))}")
if [ ${#names[@]} -eq 0 ]; then
    read -r -a names <<< "$($PY -c 'from flashtensor.bench import programs; print(*programs.NAMES)')"
fi
warm=$(mktemp -d)
start=$SECONDS
for ((j = 0; j < JOBS; j++)); do
    part=()
    for ((k = j; k < ${#names[@]}; k += JOBS)); do part+=("${names[k]}"); done
    [ ${#part[@]} -gt 0 ] || continue
    plans=$warm/plans$j
    [ -n "${REUSE:-}" ] && plans=$warm/plans
    FLASHTENSOR_CACHE_DIR=$plans $PY -m flashtensor.bench.held "${part[@]}" "${opts[@]}" --no-time \
        > "$warm/log$j" 2>&1 &
done
wait
grep -h '^\[' "$warm"/log* | sed 's/^/warm: /'
echo "warm: $((SECONDS - start)) s"      # the two phases' times, to plan a device session's commands
start=$SECONDS
timed=$(mktemp -d)
[ -n "${REUSE:-}" ] && timed=$warm/plans
FLASHTENSOR_CACHE_DIR=$timed $PY -m flashtensor.bench.held "${names[@]}" "${opts[@]}"
rc=$?
echo "timed: $((SECONDS - start)) s"
exit $rc

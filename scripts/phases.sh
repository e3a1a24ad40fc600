# Phases of a long script, sourced by scripts/demo.sh, build.sh and test.sh: each says what it
# does when it starts, how long it has run every 30 s while it runs (the outermost phase; one
# within it says only its start and end), and how long it took; phases_summary prints them all.
#   phase "building forkbox" cargo build ...
#   phases_summary

phases_done=()

# A duration in seconds as "M min SS s".
phases_took() { printf '%d min %02d s' $(($1 / 60)) $(($1 % 60)); }

phase() {
  local what="$1" started ticker status=0
  shift
  started=$(date +%s)
  echo "== $what" >&2
  # The ticker is a child of this shell; it goes with the phase. Phases within a phase (a script
  # the phase runs) say when they start and end; the outermost one ticks.
  ticker=
  if [ -z "${PHASES_TICKING:-}" ]; then
    (
      while sleep 30; do
        echo "   ... $what: $(phases_took $(($(date +%s) - started))) so far" >&2
      done
    ) &
    ticker=$!
  fi
  PHASES_TICKING=1 "$@" || status=$?
  if [ -n "$ticker" ]; then
    kill "$ticker" 2>/dev/null || true
    wait "$ticker" 2>/dev/null || true
  fi
  local took=$(($(date +%s) - started))
  phases_done+=("$(printf '%-60s %s' "$what" "$(phases_took "$took")")")
  if [ "$status" -ne 0 ]; then
    echo "== $what: failed after $(phases_took "$took") (exit $status)" >&2
    return "$status"
  fi
  echo "== $what: $(phases_took "$took")" >&2
}

phases_summary() {
  echo "== time per phase" >&2
  local line
  for line in "${phases_done[@]}"; do
    echo "   $line" >&2
  done
}

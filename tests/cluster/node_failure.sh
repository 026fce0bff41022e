#!/usr/bin/env bash
# The node-failure check of docs/scaling.md, by hand (about 5 minutes; not in the suite):
# run a one-network config through profiles/slurm with --slurm-no-requeue on the test
# cluster, kill slurmd by its pid while the training job runs, and expect Snakemake to report
# the job as NODE_FAIL and exit 1; then bring slurmd back and expect the same command to
# resume the run to the end (exit 0).
#
#   tests/cluster/node_failure.sh DIR     DIR: the cluster's folder (slurm.sh start DIR)
#
# Run it from the repository root, as root (slurm.sh needs it), with the venv built. Exit 0
# when both expectations hold; the Snakemake outputs are DIR/node-failure/run{1,2}.log.
set -euo pipefail

dir=${1:?usage: node_failure.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$dir/node-failure
bash "$here/slurm.sh" start "$dir" >/dev/null
export $(bash "$here/slurm.sh" env "$dir" | xargs)
rm -rf "$work"
mkdir -p "$work"
cat >"$work/config.yaml" <<'EOF'
datasets: [mnist5k]
model: {hidden: 1024}
train: {epochs: 60, grid: {cross_lipschitz: {lr: [0.2], lambda: [1.0e-3]}}}
kernel: {grid: {}}
certify: {n_points: 10}
attack: {n_points: 10, refine_steps: 0}
device: cpu
EOF
cmd=("$root/.venv/bin/snakemake" -s "$root/Snakefile" --directory "$work"
    --profile "$root/profiles/slurm" --slurm-no-requeue --retries 0
    --slurm-init-seconds-before-status-checks 1 --latency-wait 5
    --configfile "$work/config.yaml" --set-threads train=1 certify=1 attack=1)
start=$SECONDS
say() { echo "node_failure.sh: $((SECONDS - start)) s: $*"; }

"${cmd[@]}" >"$work/run1.log" 2>&1 &
run=$!
until squeue -h -o "%k %T" | grep -q "rule_train.* RUNNING"; do
    kill -0 "$run" 2>/dev/null || { say "the run ended before its training job ran"; exit 1; }
    sleep 2
done
sleep 15
say "killing slurmd (pid $(cat "$dir/slurmd.pid")) while the training job runs"
kill "$(cat "$dir/slurmd.pid")"
for _ in $(seq 150); do kill -0 "$run" 2>/dev/null && sleep 2; done
if kill -0 "$run" 2>/dev/null; then
    say "Snakemake still waited 300 s after the kill: the job was requeued, not failed"
    kill -KILL "$run"  # INT and TERM did not stop it while it waited; its jobs: scancel
    bash "$here/slurm.sh" start "$dir" >/dev/null
    squeue -h -o "%i %Z" | awk -v w="$work" '$2 == w {print $1}' | xargs -r scancel
    exit 1
fi
status=0
wait "$run" || status=$?
if [[ $status -ne 1 ]] || ! grep -q "failed due to a node failure.*NODE_FAIL" "$work/run1.log"; then
    say "expected exit 1 and a reported NODE_FAIL, got exit $status (see $work/run1.log)"
    exit 1
fi
say "Snakemake reported the node failure and exited 1"
bash "$here/slurm.sh" start "$dir" >/dev/null
say "slurmd is back; the same command again"
if ! "${cmd[@]}" >"$work/run2.log" 2>&1; then
    say "the second run failed (see $work/run2.log)"
    exit 1
fi
say "the same command resumed the run to the end (exit 0)"

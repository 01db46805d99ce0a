# idle.sh TREE: 3 service replicas (policy reports/routing-s9/idle-policy.yaml: Redis, flow control on) + redis-server + 8 simulated engines from source tree TREE, no traffic; CPU ticks of each over 10 s. Logs in /tmp/s9-prof.
TREE=$1; POLICY=${POLICY:-/work/wt/routing/reports/routing-s9/idle-policy.yaml}; PY=/work/wt/routing/.venv/bin/python
cd $TREE; export PYTHONPATH=$TREE
redis-server --port 18499 --save "" --appendonly no > /tmp/s9-prof/redis.log 2>&1 & R=$!
$PY -m extproc sim --pool llama-3.1-8b-instruct=18401-18408 > /tmp/s9-prof/sim.log 2>&1 & S=$!
sleep 2
P=""
for i in 0 1 2; do $PY -m extproc serve --config $POLICY --grpc-port 185${i}1 --admin-port 185${i}2 --drain-delay 0 > /tmp/s9-prof/s$i.log 2>&1 & P="$P $!"; done
sleep 6
ticks() { for p in "$@"; do awk '{print $14+$15}' /proc/$p/stat; done | paste -sd+ | bc; }
T0=$(ticks $P); U0=$(ticks $R); S0=$(ticks $S)
sleep 10
T1=$(ticks $P); U1=$(ticks $R); S1=$(ticks $S)
echo "$(basename $TREE): idle 10 s, CPU ticks (100 = 1 core-second): 3 replicas $((T1-T0)), redis $((U1-U0)), sim $((S1-S0))"
kill $P; sleep 1; kill $S $R; wait 2>/dev/null

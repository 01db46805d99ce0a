# 2x overload with 3 service replicas sharing Redis, the reserve-only-while-saturated rule (main after session 8's merges)
uptime
.venv/bin/extproc bench routing --workload overload --loads 0.7,2 --duration 30 --strategies default --replicas 3 --out reports/i13-s8/overload-2x-r3
uptime

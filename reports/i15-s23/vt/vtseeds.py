import sys
sys.argv=[sys.argv[0]]+sys.argv[1:]
exec(open('/work/wt/s22/vtcold.py').read().split("if __name__")[0])
from concurrent.futures import ProcessPoolExecutor
import statistics
if __name__=='__main__':
    rate=float(sys.argv[1]); pop=sys.argv[2]; n=int(sys.argv[3]); vs=sys.argv[4:]
    with ProcessPoolExecutor(2) as ex:
        res={v:list(ex.map(one,[(v,rate,pop,s) for s in range(n)])) for v in vs}
    for v in vs:
        print(f"{v or 'defaults':28s} p90 " + ' '.join('%5.1f'%r[0] for r in res[v]) + ' | mean %.2f'%statistics.mean(r[0] for r in res[v]))
        print(f"{'':28s} p99 " + ' '.join('%5.0f'%r[1] for r in res[v]) + ' | mean %.2f'%statistics.mean(r[1] for r in res[v]))

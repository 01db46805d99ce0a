import json,glob,sys,statistics as st
def q(v,p): v=sorted(v); return v[min(len(v)-1,int(p*len(v)))]
for d in sorted(glob.glob(sys.argv[1]+'/samples/*')):
    rows=[json.loads(l) for l in open(d+'/requests.jsonl')]
    stamps={}
    for f in glob.glob(d+'/sim-timings-*.json'):
        for s in json.load(open(f)): stamps[s['id']]=s
    H={k:[] for k in ('req','tok','eng','wr','resp')}
    for r in rows:
        s=stamps.get(r['sim_request'])
        if not s or r['ttft_s'] is None: continue
        t0=r['sent_clock_s']; tf=t0+r['ttft_s']
        H['req'].append(s['arrive']-t0); H['tok'].append(s['submit']-s['arrive']); H['eng'].append(s['token']-s['submit'])
        H['wr'].append(s['written']-s['token']); H['resp'].append(tf-s['written'])
    print(d.split('/')[-1], ' '.join('%s p50 %.2f p90 %.2f'%(k,q(v,.5)*1e3,q(v,.9)*1e3) for k,v in H.items()))

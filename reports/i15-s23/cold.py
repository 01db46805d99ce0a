import json,glob,sys
for d in sorted(glob.glob(sys.argv[1]+'/samples/*')):
    rows=[json.loads(l) for l in open(d+'/requests.jsonl')]
    stamps={}
    for f in glob.glob(d+'/sim-timings-*.json'):
        for s in json.load(open(f)): stamps[s['id']]=s
    for r in rows:
        s=stamps.get(r['sim_request']); r['s']=s
        r['end']=r['sent_clock_s']+r['e2e_s']
        r['cold']=r['prompt_tokens']-r['cached_tokens']>1000
    print(d.split('/')[-1])
    cold=[r for r in rows if r['cold'] and r['s']]
    for c in sorted(cold,key=lambda r:r['ttft_s']):
        t0=c['s']['submit']; t1=c['s']['token']
        same=[r for r in rows if r['endpoint']==c['endpoint'] and r is not c and r['s']]
        running=sum(1 for r in same if r['s']['submit']<t0<r['end'])
        during=sum(1 for r in same if t0<r['s']['submit']<t1)
        ocold=sum(1 for r in same if r['cold'] and r['s']['submit']<t1 and r['s']['token']>t0)
        # in flight per endpoint at t0 (all endpoints)
        eps={}
        for r in rows:
            if r['s'] and r['s']['submit']<t0<r['end']: eps[r['endpoint']]=eps.get(r['endpoint'],0)+1
        allep=set(r['endpoint'] for r in rows)
        minload=min(eps.get(e,0) for e in allep)
        print('  ttft %.0f eng %.0f  running-at-submit %d (min over engines %d) arrivals-during %d other-cold %d'%(c['ttft_s']*1e3,(t1-t0)*1e3,running,minload,during,ocold))

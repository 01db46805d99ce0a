import json,glob,sys,collections
for d in sorted(glob.glob(sys.argv[1]+'/samples/*')):
    rows=[json.loads(l) for l in open(d+'/requests.jsonl')]
    out=[]
    for c in rows:
        if c['prompt_tokens']-c['cached_tokens']<=1000: continue
        t=c['sent_clock_s']
        cnt=collections.Counter(r['endpoint'] for r in rows if t-3<r['sent_clock_s']<t)  # last 3 s
        eps=set(r['endpoint'] for r in rows)
        rates=sorted(cnt.get(e,0)/3 for e in eps)
        nxt=sum(1 for r in rows if r['endpoint']==c['endpoint'] and t<r['sent_clock_s']<t+0.23)
        out.append('%.0f:%.1f/[%.1f..%.1f] n%d'%(c['ttft_s']*1e3,cnt.get(c['endpoint'],0)/3,rates[0],rates[-1],nxt))
    print(d.split('/')[-1],' '.join(out))

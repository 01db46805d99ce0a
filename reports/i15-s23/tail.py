"""Per point: the requests above the point's p98 TTFT, split by hop (req: client send -> engine arrival; eng:
engine submit -> first token; rest), and the same parts' medians over all requests; phase of slow inbound hops
mod 100 ms (scrape rounds)."""
import json,glob,sys,collections
def q(v,p): v=sorted(v); return v[min(len(v)-1,int(p*len(v)))] if v else 0
for d in sorted(glob.glob(sys.argv[1]+'/samples/*')):
    rows=[json.loads(l) for l in open(d+'/requests.jsonl')]
    stamps={}
    for f in glob.glob(d+'/sim-timings-*.json'):
        for s in json.load(open(f)): stamps[s['id']]=s
    R=[]
    for r in rows:
        s=stamps.get(r['sim_request'])
        if not s or r['ttft_s'] is None: continue
        t0=r['sent_clock_s']
        R.append(dict(ttft=r['ttft_s']*1e3, req=(s['arrive']-t0)*1e3, tok=(s['submit']-s['arrive'])*1e3, eng=(s['token']-s['submit'])*1e3,
                      rest=(t0+r['ttft_s']-s['token'])*1e3, t0=t0, ep=r['endpoint'], pt=r['prompt_tokens'], un=r['prompt_tokens']-r['cached_tokens']))
    p98=q([x['ttft'] for x in R],.98); p99=q([x['ttft'] for x in R],.99)
    tail=[x for x in R if x['ttft']>=p98]
    med=lambda k,L: q([x[k] for x in L],.5)
    print(d.split('/')[-1], 'n',len(R),'p98 %.1f p99 %.1f'%(p98,p99), '| all med req %.2f tok %.2f eng %.1f rest %.2f'%tuple(med(k,R) for k in ('req','tok','eng','rest')),
          '| tail med req %.2f tok %.2f eng %.1f rest %.2f uncached %d'%(*(med(k,tail) for k in ('req','tok','eng','rest')),med('un',tail)))
    slow=[x for x in R if x['req']>=q([y['req'] for y in R],.98)]
    print('    req p50/p90/p98/max %.2f %.2f %.2f %.2f'%(q([x['req'] for x in R],.5),q([x['req'] for x in R],.9),q([x['req'] for x in R],.98),max(x['req'] for x in R)),
          ' slow-req times:', ' '.join('%.2f'%(x['t0']%10) for x in sorted(slow,key=lambda x:x['t0'])[:30]))
    print('    eng p50/p90/p98/max %.1f %.1f %.1f %.1f'%(q([x['eng'] for x in R],.5),q([x['eng'] for x in R],.9),q([x['eng'] for x in R],.98),max(x['eng'] for x in R)))

# Summarises BenchmarkRedisRounds logs: python3 rounds-summary.py DIR, where DIR holds
# r<N>-before.txt and r<N>-after.txt (-test.v output of each binary); prints the tables of
# ../README.md, "Issue 20 at 1 and 8 callers".
import re, glob, statistics as st, sys
rows = {}  # (workload, binary) -> list of dict name->dps
cpu = {}   # (workload, binary, name) -> list of (client, redis) per invocation
for f in sorted(glob.glob(sys.argv[1] + '/r*-*.txt')):
    b = re.search(r'r\d+-(\w+)\.txt$', f).group(1)
    wl = None
    for line in open(f):
        m = re.match(r'BenchmarkRedisRounds/(\S+)\s*$', line)
        if m: wl = m.group(1); continue
        m = re.search(r'round \d+ of \d+: decisions/s (.*?);', line)
        if m and wl:
            t = m.group(1).split()
            rows.setdefault((wl, b), []).append({t[i]: float(t[i+1]) for i in range(0, len(t), 2)})
            continue
        m = re.match(r'BenchmarkRedisRounds/(\S+?)-\d+\s+\d+\s+\d+ ns/op\s+(.*)', line)
        if m:
            vals = re.findall(r'([\d.]+) (\S+)', m.group(2))
            d = {k: float(v) for v, k in vals}
            for n in ['PING', 'redis_rate', 'ulule', 'limitplane']:
                cpu.setdefault((m.group(1), b, n), []).append((d.get(n+'-cpu-µs'), d.get(n+'-redis-cpu-µs')))
wls = sorted({w for w, _ in rows}, key=lambda w: (w.split('/')[0], int(w.split('=')[1])))
def med(v): return st.median(v) if v else float('nan')
print('| workload | c | rounds | limitplane dps before → after (median) | ÷ redis_rate before → after: median (min–max) | rounds < 1.0 after | ÷ PING before → after: median (min–max) | rounds ≥ 0.9 after |')
print('|---|---:|---:|---|---|---:|---|---:|')
for w in wls:
    out = []
    B, A = rows.get((w, 'before'), []), rows.get((w, 'after'), [])
    def rr(rs, den): return [r['limitplane'] / r[den] for r in rs]
    rb, ra = rr(B, 'redis_rate'), rr(A, 'redis_rate')
    pb, pa = rr(B, 'PING'), rr(A, 'PING')
    name, c = w.split('/')
    print(f"| {name} | {c.split('=')[1]} | {len(B)}, {len(A)} | {med([r['limitplane'] for r in B]):,.0f} → {med([r['limitplane'] for r in A]):,.0f} | "
          f"{med(rb):.2f} ({min(rb):.2f}–{max(rb):.2f}) → **{med(ra):.2f}** ({min(ra):.2f}–{max(ra):.2f}) | {sum(x < 1 for x in ra)} of {len(ra)} | "
          f"{med(pb):.2f} ({min(pb):.2f}–{max(pb):.2f}) → **{med(pa):.2f}** ({min(pa):.2f}–{max(pa):.2f}) | {sum(x >= 0.9 for x in pa)} of {len(pa)} |")
print()
print('| workload | c | client CPU µs/decision before → after: limitplane (redis_rate, PING) | redis-server CPU µs/decision before → after: limitplane (redis_rate, PING) |')
print('|---|---:|---|---|')
for w in wls:
    def g(b, n, i): 
        v = [x[i] for x in cpu.get((w, b, n), []) if x[i] is not None]
        return med(v)
    name, c = w.split('/')
    print(f"| {name} | {c.split('=')[1]} | {g('before','limitplane',0):.1f} → {g('after','limitplane',0):.1f} ({g('after','redis_rate',0):.1f}, {g('after','PING',0):.1f}) | {g('before','limitplane',1):.1f} → {g('after','limitplane',1):.1f} ({g('after','redis_rate',1):.1f}, {g('after','PING',1):.1f}) |")

#!/usr/bin/env python3
"""Top stall locations of one kernel from an Nsight Compute report's source page.

    ncu -i REPORT.ncu-rep --page source --csv --print-source cuda > src.csv
    python3 tools/ncu_top.py src.csv [N] [NVDISASM_GI.txt]

Prints the total warp-stall samples by reason, then the N source lines (or
SASS instructions, with --print-source sass) with the most samples and each
one's three largest reasons. A sample lands on the instruction a warp waits
to issue, so a spin loop's branch or the instruction after a wait carries
the wait's samples. bench/ncu_step.sh runs ncu on the decode step.

With a SASS table and the kernel's `nvdisasm -gi` listing (the same
binary, built with -lineinfo), the samples are also summed per source line
(the line nvdisasm's `//## File` comment names for each instruction: on
the decode step, the kernel body's line that calls the inlined phase, which
gives time per phase), since the CSV's own CUDA view carries no samples.
"""
import csv
import os
import re
import sys


def line_map(path):
    """offset -> (file, line) from an nvdisasm -gi listing of one function."""
    out, cur = {}, None
    for ln in open(path, errors='replace'):
        m = re.search(r'//## File "([^"]+)", line (\d+)', ln)
        if m:
            cur = (m.group(1), int(m.group(2)))
            continue
        m = re.match(r'\s*/\*([0-9a-f]{4,})\*/', ln)
        if m and cur:
            out[int(m.group(1), 16)] = cur
    return out


def source_text(f, line):
    rel = 'src/' + f.split('/src/', 1)[1] if '/src/' in f else f
    for cand in (f, rel):
        try:
            return open(cand, errors='replace').read().splitlines()[line - 1].strip()
        except (OSError, IndexError):
            pass
    return ''


def num(s):
    try:
        return float(s.replace(',', '')) if s else 0.0
    except ValueError:
        return None


def main():
    rows = list(csv.reader(open(sys.argv[1], newline='')))
    n_top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    hi = next((i for i, r in enumerate(rows) if 'Source' in r), None)
    if hi is None:
        sys.exit('no source table in %s (first rows: %s)' % (sys.argv[1], rows[:3]))
    h = rows[hi]
    js = next((j for j, c in enumerate(h) if c.startswith('Warp Stall Sampling (All')), None)
    if js is None:
        sys.exit('no warp-stall samples (profile with --set full); columns: %s' % h)
    stalls = [(j, c[len('stall_'):]) for j, c in enumerate(h) if c.startswith('stall_') and '(Not' not in c]
    jsrc = h.index('Source')
    jloc = next((j for j, c in enumerate(h) if c in ('#', 'Line', '# Line', 'Address')), None)
    data = []
    for r in rows[hi + 1:]:
        v = num(r[js]) if len(r) > js else None
        if v:
            data.append((v, r))
    tot = sum(v for v, _ in data) or 1.0

    def reasons(r):
        out = [(num(r[j]) or 0.0, name) for j, name in stalls if len(r) > j]
        return sorted(out, reverse=True)

    by = {}
    for _, r in data:
        for v, name in reasons(r):
            by[name] = by.get(name, 0.0) + v
    print('%d samples; by reason: %s' % (tot, ', '.join('%s %.1f%%' % (k, 100 * v / tot)
                                                         for k, v in sorted(by.items(), key=lambda x: -x[1])[:10])))
    for v, r in sorted(data, key=lambda d: -d[0])[:n_top]:
        top = ' '.join('%s:%.0f%%' % (name, 100 * x / v) for x, name in reasons(r)[:3] if x)
        loc = r[jloc] if jloc is not None else ''
        print('%5.2f%% %-8s %-72s %s' % (100 * v / tot, loc[-8:], r[jsrc].strip()[:72], top))
    if len(sys.argv) > 3 and jloc is not None:
        lm = line_map(sys.argv[3])
        # the CSV's first row is the function's entry: offsets relative to it
        first = next(int(r[jloc], 16) for r in rows[hi + 1:] if len(r) > jloc and r[jloc].startswith('0x'))
        per = {}
        for v, r in data:
            key = lm.get(int(r[jloc], 16) - first, ('?', 0))
            e = per.setdefault(key, [0.0, {}])
            e[0] += v
            for x, name in reasons(r):
                e[1][name] = e[1].get(name, 0.0) + x
        print('\nby source line (%d of %d instructions mapped):' % (
            sum(1 for _, r in data if int(r[jloc], 16) - first in lm), len(data)))
        for (f, line), (v, rs) in sorted(per.items(), key=lambda kv: -kv[1][0])[:n_top]:
            top = ' '.join('%s:%.0f%%' % (k, 100 * x / v) for k, x in sorted(rs.items(), key=lambda t: -t[1])[:2] if x)
            print('%5.2f%% %s:%-5d %-70s %s' % (100 * v / tot, os.path.basename(f), line,
                                               source_text(f, line)[:70], top))


if __name__ == '__main__':
    main()

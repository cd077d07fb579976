#!/usr/bin/env python3
"""Where the one-kernel decode step leaves HBM idle: a timeline of its ring pieces.

    # a trace build: cmake -DREPLAY_DECODE_STEP_TRACE=ON (scripts/gpu-bundle.sh: TRACE=1)
    replay profile --dummy-weights qwen3-4b --batch 1 --timeline step.tl
    python3 tools/step_timeline.py step.tl [--peak-gbs 3030] [--bins 1.0]

The trace build's kernel stamps, for every ring piece of the last launch, when its
producer issued the bulk copies, when its consumer warp found it complete,
and when that warp released the stage (kernels.h, rp_decode_step.timeline);
the grid barriers' arrival and release times come with it. This prints:

- per window between two grid barriers (named after what the consumers do
  in it: "qkv" runs from the release after down to the release after qkv,
  and so on), its mean length, the bytes the producers issued in it as a
  rate, and the HBM time it leaves unused: length - bytes / peak. Issued is
  not delivered (a copy lands a microsecond or two later), but summed over
  a step the two agree, and a window in which the producers issue little is
  one in which their rings are full;
- the same over fixed bins of the step, as a histogram of issue rates;
- how long each phase's end takes to reach the barrier (last piece released
  to last arrival), and attention's critical path, step by step;
- how long pieces sat complete in the ring before their warp took them;
- with --fifo, where HBM idles by a model closer to delivery than issue:
  the pieces served in issue order at --peak-gbs, each no earlier than
  --fifo-latency after its issue; the server's idle time is charged to the
  window in which it starts;
- attention's steps as durations (each stamp minus the previous one, mean
  over blocks and the latest block), also for a second pass stamped at
  layer + 64 where a build records one (an experiment, not the kernel);
- with --around-qkv, the bytes issued per microsecond around the last
  arrival at the barrier after qkv, by the phase they are for: when the
  rings fill in attention's stretch and when they are refilled.

numpy is needed (the GPU machine's Python has it; Debian: python3-numpy).
"""
import argparse
import struct
import sys

import numpy as np

KINDS = ["attention", "o", "gate_up", "down", "qkv"]  # window after barrier k % 5
TR_PIECES = 11  # trace slot: ring pieces of the block (kernels/decode_step/trace.cuh)


def load(path):
    raw = open(path, "rb").read()
    if raw[:4] != b"RPTL":
        sys.exit(f"{path}: not a decode step timeline")
    grid, tlp, layers, stride = struct.unpack_from("<4I", raw, 4)
    words = np.frombuffer(raw, dtype=np.uint64, offset=20)
    trace = words[: grid * stride].reshape(grid, stride)
    tl = words[grid * stride:].reshape(grid, tlp, 4)
    return grid, layers, trace, tl


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--peak-gbs", type=float, default=3030.0, help="read bandwidth, GB/s (3.03 TB/s: H100 here)")
    ap.add_argument("--bins", type=float, default=1.0, help="histogram bin, microseconds")
    ap.add_argument("--fifo", action="store_true", help="also the FIFO delivery model's idle HBM per window")
    ap.add_argument("--fifo-latency", type=float, default=800.0, help="FIFO model: issue to first byte, ns")
    ap.add_argument("--around-qkv", action="store_true",
                    help="also the issue rate per microsecond around qkv's last barrier arrival, by phase "
                         "(mean over the middle layers): when the rings fill in attention's stretch")
    args = ap.parse_args()
    grid, layers, trace, tl = load(args.file)
    npieces = np.minimum(trace[:, TR_PIECES].astype(np.int64), tl.shape[1])
    rows = [tl[b, : npieces[b]] for b in range(grid)]
    pcs = np.concatenate(rows).astype(np.int64)
    issue, ready, rel = pcs[:, 0], pcs[:, 1], pcs[:, 2]
    phase, nbytes = pcs[:, 3] >> 40, pcs[:, 3] & ((1 << 40) - 1)
    if (ready == 0).any() or (issue == 0).any():
        print(f"warning: {(ready == 0).sum()} pieces without a consumer stamp (ignored)")
        keep = (ready > 0) & (issue > 0)
        issue, ready, rel, phase, nbytes = issue[keep], ready[keep], rel[keep], phase[keep], nbytes[keep]
    nbar = 5 * layers
    bt = trace[:, 16: 16 + 2 * nbar].astype(np.int64).reshape(grid, nbar, 2)
    release = bt[:, :, 1].min(axis=0)  # the first block out of barrier k
    arrive_last = bt[:, :, 0].max(axis=0)
    t0, t_end = issue.min(), rel.max()
    us = lambda ns: ns / 1e3
    peak = args.peak_gbs  # bytes per ns = GB/s
    total_b = nbytes.sum()
    step = t_end - t0
    print(f"{grid} blocks, {layers} layers, {len(issue)} pieces, {total_b / 1e9:.3f} GB of weights")
    print(f"step (first issue to last release) {us(step):.1f} us; at {peak:.0f} GB/s the bytes take "
          f"{us(total_b / peak):.1f} us ({total_b / peak / step * 100:.0f}%)")

    # windows between barrier releases
    edges = np.concatenate([[t0], release, [t_end]])
    order = np.argsort(issue)
    iss_sorted, b_sorted = issue[order], nbytes[order]
    cum = np.concatenate([[0], np.cumsum(b_sorted)])
    def issued_between(a, b):
        return cum[np.searchsorted(iss_sorted, b)] - cum[np.searchsorted(iss_sorted, a)]
    stats = {k: [0, 0.0, 0.0, 0.0] for k in KINDS + ["layer 0 start", "lm_head"]}
    for w in range(len(edges) - 1):
        a, b = edges[w], edges[w + 1]
        name = "layer 0 start" if w == 0 else ("lm_head" if w == len(edges) - 2 else KINDS[(w - 1) % 5])
        byt = issued_between(a, b)
        s = stats[name]
        s[0] += 1
        s[1] += b - a
        s[2] += byt
        s[3] += max(0.0, (b - a) - byt / peak)
    print("\nwindows between grid barrier releases (named after the consumers' work in them):")
    print(f"{'window':<14} {'count':>5} {'mean us':>8} {'total us':>9} {'issued GB/s':>11} {'unused HBM us':>14}")
    lost = 0.0
    for name, (n, dur, byt, idle) in stats.items():
        if not n:
            continue
        lost += idle
        print(f"{name:<14} {n:5d} {us(dur) / n:8.2f} {us(dur):9.1f} {byt / dur:11.0f} {us(idle):14.1f}")
    print(f"{'all':<14} {'':5} {'':8} {us(step):9.1f} {total_b / step:11.0f} {us(lost):14.1f}")

    # attention's stretch, per layer: from the last arrival after qkv to the release after attention
    att = release[1::5] - arrive_last[0::5]
    print(f"\nqkv's last arrival to the release after attention: mean {us(att.mean()):.2f} us, "
          f"max {us(att.max()):.2f}")

    # each phase's end: from its last piece's release anywhere to the last block's barrier arrival
    # (with static units only ~0.7 us: the epilogue, the fence and the arrival)
    P = 4 * layers + 1
    last_rel = np.zeros(P, np.int64)
    np.maximum.at(last_rel, phase, rel)
    print("\nlast piece of a phase released -> last barrier arrival after it (mean over layers, us):")
    for k5, (pk, name) in {0: (0, "qkv"), 2: (1, "o"), 3: (2, "gate_up"), 4: (3, "down")}.items():
        gaps = [bt[:, 5 * l + k5, 0].max() - last_rel[4 * l + pk] for l in range(layers)]
        print(f"  {name:<8} {us(np.mean(gaps)):6.2f}")

    # attention's stamps (kernels.h: RP_DECODE_STEP_TRACE_ATT), per layer from the release after qkv
    att0 = 16 + 2 * 5 * 128
    att = trace[:, att0: att0 + 8 * layers].astype(np.int64).reshape(grid, layers, 8)
    names = ["item starts", "q/k/v in hand", "score loop ends (warp 0)", "all scores in", "partials published",
             "merged"]
    has = att[:, :, 0] > 0
    print("\nattention, us after the release after qkv (mean over layers; latest block / mean over blocks with an item):")
    for k, name in enumerate(names):
        d = np.where(has, att[:, :, k] - release[0::5][None, :], np.nan)
        print(f"  {name:<26} {us(np.nanmax(d, axis=0).mean()):6.2f} {us(np.nanmean(d)):6.2f}")
    arr = bt[:, 1::5, 0] - release[0::5][None, :]
    print(f"  {'barrier arrival':<26} {us(arr.max(axis=0).mean()):6.2f} {us(arr.mean()):6.2f}")
    print(f"  {'release after attention':<26} {us((release[1::5] - release[0::5]).mean()):6.2f}")

    # attention's steps as durations; a second pass (layer + 64) where recorded
    dnames = ["start -> q/k/v in hand", "-> score loop ends (w0)", "-> all scores in", "-> published", "-> merged"]
    def att_durations(first):
        a = trace[:, att0 + 8 * first: att0 + 8 * (first + layers)].astype(np.int64).reshape(grid, layers, 8)
        ok = a[:, :, 0] > 0
        return [(np.nanmean(np.where(ok, a[:, :, k] - a[:, :, k - 1], np.nan)),
                 np.nanmax(np.where(ok, a[:, :, k] - a[:, :, k - 1], np.nan), axis=0).mean()) for k in range(1, 6)]
    second = layers <= 64 and trace[:, att0 + 8 * 64].any()
    p1 = att_durations(0)
    p2 = att_durations(64) if second else None
    print("\nattention steps as durations, us (mean over blocks / latest block)" +
          (", then the second pass" if second else "") + ":")
    for k, name in enumerate(dnames):
        line = f"  {name:<26} {us(p1[k][0]):6.2f} {us(p1[k][1]):6.2f}"
        if p2:
            line += f"   {us(p2[k][0]):6.2f} {us(p2[k][1]):6.2f}"
        print(line)

    if args.fifo:
        # pieces delivered in issue order at the peak rate, none before its issue + latency
        base = issue.min()
        o = np.argsort(issue, kind="stable")
        iss, byt = (issue[o] - base).astype(np.float64), nbytes[o].astype(np.float64)
        t, idle_at = 0.0, []
        for i in range(len(iss)):
            start = max(t, iss[i] + args.fifo_latency)
            if start > t:
                idle_at.append((t, start - t))
            t = start + byt[i] / peak
        wedges = np.concatenate([[0.0], (release - base).astype(np.float64), [float(t_end - base)]])
        acc = {}
        for a0, d in idle_at:
            w = int(np.searchsorted(wedges, a0, side="right")) - 1
            name = "layer 0 start" if w <= 0 else ("lm_head" if w >= len(wedges) - 2 else KINDS[(w - 1) % 5])
            acc[name] = acc.get(name, 0.0) + d
        print(f"\nFIFO model ({args.fifo_latency:.0f} ns latency): HBM idle {us(sum(acc.values())):.1f} us, by window "
              "where the idle starts: " + ", ".join(f"{n} {us(v):.1f}" for n, v in acc.items()))

    if args.around_qkv:
        around_qkv(layers, issue, ready, phase, nbytes, release, arrive_last)

    # fixed bins
    binw = args.bins * 1e3
    nb = int(np.ceil(step / binw))
    hist = np.bincount(((issue - t0) // binw).astype(np.int64), weights=nbytes, minlength=nb)[:nb]
    rate = hist / binw / peak
    print(f"\nissue rate over {nb} bins of {args.bins:g} us (share of {peak:.0f} GB/s): "
          + ", ".join(f"<{int(q * 100)}%: {np.mean(rate < q) * 100:.0f}% of bins" for q in (0.25, 0.5, 0.75, 1.0)))

    # pieces waiting in the ring, and warps waiting for pieces
    sat = ready - issue
    print(f"\nissue to consumer: median {us(np.median(sat)):.2f} us, p10 {us(np.percentile(sat, 10)):.2f}, "
          f"p90 {us(np.percentile(sat, 90)):.2f}; consumer hold (ready to release): median "
          f"{us(np.median(rel - ready)):.2f} us")
    per_phase = {}
    for k, name in enumerate(["qkv", "o", "gate_up", "down"]):
        m = (phase % 4 == k) & (phase < 4 * layers)
        per_phase[name] = m
    per_phase["lm_head"] = phase == 4 * layers
    print(f"{'phase':<8} {'pieces':>7} {'GB':>7} {'hold us':>8} {'issue->ready us':>16}")
    for name, m in per_phase.items():
        if m.any():
            print(f"{name:<8} {m.sum():7d} {nbytes[m].sum() / 1e9:7.3f} {us(np.median(rel[m] - ready[m])):8.2f} "
                  f"{us(np.median(ready[m] - issue[m])):16.2f}")


def around_qkv(layers, issue, ready, phase, nbytes, release, arrive_last):
    """Bytes issued (and found ready by a consumer) per 1 us bin from 16 us before to 24 us after
    the last block's arrival at the barrier after qkv, by the phase the pieces belong to, as GB/s,
    mean over layers 4 .. L - 5; then where the barriers around it fall on that axis."""
    bins = np.arange(-16.0, 25.0, 1.0)
    ls = range(4, layers - 4) if layers > 8 else range(layers)
    iss = np.zeros(len(bins) - 1)
    rdy = np.zeros(len(bins) - 1)
    byp = {k: np.zeros(len(bins) - 1) for k in (-1, 0, 1, 2)}
    for l in ls:
        t0 = arrive_last[5 * l]
        d, dr = (issue - t0) / 1e3, (ready - t0) / 1e3
        iss += np.histogram(d, bins=bins, weights=nbytes)[0]
        rdy += np.histogram(dr, bins=bins, weights=nbytes)[0]
        for k in byp:
            m = phase == 4 * l + k
            byp[k] += np.histogram(d[m], bins=bins, weights=nbytes[m])[0]
    n = len(ls) * 1e3  # bytes per 1 us bin -> GB/s
    print("\naround qkv's last arrival (t = 0), GB/s per 1 us bin, mean over layers:")
    print(f"{'t us':>5} {'issued':>7} {'ready':>7} | issued for: {'down':>6} {'qkv':>6} {'o':>6} {'gate_up':>7}")
    for i in range(len(bins) - 1):
        print(f"{bins[i]:5.0f} {iss[i] / n:7.0f} {rdy[i] / n:7.0f} |             " +
              " ".join(f"{byp[k][i] / n:6.0f}" for k in (-1, 0, 1)) + f" {byp[2][i] / n:7.0f}")
    for k, name in enumerate(["qkv", "attention", "o", "gate_up"]):
        rel = np.mean([(release[5 * l + k] - arrive_last[5 * l]) / 1e3 for l in ls])
        arr = np.mean([(arrive_last[5 * l + k] - arrive_last[5 * l]) / 1e3 for l in ls])
        print(f"  barrier after {name:<9}: last arrival {arr:6.2f} us, first release {rel:6.2f} us")


if __name__ == "__main__":
    main()

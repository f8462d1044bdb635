"""A model of the narrow kernels' grid: items claimed from a counter, in which order (CPU only).

132 SMs, two CTAs on each (narrow8 and narrow16). A CTA takes an item's tiles at the rate measured
in the tenth session at V3.2 TP8 (PERF.md, narrow v10): an SM's first CTA 58.3 / 32 us a tile, its
second 65.4 / 32, a CTA whose partner has no item left 53 / 32; an item costs one tile more than its
tiles (its Q and its end). A CTA that ends an item claims the next one. The rows are compare.py's
for 4096 tokens: every token 2048 slots (V3.2), V4's compressed rows and window (token p has
min(p // 4, topk) + min(p + 1, 128) slots), or a causal prompt without a prefix (min(p + 1, 2048)).
Prints the kernel's modelled time with items in token order and with the last token first, and the
time at the SMs' mean rate with no grain at all ("fluid"). --parts: V3.2 TP8's last items cut into
parts (2, 4 or 8 of their 32 tiles, 132 or 264 items), each part an item of its own (its tiles and
one more) and 0 or 1 tile more for its share of a merge, against the items whole.

Usage: python3 ci/probes/claims_model.py [--sms 132] [--parts]"""
import argparse
import math

FIRST, SECOND, ALONE = 58.3 / 32, 65.4 / 32, 53 / 32  # us a tile
SLOTS_PER_TILE = 64
V32_SLOTS = 2048  # a V3.2 TP8 item's slots (topk)
V32_TILES = V32_SLOTS // SLOTS_PER_TILE


def item_cost(tiles):
    """An item's cost in tiles: its tiles and one more (its Q and its end)."""
    return tiles + 1


def makespan(tiles, sms):
    """The end of the last item when CTAs claim items in the order of `tiles` as they end one."""
    costs = (item_cost(n) for n in tiles)
    left = {}  # (sm, cta) -> tiles left of its item

    def claim(cta):
        cost = next(costs, None)
        if cost is None:
            left.pop(cta, None)
        else:
            left[cta] = cost

    for sm in range(sms):
        for cta in range(2):
            claim((sm, cta))
    t = 0.0
    while left:
        rate = {k: 1 / (ALONE if (k[0], 1 - k[1]) not in left else FIRST if k[1] == 0 else SECOND) for k in left}
        dt = min(left[k] / rate[k] for k in left)
        t += dt
        for k in list(left):
            left[k] -= rate[k] * dt
            if left[k] <= 1e-9:
                claim(k)
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--parts", action="store_true")
    args = ap.parse_args()
    s_q = 4096
    rows = {
        "V3.2 TP8 (2048 slots)": [V32_SLOTS] * s_q,
        "V4-Flash TP8 / TP4 CSA (topk 512)": [min(p // 4, 512) + min(p + 1, 128) for p in range(s_q)],
        "V4-Pro TP8 CSA (topk 1024)": [min(p // 4, 1024) + min(p + 1, 128) for p in range(s_q)],
        "causal prompt, topk 2048": [min(p + 1, 2048) for p in range(s_q)],
    }
    for name, slots in rows.items():
        tiles = [math.ceil(n / SLOTS_PER_TILE) for n in slots]
        in_order, last_first = makespan(tiles, args.sms), makespan(tiles[::-1], args.sms)
        fluid = sum(map(item_cost, tiles)) / (args.sms * (1 / FIRST + 1 / SECOND))
        print(f"{name}: token order {in_order:.0f} us, last token first {last_first:.0f} us "
              f"({in_order / last_first:.3f}x), fluid {fluid:.0f} us")
    if args.parts:
        whole = makespan([V32_TILES] * s_q, args.sms)
        for parts in (2, 4, 8):
            for last in (132, 264):
                for extra in (0, 1):
                    t = makespan([V32_TILES] * (s_q - last) + [V32_TILES // parts + extra] * (parts * last), args.sms)
                    print(f"V3.2 TP8, the last {last} items in {parts} parts, {extra} tile more a part for the merge: "
                          f"{t:.0f} us ({whole / t:.3f}x)")


if __name__ == "__main__":
    main()

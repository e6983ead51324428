"""A py-spy speedscope profile as an SVG flame graph, waits left out.

    python bench/flamegraph.py profile.json out.svg --title "..."

py-spy samples a thread that is runnable as running, so on a busy 2-core
machine a socket write that PostgreSQL's wake-up preempted looks like CPU
(``getrusage`` says the kernel part of a worker is about 2 µs per job). The
samples whose innermost frame is one of ``--drop`` (default: the event loop's
``select`` and the transport's socket ``write``) are left out, and the title
says how many. Frames are merged by function (file:name), as flamegraph.pl
does; widths are shares of the samples kept.
"""

from __future__ import annotations

import argparse
import html
import json
from collections import Counter
from pathlib import Path

WIDTH, ROW = 1200, 16


def stacks(profile: dict, drop: set[str]) -> tuple[Counter[tuple[str, ...]], float, float]:
    """Collapsed stacks (root first) with their weights, the weight kept and dropped."""
    frames = profile["shared"]["frames"]
    names = [f"{Path(f.get('file', '?')).name}:{f['name']}" for f in frames]
    out: Counter[tuple[str, ...]] = Counter()
    kept = dropped = 0.0
    for prof in profile["profiles"]:
        for sample, weight in zip(prof["samples"], prof["weights"], strict=True):
            if not sample:
                continue
            if frames[sample[-1]]["name"] in drop:
                dropped += weight
                continue
            out[tuple(names[i] for i in sample)] += weight
            kept += weight
    return out, kept, dropped


def render(collapsed: Counter[tuple[str, ...]], total: float, title: str) -> str:
    """flamegraph.pl-style SVG: root at the bottom, one rectangle per merged frame."""
    tree: dict = {}
    for stack, w in collapsed.items():
        node = tree
        for name in stack:
            entry = node.setdefault(name, [0.0, {}])
            entry[0] += w
            node = entry[1]
    depth = max((len(s) for s in collapsed), default=1)
    height = (depth + 3) * ROW
    rects: list[str] = []

    def walk(node: dict, x: float, level: int) -> None:
        for name, (w, children) in sorted(node.items()):
            width = w / total * WIDTH
            if width >= 0.3:
                y = height - (level + 2) * ROW
                hue = 20 + (hash(name.split(":")[0]) % 40)
                label = f"{name} ({w / total:.1%})"
                text = html.escape(name if width > 7 * len(name) else name[: int(width / 7)])
                rects.append(
                    f'<g><title>{html.escape(label)}</title><rect x="{x:.1f}" y="{y}" '
                    f'width="{width:.1f}" height="{ROW - 1}" fill="hsl({hue},80%,60%)"/>'
                    f'<text x="{x + 2:.1f}" y="{y + ROW - 4}">{text}</text></g>')
            walk(children, x, level + 1)
            x += width

    walk(tree, 0.0, 0)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'font-family="monospace" font-size="11">'
            f'<text x="4" y="14" font-size="13">{html.escape(title)}</text>'
            + "".join(rects) + "</svg>\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profile", help="py-spy --format speedscope output")
    p.add_argument("svg")
    p.add_argument("--title", default="worker")
    p.add_argument("--drop", default="EpollSelector.select,_SelectorSocketTransport.write",
                   help="innermost frames that are waits, not CPU (comma-separated)")
    a = p.parse_args()
    collapsed, kept, dropped = stacks(json.loads(Path(a.profile).read_text()),
                                      set(a.drop.split(",")))
    share = dropped / (kept + dropped) if kept + dropped else 0.0
    title = f"{a.title}: {share:.0%} of samples left out (innermost frame: {a.drop})"
    Path(a.svg).write_text(render(collapsed, kept, title))
    print(f"{a.svg}: {len(collapsed)} stacks, {share:.0%} of samples dropped")


if __name__ == "__main__":
    main()

"""Profile the operator variants on this CPU: time and workspace per VGG-16 / transformer layer.

Shapes are the papers' layers scaled down to run in well under a minute on 2 cores: VGG-16's
last conv of each stage at 1/4 resolution and batch 2, and a GPT-style attention layer at
batch 2. For each op the table gives every supported variant's median time, its time
relative to the framework kernel (what ``outcore.variants.speeds.relative_speed`` returns),
the workspace the executor's tracker measured, the formula's value (they must agree), and
the largest absolute difference from the framework's result.

    .venv/bin/python benchmarks/variants_profile.py            # print the table
    .venv/bin/python benchmarks/variants_profile.py --save     # also refresh the shipped JSON
    .venv/bin/python benchmarks/variants_profile.py --json out.json --repeats 5
"""

from __future__ import annotations

import argparse
import time

import torch
from rich.console import Console
from rich.table import Table

from outcore.units import format_bytes
from outcore.variants.profile import OpCase, attention_cases, conv_cases, profile, save_json
from outcore.variants.speeds import DEFAULT_TABLE

# (name, C_in, C_out, H=W at 1/4 of 224) — the last conv of each VGG-16 stage
VGG16 = [("vgg16.conv1_2", 64, 64, 56), ("vgg16.conv2_2", 128, 128, 28),
         ("vgg16.conv3_3", 256, 256, 14), ("vgg16.conv4_3", 512, 512, 7),
         ("vgg16.conv5_3", 512, 512, 4)]
# (name, B, heads, L, head dim, causal)
TRANSFORMER = [("gpt.attn.L256", 2, 8, 256, 64, True), ("gpt.attn.L512", 2, 8, 512, 64, True),
               ("enc.attn.L384", 2, 12, 384, 64, False)]


def cases(batch: int) -> list[OpCase]:
    out: list[OpCase] = []
    for name, c, o, hw in VGG16:
        out += conv_cases(name, batch, c, hw, hw, o, 3)
    for name, b, h, length, d, causal in TRANSFORMER:
        out += attention_cases(name, b, h, length, length, d, is_causal=causal)
    return out


def render(data: dict) -> Table:
    table = Table(title=f"operator variants on this CPU ({data['machine']['threads']} threads, "
                        f"median of {data['repeats']})")
    for col in ("op", "variant", "time", "vs framework", "workspace (tracker)",
                "formula", "max |err|"):
        table.add_column(col, justify="left" if col in ("op", "variant") else "right")
    previous = None
    for e in data["entries"]:
        op = e["case"] if e["case"] != previous else ""
        previous = e["case"]
        agree = e["workspace_bytes"] == e["formula_bytes"]
        table.add_row(op, e["variant"], f"{e['time_s'] * 1e3:.2f} ms",
                      f"{e['relative_speed']:.2f}x", format_bytes(e["workspace_bytes"]),
                      ("= " if agree else "MISMATCH ") + format_bytes(e["formula_bytes"]),
                      f"{e['max_abs_error']:.1e}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--json", help="write the profile to this path")
    parser.add_argument("--save", action="store_true",
                        help=f"write the profile to the shipped table {DEFAULT_TABLE}")
    args = parser.parse_args()
    torch.manual_seed(0)
    start = time.perf_counter()
    data = profile(cases(args.batch), repeats=args.repeats)
    console = Console(width=max(Console().width, 110))
    console.print(render(data))
    console.print(f"profiled in {time.perf_counter() - start:.1f} s")
    for path in ([args.json] if args.json else []) + ([DEFAULT_TABLE] if args.save else []):
        save_json(data, path)
        console.print(f"wrote {path}")


if __name__ == "__main__":
    main()

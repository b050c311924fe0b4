"""``kubegpu trace``: make trace variants to evaluate placement on.

``constrain`` writes a model-constrained variant of an openb pod list
(:mod:`kubegpu.simulate.constrain`); ``arrivals`` writes arrival fixtures for any pod list
from our own seeded RNG (``generate_arrivals``), in the format ``kubegpu simulate --arrivals``
reads, so a variant's runs can be repeated and shared without the paper's Go sequences.
"""

from __future__ import annotations

import csv
from pathlib import Path

import click

from kubegpu.cli.types import MAX_SEED, FiniteFloatRange, Folder, OutputFile, input_file
from kubegpu.simulate.arrivals import generate_arrivals, write_fixture
from kubegpu.simulate.command import MAX_INFLATION, parse_seeds
from kubegpu.simulate.constrain import choose_constraints
from kubegpu.simulate.traces import TraceError, load_nodes, load_pods

_NODES = click.option(
    "--nodes",
    "nodes_csv",
    required=True,
    type=input_file(exists=False),
    help="Node list CSV (sn, cpu_milli, memory_mib, gpu, model).",
)
_PODS = click.option(
    "--pods",
    "pods_csv",
    required=True,
    type=input_file(exists=False),
    help="Pod list CSV in the openb format.",
)


@click.group("trace")
def trace() -> None:
    """Derive trace variants and arrival fixtures for `kubegpu simulate`."""


@trace.command("constrain")
@_NODES
@_PODS
@click.option(
    "--fraction",
    required=True,
    type=FiniteFloatRange(0.0, 1.0, min_open=True),
    help="Share of the unconstrained GPU pods to limit to GPU models, in (0, 1].",
)
@click.option(
    "--seed", required=True, type=click.IntRange(0, MAX_SEED), help="The generator's seed."
)
@click.option(
    "--out",
    "out_csv",
    required=True,
    type=OutputFile(parents=True),
    help="Where to write the variant (same columns as --pods, gpu_spec added if absent).",
)
@click.pass_context
def constrain(
    ctx: click.Context, nodes_csv: Path, pods_csv: Path, fraction: float, seed: int, out_csv: Path
) -> None:
    """Limit a fraction of the GPU pods to sets of GPU models drawn from the cluster's mix."""
    try:
        nodes = load_nodes(nodes_csv)
        pods = load_pods(pods_csv)
        specs = choose_constraints(pods, nodes, fraction, seed)
    except (TraceError, ValueError) as exc:
        click.echo(f"error: {exc}", err=True)
        ctx.exit(2)
        return
    if out_csv.resolve() == pods_csv.resolve():
        raise click.BadParameter("must differ from --pods", param_hint="--out")
    try:
        out_csv.parent.mkdir(parents=True, exist_ok=True)
        out_csv.open("a").close()
    except OSError as exc:
        raise click.BadParameter(
            f"cannot write {out_csv}: {exc.strerror}", param_hint="--out"
        ) from None
    with pods_csv.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = list(reader.fieldnames or [])
        rows = list(reader)
    if "gpu_spec" not in header:
        header.insert(header.index("gpu_milli") + 1, "gpu_spec")
    for row in rows:
        spec = specs.get(row["name"].strip())
        if spec is not None:
            row["gpu_spec"] = spec
    with out_csv.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    gpu_pods = sum(1 for p in pods if p.request.gpu_count)
    click.echo(f"wrote {out_csv}: {len(specs)} of {gpu_pods} GPU pods constrained to GPU models")


@trace.command("arrivals")
@_NODES
@_PODS
@click.option("--seeds", default="42-51", show_default=True, help="e.g. 42-51 or 42,44")
@click.option(
    "--inflation",
    default=1.3,
    show_default=True,
    type=FiniteFloatRange(0.0, MAX_INFLATION, min_open=True),
    help="Arrived GPU demand as a multiple of capacity.",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=Folder(),
    help="Directory for <pods stem>_seed<S>.txt.gz (what `simulate --arrivals` reads).",
)
@click.pass_context
def arrivals(
    ctx: click.Context,
    nodes_csv: Path,
    pods_csv: Path,
    seeds: str,
    inflation: float,
    out_dir: Path,
) -> None:
    """Arrival orders and node ranks from our own seeded RNG, one fixture per seed."""
    seed_list = parse_seeds(seeds)
    try:
        nodes = load_nodes(nodes_csv)
        pods = load_pods(pods_csv)
    except TraceError as exc:
        click.echo(f"error: {exc}", err=True)
        ctx.exit(2)
        return
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.BadParameter(
            f"cannot create {out_dir}: {exc.strerror}", param_hint="--out"
        ) from None
    for seed in seed_list:
        path = out_dir / f"{pods_csv.stem}_seed{seed}.txt.gz"
        write_fixture(path, generate_arrivals(pods, nodes, seed, inflation))
        click.echo(f"wrote {path}")
